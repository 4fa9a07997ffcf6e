"""A waiting acquire rides out a Redis restart; an outage past its timeout is a timeout.

A private redis-server is stopped while a thread waits in ``acquire(timeout=30)`` and started
again once the waiter has reported failed attempts: the waiter acquires. Kept down past the
timeout, the acquire raises ``BackendUnavailableError`` (its last attempt could not reach the
store) with the driver's error as ``__cause__``.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
from lease_lock import BackendUnavailableError
from lease_lock.backends.redis import RedisBackend

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


@pytest.mark.parametrize("call", ["ask", "wait", "leave"])
def test_a_silent_server_ends_each_call_of_a_place_in_line_soon_after_its_time(server: RedisServer, call: str) -> None:
    # The server is frozen (SIGSTOP): every connection stays open and nothing answers. The
    # client was made without a socket timeout, so it alone would wait for ever; a waiter's
    # place in line bounds each of its calls by the time the call may block (ask and leave:
    # none, wait: one second here) plus a small margin. ask and wait then raise the outage,
    # leave gives up on its place (which goes stale). The thread is given far longer.
    client = redis.Redis(host=server.host, port=server.port, socket_timeout=None)
    backend = RedisBackend(client)
    key = f"silent-{uuid.uuid4().hex}"
    assert backend.acquire(key, "h" * 32, 60, "holder")
    line = backend.join_line(key, "w" * 32, 60, "waiter", False, time.monotonic)
    assert line is not None and line.ask() is None
    outcome: list[object] = []

    def run() -> None:
        assert line is not None
        try:
            if call == "ask":
                outcome.append(line.ask())
            elif call == "wait":
                outcome.append(line.wait(1.0))
            else:
                line.leave(False)
                outcome.append("left")
        except BackendUnavailableError as error:
            outcome.append(error)

    os.kill(server.pid, signal.SIGSTOP)
    try:
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        thread.join(30)
        assert not thread.is_alive(), f"{call} waited on a silent server"
        if call == "leave":
            assert outcome == ["left"]
        else:
            [error] = outcome
            assert isinstance(error, BackendUnavailableError), error
            assert isinstance(error.__cause__, redis.exceptions.TimeoutError), repr(error.__cause__)
        os.kill(server.pid, signal.SIGCONT)
        # Heard again, the backend's connections carry no stray reply of the frozen calls.
        for _ in range(3):
            assert backend.inspect(key).owner == "holder"
        assert backend.release(key, "h" * 32)
    finally:
        os.kill(server.pid, signal.SIGCONT)
        line.leave(False)
        backend.close()
        client.close()
