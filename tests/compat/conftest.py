"""Fixtures of the shim tests: a client of the session's private redis-server, unique names."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.redis_server import RedisServer


@pytest.fixture
def r(redis_server: RedisServer) -> Iterator[Any]:
    """A ``redis.StrictRedis`` (the same class as ``redis.Redis``) on the private server."""
    client = redis_server.client()
    yield client
    client.close()


@pytest.fixture
def r_decoded(redis_server: RedisServer) -> Iterator[Any]:
    """A client made with ``decode_responses=True``."""
    client = redis_server.client(decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def name() -> str:
    """A lock name no other test uses."""
    return f"shim-{uuid.uuid4().hex}"
