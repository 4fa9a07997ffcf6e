"""The MongoDB backend against a real wire server (see tests/support/mongo_server.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pymongo
import pytest
from lease_lock.backends import backend_from_url
from lease_lock.backends.base import Backend
from lease_lock.backends.mongo import MongoBackend
from lease_lock.testing import BackendContract, ServiceStoreContract

from tests.support.mongo_server import MongoServer

OWNER = "mongo-test:1"


class TestMongoUrl(BackendContract, ServiceStoreContract):
    """The contract through ``connect("mongodb://...")``, which builds the client."""

    @pytest.fixture
    def backend(self, mongo_server: MongoServer, mongo_database: str) -> Iterator[MongoBackend]:
        backend = backend_from_url(mongo_server.url(mongo_database))
        assert isinstance(backend, MongoBackend)
        yield backend
        backend.close()

    def adopts(self, backend: Backend, key: str) -> bool:
        # A claim is replaced in the grant's one upsert: the contract's adoption tests run.
        assert type(backend).adopt is not Backend.adopt, "MongoBackend must implement adopt"
        return True


class TestMongoClient(BackendContract):
    """The contract on a caller's client, which the backend leaves open."""

    @pytest.fixture
    def backend(self, mongo_server: MongoServer, mongo_database: str) -> Iterator[MongoBackend]:
        client: Any = mongo_server.client()
        backend = MongoBackend(client, database=mongo_database, collection="locks")
        yield backend
        backend.close()
        assert client.admin.command("ping")["ok"], "a caller's client stays open"
        client.close()


@pytest.fixture
def key() -> str:
    return f"mongo-test:{uuid.uuid4().hex}"


def token() -> str:
    return uuid.uuid4().hex


@pytest.fixture
def client(mongo_server: MongoServer) -> Iterator[Any]:
    client = mongo_server.client()
    yield client
    client.close()


@pytest.fixture
def backend(mongo_server: MongoServer, mongo_database: str) -> Iterator[MongoBackend]:
    backend = MongoBackend.from_url(mongo_server.url(mongo_database))
    yield backend
    backend.close()


def test_the_document_is_readable_by_operators(client: Any, backend: MongoBackend, key: str) -> None:
    mine = token()
    fence = backend.acquire_fenced(key, mine, 60, OWNER)
    document = client[backend.database]["lease_lock"].find_one({"_id": key})
    assert {name: document[name] for name in ("_id", "token", "owner", "fence")} == {
        "_id": key, "token": mine, "owner": OWNER, "fence": fence,
    }
    counter = client[backend.database]["lease_lock-fences"].find_one({"_id": key})
    assert counter["fence"] == fence
    assert pymongo.version
