"""A silent network (connections open, nothing answered) under a waiting acquire on Redis.

A private redis-server is paused with SIGSTOP while a thread waits for a held key, blocked in
the key's line: the wait ends as ``BackendUnavailableError`` with the driver's error as its
cause, never as ``LockHeldError`` (nobody answered that the key is held), at its timeout
rather than after the client's socket timeouts and retries. The same holds for one call
inside ``call_budget``.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from lease_lock import BackendUnavailableError, LockEvent, connect
from lease_lock.backends.redis import RedisBackend
from lease_lock.testing import wait_until
from redis.exceptions import RedisError

from tests.support.redis_server import RedisFactory, RedisServer


def _blocked(client: Any) -> int:
    """How many connections are blocked in a BLPOP."""
    return sum(1 for entry in client.client_list() if entry.get("cmd") == "blpop" and "b" in entry.get("flags", ""))


@pytest.fixture
def server(redis_factory: RedisFactory) -> Iterator[RedisServer]:
    private = redis_factory.server()
    yield private
    os.kill(private.pid, signal.SIGCONT)
    private.stop()


def test_a_wait_in_line_on_a_silent_store_ends_as_unavailable(server: RedisServer) -> None:
    key = f"silent-{uuid.uuid4().hex}"
    contended = threading.Event()

    def on_event(event: LockEvent) -> None:
        if event.type == "contended":
            contended.set()

    # The default URL: the client's own socket timeouts (seconds) and retries are longer than
    # the wait; the core bounds every attempt by the time the wait has left (call_budget).
    with connect(server.url) as holder, connect(server.url, on_event=on_event) as waiter:
        held = holder.acquire(key, ttl=60)
        outcome: list[BaseException] = []
        started = time.monotonic()

        def wait() -> None:
            try:
                waiter.acquire(key, timeout=3)
            except BaseException as error:  # noqa: BLE001 - handed to the test thread
                outcome.append(error)

        thread = threading.Thread(target=wait)
        thread.start()
        assert contended.wait(30)
        watching = server.client()
        # Blocked in the key's line (a BLPOP of its own) when the store falls silent.
        assert wait_until(lambda: _blocked(watching) >= 1, 30)
        watching.close()
        os.kill(server.pid, signal.SIGSTOP)
        try:
            thread.join(60)
            assert not thread.is_alive()
            # A liveness bound only: the wait ends near its timeout, not long after it.
            assert time.monotonic() - started < 3 + 3
        finally:
            os.kill(server.pid, signal.SIGCONT)
        assert len(outcome) == 1
        (error,) = outcome
        assert isinstance(error, BackendUnavailableError), repr(error)
        assert isinstance(error.__cause__, RedisError), repr(error.__cause__)
        held.release()


def test_a_call_within_its_budget_on_a_silent_store_ends_as_unavailable(server: RedisServer) -> None:
    backend = RedisBackend.from_url(server.url)  # the default socket timeouts: 5 s, and retries
    try:
        assert backend.acquire("budget-warm", "t", 60, "o")  # a kept connection, already open
        os.kill(server.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(BackendUnavailableError) as raised, backend.call_budget(1.0):
                backend.acquire("budget-silent", "t", 60, "o")
            # A liveness bound only: near the budget, not after the socket timeout.
            assert time.monotonic() - started < 1 + 3
        finally:
            os.kill(server.pid, signal.SIGCONT)
        assert isinstance(raised.value.__cause__, RedisError), repr(raised.value.__cause__)
        # Outside a block the same backend answers as before, on the client's own timeouts.
        assert backend.acquire("budget-after", "t", 60, "o")
    finally:
        backend.close()
