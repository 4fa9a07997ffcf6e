"""The heartbeat: one daemon thread per Locker that keeps all its leases alive.

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
import math
import threading
import weakref
from typing import Callable, Optional, Protocol

from .backends.base import Backend, ExtendRequest
from .events import logger

__all__ = ["OVERRUN_WARNING", "Beating", "Heartbeat", "Timer"]

#: A beat that runs this many seconds after it was due is logged as a warning: the thread or the
#: backend is too slow for the number of locks held.
OVERRUN_WARNING = 1.0
_WAIT_SLICE = 1.0
#: Cancelled timers are dropped from the heap in one pass once they outnumber the live ones (and
#: at least this many), so released locks neither grow the heap nor wake the thread.
_COMPACT_AFTER = 256


class Beating(Protocol):
    """What the heartbeat drives: a lock's key and token, and the four steps of a beat."""

    key: str
    token: str

    def heartbeat_due(self, now: float, timer: Timer) -> Optional[float]:
        """The timer fired at ``now``: the TTL to ask for, or ``None`` when no extension is due."""

    def heartbeat_sending(self, requested: float, sent: float) -> Optional[float]:
        """The extension leaves at ``sent``: the TTL to send, or ``None`` when none is left."""

    def heartbeat_answered(self, sent: float, received: float, requested: float, granted: bool) -> bool:
        """The store answered; ``True`` when the lease is still held."""

    def heartbeat_failed(self, error: BaseException) -> None:
        """The extension raised ``error``."""


class Timer:
    """One lock's pending heartbeat work, ordered by due time; cancelled in place."""

    __slots__ = ("cancelled", "lock", "sequence", "when")

    def __init__(self, when: float, sequence: int, lock: weakref.ref[Beating]) -> None:
        self.when = when
        self.sequence = sequence
        self.lock = lock
        self.cancelled = False

    def __lt__(self, other: Timer) -> bool:
        return (self.when, self.sequence) < (other.when, other.sequence)


#: A heap entry: ``(when, sequence, timer)``. Tuples of a float and a unique int compare in C,
#: without calling ``Timer.__lt__`` for every step of a push or a pop.
_Entry = tuple[float, int, Timer]


