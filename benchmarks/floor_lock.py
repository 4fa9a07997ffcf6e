"""The floor under the core's cost: a lock that does only what every cycle must.

``benchmarks.instructions`` counts its instructions beside the real ``Locker``, and the Redis
and PostgreSQL cycle benchmarks run it against the backend's own calls, to show how much of the
core's cost the lease rules themselves take, written as plainly as Python allows. It is a lower
bound, not a lock to use: it keeps one default TTL, no options, no re-entrancy, no waiting, no
events and no extension, and its pause check is the single-threaded one. What it does on every
cycle is what no correct lock can skip:

- a fresh random token from the backend;
- the suspend-aware monotonic clock (``CLOCK_BOOTTIME``) read as the request leaves, and read
  with the wall clock beside it at the answer and at the release, so that a pause only the
  wall clock saw ends the lease early;
- the late-grant check (an answer after the local lease's end is no grant);
- one object per lock, with the mutex that orders its holder against the heartbeat thread;
- a weak reference per grant in a held set (what closing and a dropped lock's give-back need)
  and in the heartbeat's queue of arrivals, which a thread of its own empties;
- a question to the logger whether anyone wants the grant reported.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import deque
from typing import Callable

from lease_lock.backends.base import Backend

__all__ = ["FloorLocker", "floor_cycle"]

_read_boottime = time.clock_gettime
# CLOCK_BOOTTIME where the OS has it (Linux), as the real lease clock.
_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)
_read_wall = time.time
#: A forward wall-clock jump beyond the monotonic advance counted as a pause (seconds).
_PAUSE_THRESHOLD = 0.05
_logger = logging.getLogger("lease_lock")


class FloorLocker:
    """The held set, the clock's state and the heartbeat's arrivals of :class:`_FloorLock`."""

    def __init__(self, backend: Backend, ttl: float = 30.0) -> None:
        self.backend = backend
        self.ttl = ttl
        self.held: set[weakref.ref[_FloorLock]] = set()
        self.arrivals: deque[weakref.ref[_FloorLock]] = deque()
        self.paused = 0.0
        self.offset = _read_wall() - _read_boottime(_BOOTTIME)
        threading.Thread(target=self._heartbeat, name="floor-heartbeat", daemon=True).start()

    def _heartbeat(self) -> None:
        # Takes the arrivals once a second, as the real heartbeat does between its sleeps.
        while True:
            time.sleep(1.0)
            while self.arrivals:
                self.arrivals.popleft()

    def read(self) -> float:
        """The lease clock with its pause check: the boot-time clock plus every pause seen."""
        now = _read_boottime(_BOOTTIME)
        offset = _read_wall() - now
        if offset - self.offset > _PAUSE_THRESHOLD:
            self.paused += offset - self.offset
        self.offset = offset
        return now + self.paused

    def lock(self, key: str) -> _FloorLock:
        """An unacquired lock on ``key`` with a fresh token."""
        return _FloorLock(self, key, self.backend.new_token())


class _FloorLock:
    __slots__ = ("__weakref__", "_end", "_key", "_locker", "_mutex", "_reference", "_state", "_token")
    _reference: weakref.ref[_FloorLock]

    def __init__(self, locker: FloorLocker, key: str, token: str) -> None:
        self._locker = locker
        self._key = key
        self._token = token
        self._mutex = threading.Lock()
        self._state = "unlocked"

    def __enter__(self) -> _FloorLock:
        locker = self._locker
        ttl = locker.ttl
        sent = _read_boottime(_BOOTTIME) + locker.paused
        if not locker.backend.acquire(self._key, self._token, ttl, "floor"):
            raise RuntimeError(f"{self._key!r} is held")
        end = sent + ttl * 0.99
        if locker.read() >= end:
            raise RuntimeError("the grant came after its own lease ended")
        reference = self._reference = weakref.ref(self)
        locker.held.add(reference)
        # acquire() and release(), not a with statement: the cheaper form, as a floor should be.
        mutex = self._mutex
        mutex.acquire()
        self._state = "held"
        self._end = end
        mutex.release()
        locker.arrivals.append(reference)
        if _logger.isEnabledFor(logging.DEBUG):
            _logger.debug("acquired %r", self._key)
        return self

    def __exit__(self, *exc_info: object) -> None:
        locker = self._locker
        if locker.read() >= self._end:
            raise RuntimeError("the lease ran out while held")
        mutex = self._mutex
        mutex.acquire()
        self._state = "releasing"
        mutex.release()
        locker.backend.release(self._key, self._token)
        mutex.acquire()
        self._state = "released"
        mutex.release()
        locker.held.discard(self._reference)


def floor_cycle(backend: Backend, key: str = "bench", ttl: float = 30.0) -> Callable[[], None]:
    """``with floor.lock(key): pass`` on a :class:`FloorLocker` of ``backend``."""
    floor = FloorLocker(backend, ttl)

    def cycle() -> None:
        with floor.lock(key):
            pass

    return cycle
