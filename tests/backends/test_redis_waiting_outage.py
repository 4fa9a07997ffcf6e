"""A waiting acquire rides out a Redis restart; an outage past its timeout is a timeout.

A private redis-server is stopped while a thread waits in ``acquire(timeout=30)`` and started
again once the waiter has reported failed attempts: the waiter acquires. Kept down past the
timeout, the acquire raises ``BackendUnavailableError`` (its last attempt could not reach the
store) with the driver's error as ``__cause__``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.outage import check_an_outage_past_the_timeout, check_rides_out_a_restart
from tests.support.redis_server import RedisFactory, RedisServer


@pytest.fixture
def server(redis_factory: RedisFactory) -> Iterator[RedisServer]:
    private = redis_factory.server()
    yield private
    private.stop()


def test_a_waiting_acquire_rides_out_a_restart(server: RedisServer) -> None:
    check_rides_out_a_restart(server.url, server.stop, server.start)


def test_an_outage_past_the_timeout_raises_the_outage(server: RedisServer) -> None:
    check_an_outage_past_the_timeout(server.url, server.stop)