class Heartbeat:
    """Timer heap plus the daemon thread that serves it; started on first use."""

    def __init__(self, backend: Backend, clock: Callable[[], float], name: str = "lease-lock-heartbeat") -> None:
        self._backend = backend
        self._clock = clock
        self._name = name
        self._setup()

    def _setup(self) -> None:
        # schedule() and cancel() take the bare lock: entering the Condition costs a Python call.
        self._mutex = threading.Lock()
        self._condition = threading.Condition(self._mutex)
        self._heap: list[_Entry] = []
        self._cancelled = 0
        self._sequence = itertools.count()
        self._thread: Optional[threading.Thread] = None
        self._stopped = False
        #: Clock time the thread sleeps until (-inf while it is awake and will look again).
        self._sleeping_until = -math.inf

    @property
    def thread(self) -> Optional[threading.Thread]:
        """The running thread, or ``None`` before the first lock is scheduled."""
        return self._thread

    def schedule(self, lock: Beating, when: float) -> Timer:
        """Fire ``lock``'s timer at clock time ``when``; returns the timer, for :meth:`cancel`."""
        sequence = next(self._sequence)
        timer = Timer(when, sequence, weakref.ref(lock))
        with self._mutex:
            if self._stopped:
                timer.cancelled = True
                return timer
            heapq.heappush(self._heap, (when, sequence, timer))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            elif when < self._sleeping_until:
                # Wake the thread only when it sleeps past this timer. Timers that fall due
                # later are picked up when it wakes anyway; waking it for each of them would
                # hand it the GIL on every acquisition.
                self._condition.notify()
        return timer

    def cancel(self, timer: Timer) -> None:
        """Make ``timer`` never fire."""
        with self._mutex:
            if timer.cancelled:
                return
            timer.cancelled = True
            self._cancelled += 1
            if self._cancelled >= _COMPACT_AFTER and self._cancelled * 2 > len(self._heap):
                self._heap = [entry for entry in self._heap if not entry[2].cancelled]
                heapq.heapify(self._heap)
                self._cancelled = 0

    def _drop_cancelled_top(self) -> None:
        # Called with the condition held.
        while self._heap and self._heap[0][2].cancelled:
            heapq.heappop(self._heap)
            self._cancelled -= 1

    def pending(self) -> int:
        """Timers that will still fire."""
        with self._condition:
            return len(self._heap) - self._cancelled

    def run_due(self) -> int:
        """Do every piece of work due at the clock's current reading; returns timers fired."""
        due: list[tuple[Beating, Timer]] = []
        now = self._clock()
        with self._condition:
            self._drop_cancelled_top()
            while self._heap and self._heap[0][0] <= now:
                timer = heapq.heappop(self._heap)[2]
                # A fired timer is spent: mark it so a later cancel() does not count it again.
                timer.cancelled = True
                lock = timer.lock()
                if lock is not None:
                    due.append((lock, timer))
                    if now - timer.when > OVERRUN_WARNING:
                        logger.warning(
                            "heartbeat ran %.2fs late for %r: too many locks or a slow backend",
                            now - timer.when, lock.key,
                        )
                self._drop_cancelled_top()
        plans: list[tuple[Beating, float]] = []
        for lock, timer in due:
            requested = lock.heartbeat_due(now, timer)
            if requested is not None:
                plans.append((lock, requested))
        if plans:
            self._extend(plans)
        return len(due)

    def _extend(self, plans: list[tuple[Beating, float]]) -> None:
        if len(plans) > 1 and self._backend.capabilities.batch_extend:
            sent = self._clock()
            plans = [
                (lock, clamped) for lock, requested in plans if (clamped := lock.heartbeat_sending(requested, sent))
            ]
            try:
                answers = self._backend.extend_many(
                    [ExtendRequest(lock.key, lock.token, requested) for lock, requested in plans]
                )
            except Exception as error:  # noqa: BLE001 - a driver error is a failed extension
                for lock, _ in plans:
                    lock.heartbeat_failed(error)
                return
            # Every answer arrived with the batch: judge lateness by that moment, not by when the
            # loop below gets to each lock (thousands of answers take a while to apply).
            received = self._clock()
            for (lock, requested), granted in zip(plans, answers):
                lock.heartbeat_answered(sent, received, requested, granted)
            return
        for lock, planned in plans:
            sent = self._clock()
            clamped = lock.heartbeat_sending(planned, sent)
            if clamped is None:
                continue
            try:
                granted = self._backend.extend(lock.key, lock.token, clamped)
            except Exception as error:  # noqa: BLE001 - a driver error is a failed extension
                lock.heartbeat_failed(error)
                continue
            lock.heartbeat_answered(sent, self._clock(), clamped, granted)

    def _run(self) -> None:
        while True:
            with self._condition:
                if self._stopped:
                    return
                self._drop_cancelled_top()
                wait = self._heap[0][0] - self._clock() if self._heap else _WAIT_SLICE
                if wait > 0:
                    wait = min(wait, _WAIT_SLICE)
                    self._sleeping_until = self._clock() + wait
                    self._condition.wait(wait)
                    self._sleeping_until = -math.inf
                    continue
            try:
                self.run_due()
            except Exception:  # noqa: BLE001 - the thread must outlive any one bad beat
                logger.exception("heartbeat beat failed")

    def stop(self, *, wait: bool = True) -> None:
        """Stop the thread and drop every timer; with ``wait``, until the thread has ended.
        Idempotent."""
        with self._condition:
            self._stopped = True
            self._heap.clear()
            self._cancelled = 0
            self._condition.notify_all()
            thread = self._thread
        if wait and thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)

    def after_fork(self) -> None:
        """In a forked child: the parent's thread does not exist here; start afresh, empty."""
        self._setup()
