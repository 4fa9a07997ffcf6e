"""Test doubles for the core's unit tests: a fake clock, a memory backend that records and can
disturb its calls, and an event recorder."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any, Callable, ClassVar, Optional, Sequence

from lease_lock import Locker, LockEvent, MemoryBackend
from lease_lock.backends.base import Capabilities, ExtendRequest, WaitingLine

__all__ = ["START", "EventLog", "FakeClock", "RecordingBackend", "SilentBackend", "SleepingClock", "advance_to_beat"]

#: Fake time starts here; values used by the tests are binary fractions, so sums are exact.
START = 1000.0


class FakeClock:
    """A monotonic clock that moves only when a test says so."""

    def __init__(self, start: float = START) -> None:
        self.now = start
        self._mutex = threading.Lock()

    def __call__(self) -> float:
        with self._mutex:
            return self.now

    def advance(self, seconds: float) -> float:
        """Move forward by ``seconds``; returns the new reading."""
        with self._mutex:
            self.now += seconds
            return self.now

    def set(self, when: float) -> None:
        """Move to ``when`` (never backwards)."""
        with self._mutex:
            assert when >= self.now, "a monotonic clock cannot go back"
            self.now = when


class SleepingClock(FakeClock):
    """A fake clock that a Locker's waits sleep on: each sleep moves it and is recorded.

    A Locker given a clock with a ``sleep`` method waits on that clock alone, so a wait between
    attempts takes no real time and ``slept`` lists every one.
    """

    def __init__(self, start: float = START) -> None:
        super().__init__(start)
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        """Record ``seconds`` and move the clock by them."""
        self.slept.append(seconds)
        self.advance(seconds)


class RecordingBackend(MemoryBackend):
    """A memory backend that records every primitive call and lets a test disturb them.

    ``calls`` holds ``(method, key, ttl)`` tuples (``ttl`` is ``None`` where it does not apply).
    ``hooks[method]`` runs after the store answered and before the answer is returned: it may
    advance the fake clock (a slow reply), raise (a reply lost on the way back) or set events.
    ``failures[method]`` is raised before the store is touched (a request that never arrived).
    """

    def __init__(self, *, clock: Optional[Callable[[], float]] = None) -> None:
        super().__init__(clock=clock)
        self.calls: list[tuple[str, str, Optional[float]]] = []
        self.batches: list[int] = []
        self.hooks: dict[str, Callable[[], None]] = {}
        self.failures: dict[str, BaseException] = {}

    def _record(self, method: str, key: str, ttl: Optional[float] = None) -> None:
        self.calls.append((method, key, ttl))
        failure = self.failures.get(method)
        if failure is not None:
            raise failure

    def _after(self, method: str) -> None:
        hook = self.hooks.get(method)
        if hook is not None:
            hook()

    def called(self, method: str) -> list[tuple[str, str, Optional[float]]]:
        """The recorded calls of one method."""
        return [call for call in self.calls if call[0] == method]

    def acquire(self, key: str, token: str, ttl: float, owner: str) -> bool:
        self._record("acquire", key, ttl)
        granted = super().acquire(key, token, ttl, owner)
        self._after("acquire")
        return granted

    def acquire_fenced(self, key: str, token: str, ttl: float, owner: str) -> Optional[int]:
        self._record("acquire_fenced", key, ttl)
        fence = super().acquire_fenced(key, token, ttl, owner)
        self._after("acquire_fenced")
        return fence

    def release(self, key: str, token: str) -> bool:
        self._record("release", key)
        deleted = super().release(key, token)
        self._after("release")
        return deleted

    def extend(self, key: str, token: str, ttl: float) -> bool:
        self._record("extend", key, ttl)
        extended = super().extend(key, token, ttl)
        self._after("extend")
        return extended

    def extend_many(self, requests: Sequence[ExtendRequest]) -> list[bool]:
        self.batches.append(len(requests))
        return super().extend_many(requests)

    def is_held(self, key: str, token: str) -> bool:
        self._record("is_held", key)
        return super().is_held(key, token)

    def inspect(self, key: str) -> Any:
        self._record("inspect", key)
        return super().inspect(key)

    def force_release(self, key: str) -> bool:
        self._record("force_release", key)
        return super().force_release(key)


class SilentBackend(RecordingBackend):
    """A recording memory backend that announces nothing: it offers no waiting line, and
    waiters sleep out their retry pause."""

    capabilities: ClassVar[Capabilities] = replace(MemoryBackend.capabilities, release_notify=False)

    def join_line(
        self, key: str, token: str, ttl: float, owner: str, fenced: bool, clock: Callable[[], float]
    ) -> Optional[WaitingLine]:
        return None


class EventLog(list[LockEvent]):
    """The events a locker reported, in order; callable, so it is the ``on_event`` hook."""

    def __call__(self, event: LockEvent) -> None:
        self.append(event)

    def types(self, key: Optional[str] = None) -> list[str]:
        """Event types in order (of one key when given)."""
        return [event.type for event in self if key is None or event.key == key]

    def of(self, event_type: str) -> list[LockEvent]:
        """The events of one type."""
        return [event for event in self if event.type == event_type]


def advance_to_beat(clock: FakeClock, locker: Locker, when: float) -> int:
    """Move the clock to ``when`` and run the heartbeat's due work; returns timers fired."""
    clock.set(when)
    return locker.run_heartbeat()
