"""A waiting acquire rides out a Redis restart; an outage past its timeout is a timeout.

A private redis-server is stopped while a thread waits in ``acquire(timeout=30)`` and started
again once the waiter has reported failed attempts: the waiter acquires. Kept down past the
timeout, the acquire raises ``LockHeldError(reason="timeout")`` whose ``__cause__`` is the
``BackendUnavailableError`` of the last attempt.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest
from lease_lock import BackendUnavailableError, LockHeldError, Retry, connect

from tests.support.outage import DEADLINE, Failures
from tests.support.redis_server import RedisFactory, RedisServer


@pytest.fixture
def server(redis_factory: RedisFactory) -> Iterator[RedisServer]:
    private = redis_factory.server()
    yield private
    private.stop()


def test_a_waiting_acquire_rides_out_a_restart(server: RedisServer) -> None:
    failures = Failures()
    key = f"outage:{uuid.uuid4().hex}"
    outcome: dict[str, object] = {}
    with connect(server.url, on_event=failures, retry=Retry(delay=0.2)) as locker:

        def wait() -> None:
            try:
                outcome["lock"] = locker.acquire(key, timeout=30)
            except Exception as error:  # noqa: BLE001 - handed to the test thread
                outcome["error"] = error

        locker.get(key)  # connected before the outage, as a running application is
        server.stop()
        thread = threading.Thread(target=wait)
        thread.start()
        # Down for a few failed attempts (about three seconds with the reconnect waits).
        assert failures.wait_for(3), "the waiter never reported a failed attempt"
        server.start()
        thread.join(DEADLINE)
        assert not thread.is_alive()
        assert "error" not in outcome, outcome
        assert getattr(outcome["lock"], "state", None) == "held"
        assert all(isinstance(error, BackendUnavailableError) for error in failures.errors)


def test_an_outage_past_the_timeout_raises_a_timeout_caused_by_it(server: RedisServer) -> None:
    key = f"outage:{uuid.uuid4().hex}"
    with connect(server.url, retry=Retry(delay=0.2)) as locker:
        locker.get(key)
        server.stop()
        with pytest.raises(LockHeldError) as caught:
            locker.acquire(key, timeout=2)
        assert caught.value.reason == "timeout"
        assert isinstance(caught.value.__cause__, BackendUnavailableError)
        with pytest.raises(BackendUnavailableError):
            locker.try_acquire(key)
        server.start()
