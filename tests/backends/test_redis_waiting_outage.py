"""A waiting acquire rides out a Redis restart; an outage past its timeout is a timeout.

A private redis-server is stopped while a thread waits in ``acquire(timeout=30)`` and started
again once the waiter has reported failed attempts: the waiter acquires. Kept down past the
timeout, the acquire raises ``LockHeldError(reason="timeout")`` whose ``__cause__`` is the
``BackendUnavailableError`` of the last attempt.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.outage import check_rides_out_a_restart, check_timeout_caused_by_the_outage
from tests.support.redis_server import RedisFactory, RedisServer


@pytest.fixture
def server(redis_factory: RedisFactory) -> Iterator[RedisServer]:
    private = redis_factory.server()
    yield private
    private.stop()


def test_a_waiting_acquire_rides_out_a_restart(server: RedisServer) -> None:
    check_rides_out_a_restart(server.url, server.stop, server.start)


def test_an_outage_past_the_timeout_raises_a_timeout_caused_by_it(server: RedisServer) -> None:
    check_timeout_caused_by_the_outage(server.url, server.stop)
