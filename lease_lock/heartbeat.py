"""The heartbeat: one daemon thread per Locker that keeps all its leases alive (SPEC 5).

Locks are kept in a timer heap, each under a weak reference, so a lock that is garbage-collected
while held simply stops being extended. Every timer firing either extends the lease (all the
extensions that fall due together go to the backend as one ``extend_many`` call when the backend
offers it) or notices that the local lease ran out and reports the loss.

The thread waits on a condition with a timeout in bounded slices that re-read the clock, never in
one long sleep, so an injected clock (tests) or a pause found by the clock is honoured promptly.
Tests can also call :meth:`Heartbeat.run_due` to do the due work on their own thread.
"""

from __future__ import annotations

import heapq
import itertools
import os
import threading
import weakref
from typing import TYPE_CHECKING, Callable, Optional

from .backends.base import Backend, ExtendRequest
from .events import logger

if TYPE_CHECKING:
    from .lock import Lock

__all__ = ["OVERRUN_WARNING", "Heartbeat"]

#: A beat that runs this many seconds after it was due is logged as a warning: the thread or the
#: backend is too slow for the number of locks held.
OVERRUN_WARNING = 1.0
_WAIT_SLICE = 1.0

_Entry = tuple[float, int, "weakref.ref[Lock]", int]


class Heartbeat:
    """Timer heap plus the daemon thread that serves it; started on first use."""

    def __init__(self, backend: Backend, clock: Callable[[], float], name: str = "lease-lock-heartbeat") -> None:
        self._backend = backend
        self._clock = clock
        self._name = name
        self._setup()

    def _setup(self) -> None:
        self._condition = threading.Condition(threading.Lock())
        self._heap: list[_Entry] = []
        self._sequence = itertools.count()
        self._thread: Optional[threading.Thread] = None
        self._stopped = False
        self._pid = os.getpid()

    @property
    def thread(self) -> Optional[threading.Thread]:
        """The running thread, or ``None`` before the first lock is scheduled."""
        return self._thread

    def schedule(self, lock: Lock, when: float, generation: int) -> None:
        """Fire ``lock``'s timer at clock time ``when`` unless its generation moves on."""
        with self._condition:
            if self._stopped:
                return
            heapq.heappush(self._heap, (when, next(self._sequence), weakref.ref(lock), generation))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            elif self._heap[0][0] == when:
                self._condition.notify()

    def pending(self) -> int:
        """Timers in the heap (stale ones included)."""
        with self._condition:
            return len(self._heap)

    def run_due(self) -> int:
        """Do every piece of work due at the clock's current reading; returns timers fired."""
        due: list[tuple[Lock, int]] = []
        now = self._clock()
        with self._condition:
            while self._heap and self._heap[0][0] <= now:
                when, _, reference, generation = heapq.heappop(self._heap)
                lock = reference()
                if lock is not None:
                    due.append((lock, generation))
                    if now - when > OVERRUN_WARNING:
                        logger.warning(
                            "heartbeat ran %.2fs late for %r: too many locks or a slow backend", now - when, lock.key
                        )
        plans: list[tuple[Lock, float]] = []
        for lock, generation in due:
            requested = lock._beat_due(now, generation)
            if requested is not None:
                plans.append((lock, requested))
        if plans:
            self._extend(plans)
        return len(due)

    def _extend(self, plans: list[tuple[Lock, float]]) -> None:
        if len(plans) > 1 and self._backend.capabilities.batch_extend:
            sent = self._clock()
            try:
                answers = self._backend.extend_many(
                    [ExtendRequest(lock.key, lock.token, requested) for lock, requested in plans]
                )
            except Exception as error:  # noqa: BLE001 - a driver error is a failed extension
                for lock, _ in plans:
                    lock._extension_failed(error)
                return
            for (lock, requested), granted in zip(plans, answers):
                lock._extension_answered(sent, requested, granted)
            return
        for lock, requested in plans:
            sent = self._clock()
            try:
                granted = self._backend.extend(lock.key, lock.token, requested)
            except Exception as error:  # noqa: BLE001 - a driver error is a failed extension
                lock._extension_failed(error)
                continue
            lock._extension_answered(sent, requested, granted)

    def _run(self) -> None:
        while True:
            with self._condition:
                if self._stopped:
                    return
                wait = self._heap[0][0] - self._clock() if self._heap else _WAIT_SLICE
                if wait > 0:
                    self._condition.wait(min(wait, _WAIT_SLICE))
                    continue
            try:
                self.run_due()
            except Exception:  # noqa: BLE001 - the thread must outlive any one bad beat
                logger.exception("heartbeat beat failed")

    def stop(self) -> None:
        """Stop the thread and drop every timer. Idempotent."""
        with self._condition:
            self._stopped = True
            self._heap.clear()
            self._condition.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)

    def after_fork(self) -> None:
        """In a forked child: the parent's thread does not exist here; start afresh, empty."""
        self._setup()
