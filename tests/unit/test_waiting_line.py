"""The core's one waking seam: a backend's waiting line (``Backend.join_line``).

Each test uses a backend with a line of its own, so the core is seen only through the seam: when
it joins, what it asks the line to wait, how a grant or an outage coming out of the line ends
the acquisition, and the waiting rule (the delay unset: the line alone ends a pause; set: it
bounds every pause). Real time: a line blocks its thread, which injected time cannot follow.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Optional

import pytest
from lease_lock import BackendUnavailableError, Locker, LockHeldError, MemoryBackend, Retry
from lease_lock.backends.base import LineGrant, WaitingLine
from lease_lock.testing import wait_until

from .fakes import EventLog

OTHER = "o" * 32


class ScriptedLine(WaitingLine):
    """A line whose wait blocks until the test opens it (or raises what the test set), then
    takes the key with its own attempt; it records what the core asked of it."""

    def __init__(self, backend: LineBackend, key: str, token: str, ttl: float, clock: Callable[[], float]) -> None:
        self.backend, self.key, self.token, self.ttl, self.clock = backend, key, token, ttl, clock
        self.waits: list[float] = []
        self.asks = 0
        self.left: list[bool] = []

    def ask(self) -> Optional[int]:
        self.asks += 1
        return self.backend.acquire_fenced(self.key, self.token, self.ttl, "line")

    def wait(self, seconds: float) -> Optional[LineGrant]:
        self.waits.append(seconds)
        if self.backend.failure is not None:
            raise self.backend.failure
        if not self.backend.opened.wait(seconds):
            return None
        sent = self.clock()
        fence = self.backend.acquire_fenced(self.key, self.token, self.ttl, "line")
        return None if fence is None else LineGrant(fence, sent, self.ttl, False)

    def leave(self, granted: bool) -> None:
        self.left.append(granted)


class LineBackend(MemoryBackend):
    """A memory backend whose waiters wait in a :class:`ScriptedLine`."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[ScriptedLine] = []
        self.opened = threading.Event()
        self.failure: Optional[BackendUnavailableError] = None

    def join_line(
        self, key: str, token: str, ttl: float, owner: str, fenced: bool, clock: Callable[[], float]
    ) -> Optional[WaitingLine]:
        line = ScriptedLine(self, key, token, ttl, clock)
        self.lines.append(line)
        return line


def test_a_busy_key_is_waited_for_in_the_line_and_the_grant_it_brings_is_held() -> None:
    backend = LineBackend()
    backend.acquire("k", OTHER, 3600.0, "other")
    events = EventLog()
    with Locker(backend, on_event=events) as locker:
        outcome: list[object] = []
        thread = threading.Thread(target=lambda: outcome.append(locker.acquire("k", timeout=60)))
        thread.start()
        assert wait_until(lambda: bool(backend.lines and backend.lines[0].waits), 30)
        backend.release("k", OTHER)
        backend.opened.set()
        thread.join(30)
        assert [getattr(lock, "state", None) for lock in outcome] == ["held"]
        (line,) = backend.lines
        # Joined once the first attempt found the key held, waited with the time left (the
        # delay unset), and left holding the key; the grant counts as the second attempt.
        assert line.left == [True]
        assert 1.0 >= line.waits[0] > 0.5  # a slice of the time left, between looks at close()
        assert [event.attempts for event in events.of("acquired")] == [2]
        assert line.asks == 0


def test_a_line_that_cannot_reach_the_store_ends_the_wait_as_unavailable_not_held() -> None:
    backend = LineBackend()
    backend.acquire("k", OTHER, 3600.0, "other")
    cause = ConnectionError("no answer (test)")
    failure = BackendUnavailableError("store unreachable (test)", backend="memory")
    failure.__cause__ = cause
    backend.failure = failure
    with Locker(backend) as locker:
        started = time.monotonic()
        with pytest.raises(BackendUnavailableError) as caught:
            locker.acquire("k", timeout=0.5)
        # A liveness bound only: the wait ends at its timeout, not long after it.
        assert time.monotonic() - started < 0.5 + 3.0
    assert caught.value.__cause__ is cause
    assert not isinstance(caught.value, LockHeldError)
    assert all(line.left == [False] for line in backend.lines)


def test_with_the_delay_unset_a_waiter_asks_when_the_holders_lease_ends_not_before() -> None:
    # On a store that announces releases (memory), the default retry waits for the release or
    # the holder's lease end: one refused attempt, then the one that takes the key.
    backend = MemoryBackend()
    events = EventLog()
    with Locker(backend, ttl=1.0) as holder, Locker(backend, on_event=events) as waiter:
        held = holder.acquire("k", auto_extend=False)
        lock = waiter.acquire("k", timeout=30)
        assert lock.state == "held"
        assert held.state != "held"
    assert len(events.of("contended")) <= 2
    assert [event.attempts for event in events.of("acquired")] == [2]


def test_a_set_delay_bounds_every_wait_in_line() -> None:
    backend = LineBackend()
    backend.acquire("k", OTHER, 3600.0, "other")
    with Locker(backend, retry=Retry(delay=0.05, timeout=0.4)) as locker, pytest.raises(LockHeldError) as caught:
        locker.acquire("k")
    assert caught.value.reason == "timeout"
    (line,) = backend.lines
    assert line.waits and max(line.waits) <= 0.05
    # Each pause ended, and an attempt in the line followed it.
    assert line.asks >= 2 and line.left == [False]
