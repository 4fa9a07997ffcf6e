"""The heartbeat: one daemon thread per Locker that keeps all its leases alive.

Each held lock has one timer, kept under a weak reference to the lock, so a lock that is
garbage-collected while held simply stops being extended. Every timer firing either extends the
lease (all the extensions that fall due together go to the backend as one ``extend_many`` call
when the backend offers it) or notices that the local lease ran out and reports the loss.

Scheduling is O(1) in the usual case. Every timer names a *lane*, the delay it was set for (a
third of the TTL, say): locks of one locker mostly share a few delays, and timers set for the
same delay one after the other fall due in the order they were set. So each lane is a FIFO
queue, and a timer goes to the back of its lane; only a timer that would fall due before the
back of its lane (threads racing to schedule) or that finds no lane free goes to a heap
instead. Cancelling only marks the timer; cancelled timers are dropped when they reach the
front or are found at the back of their lane by the next timer set there (a lock acquired and
released at once), or all at once when they outnumber the live ones.

A lock whose first timer falls due well after its grant (at least :data:`ARRIVAL_LEAD`
seconds: a third of a 30 s TTL, say) sets no timer at all when it is granted: it joins a queue
of arrivals, which the thread empties every time it wakes (at least once a slice), setting the
timers of the locks still held by then. A lock held for a moment, the usual case, is released
before that and never costs a timer.

A lock that is garbage-collected while held cannot be released by its owner: its collection
only queues its key and token here (see :meth:`Heartbeat.give_back_dropped`) and wakes the
thread, which gives the lease back on its own time, never inside the garbage collector. A
re-entrant handle collected while it shares a lease queues letting go of its hold the same way.

The thread waits on a condition with a timeout in bounded slices that re-read the clock, never in
one long sleep, so an injected clock (tests) or a pause found by the clock is honoured promptly.
A heartbeat that is not ``threaded`` (``Locker(heartbeat_thread=False)``) starts no thread: its
owner calls :meth:`Heartbeat.run_due` to do the due work on a thread of its own.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import math
import threading
import weakref
from collections import deque
from typing import Any, Callable, Literal, Optional, Protocol

from .backends.base import Backend, ExtendRequest
from .events import logger

__all__ = [
    "ARRIVAL_LEAD", "INTERVAL_SHARE", "LANES", "OVERRUN_WARNING", "RETRY_SHARE", "BeatStep", "Beating", "Beats",
    "Heartbeat", "Timer", "beat_interval", "clamp_to_deadline", "next_beat",
]

#: A beat that runs this many seconds after it was due is logged as a warning: the thread or the
#: backend is too slow for the number of locks held.
OVERRUN_WARNING = 1.0
#: At most this many lanes (distinct delays) are kept; timers of further delays go to the heap.
#: The thread looks at the front of every lane each time it wakes, so they must stay few.
LANES = 8
_WAIT_SLICE = 1.0
#: A lock whose first timer falls due at least this many seconds after its grant goes through
#: the arrivals queue (see the module docstring): the thread wakes at least once a slice, so
#: it sets that timer in time with a slice to spare.
ARRIVAL_LEAD = 2 * _WAIT_SLICE
#: Cancelled timers are dropped in one pass once at least this many (and as many as the live
#: ones) were cancelled since the last pass, so released locks neither grow the queues nor wake
#: the thread, at an amortized O(1) per cancel.
_COMPACT_AFTER = 256


# -- the schedule ------------------------------------------------------------------------------
# The one home of the heartbeat's policy: how often a lease is extended, when the next extension
# leaves after a grant, an answer or a failure, and how much each one asks for under a max-hold
# deadline. The lock and the thread below only follow it; the docs explain it once, on the
# concepts page ("The heartbeat").

#: Without ``extend_interval``, a lease is extended every this share of its TTL: two extensions
#: in a row can fail before the lease is in danger.
INTERVAL_SHARE = 1 / 3
#: After an extension that raised, the next one leaves after this share of the interval: the
#: confirmed lease still runs, and this leaves room for more tries before it ends.
RETRY_SHARE = 1 / 3

#: What a lock's schedule is set after: its grant, an extension answered, an extension that raised.
BeatStep = Literal["granted", "claimed", "extended", "failed"]


def beat_interval(ttl: float, extend_interval: Optional[float]) -> float:
    """Seconds between two extensions of a lease of ``ttl``: ``extend_interval`` when given,
    else :data:`INTERVAL_SHARE` of the TTL."""
    return extend_interval or ttl * INTERVAL_SHARE


def next_beat(step: BeatStep, at: float, interval: float, *, extending: bool) -> float:
    """When a lock's next extension leaves, on the lease clock, after ``step`` at ``at``.

    - ``"granted"`` and ``"extended"``: ``at`` is when the request that won or renewed the
      lease *left*, and the next one leaves one ``interval`` later. Counting from the send, as
      the local lease itself does, keeps a slow answer from pushing the schedule late.
    - ``"claimed"``: a key that a release handed straight to this waiter holds only for a
      short claim window (see :mod:`lease_lock.backends.handoff`), judged from ``at``, the send
      of the waiter's latest request before the grant; ``interval`` is then the claim window's
      own interval (:func:`beat_interval` of the window, or the lock's when that is shorter).
      The extension that turns the claim into a full lease leaves one such interval later,
      *whether or not* the lock is ``extending``: without it, every claim would end early.
    - ``"failed"``: ``at`` is when the failure was seen; the next try leaves after
      :data:`RETRY_SHARE` of the interval.
    - Never (``inf``) when the lock is not ``extending``: ``auto_extend=False``, a heartbeat
      stopped by a failed release, or a lease already clamped to its max-hold deadline (see
      :func:`clamp_to_deadline`), which a further extension could not lengthen.
    """
    if not extending and step != "claimed":
        return math.inf
    return at + (interval * RETRY_SHARE if step == "failed" else interval)


def clamp_to_deadline(ttl: float, deadline: float, now: float) -> float:
    """The TTL an extension (or grant) leaving at ``now`` asks for: ``ttl``, cut so the lease
    ends no later than the max-hold ``deadline``. Zero or less means no time is left: the lock
    is then lost with reason ``"max-hold"``. Applied as each request leaves, not when it is
    planned, since planned requests can wait behind others."""
    return min(ttl, deadline - now)


class Beating(Protocol):
    """What the heartbeat serves: a lock's key and token (the rest is :class:`Beats`'s)."""

    @property
    def key(self) -> str:
        """The lock's key."""

    @property
    def token(self) -> str:
        """The token that holds it."""


class Beats(Protocol):
    """How the heartbeat drives the locks it serves: the steps of a beat, each given the lock."""

    def due(self, lock: Any, now: float, timer: Timer) -> Optional[float]:
        """The lock's timer fired at ``now``: the TTL to ask for, or ``None`` when no extension
        is due."""

    def sending(self, lock: Any, requested: float, sent: float) -> Optional[float]:
        """The extension leaves at ``sent``: the TTL to send, or ``None`` when none is left."""

    def answered(self, lock: Any, sent: float, received: float, requested: float, granted: bool) -> bool:
        """The store answered; ``True`` when the lease is still held."""

    def failed(self, lock: Any, error: BaseException) -> None:
        """The extension raised ``error``."""

    def arrived(self, lock: Any) -> None:
        """The heartbeat takes the lock on (see :meth:`Heartbeat.arrive`): set its timer if it
        is still held and has none yet."""


class Timer:
    """One lock's pending heartbeat work, due at clock time ``when``; cancelled in place."""

    __slots__ = ("cancelled", "lock", "when")

    def __init__(self, when: float, lock: weakref.ref[Any]) -> None:
        self.when = when
        self.lock = lock
        self.cancelled = False


#: A heap entry: ``(when, sequence, timer)``. Tuples of a float and a unique int compare in C.
_Entry = tuple[float, int, Timer]


class Heartbeat:
    """Timer lanes and heap plus the daemon thread that serves them; started on first use.

    ``threaded`` is set to ``False`` (before any lock is scheduled) for a heartbeat whose owner
    calls :meth:`run_due` itself: no thread is started then."""

    #: Whether a thread of its own serves the timers (see the class docstring).
    threaded = True

    def __init__(
        self, backend: Backend, clock: Callable[[], float], beats: Beats, name: str = "lease-lock-heartbeat"
    ) -> None:
        self._backend = backend
        self._beats = beats
        self._clock = clock
        self._name = name
        self._setup()

    def _setup(self) -> None:
        # schedule() takes the bare lock: entering the Condition costs a Python call.
        self._mutex = threading.Lock()
        self._condition = threading.Condition(self._mutex)
        self._lanes: dict[float, deque[Timer]] = {}
        self._heap: list[_Entry] = []
        # Locks granted without a timer (see arrive()); appended and popped without the mutex.
        self._arrivals: deque[weakref.ref[Any]] = deque()
        self._sweep_arrivals_at = _COMPACT_AFTER
        self._sequence = itertools.count()
        #: Cancels since the last compaction (counted without the mutex: a lost count only
        #: delays a compaction), and the count that triggers the next one.
        self._cancelled = 0
        self._compact_at = _COMPACT_AFTER
        # (key, token, let_go) of leases whose lock was collected while held (see
        # give_back_dropped): appended by the collector, popped by whichever library thread
        # gives them back.
        self._dropped: deque[tuple[str, str, Optional[Callable[[], object]]]] = deque()
        self._thread: Optional[threading.Thread] = None
        self._stopped = False
        #: Clock time the thread sleeps until (-inf while it is awake and will look again).
        self._sleeping_until = -math.inf

    @property
    def thread(self) -> Optional[threading.Thread]:
        """The running thread, or ``None`` before the first lock is scheduled."""
        return self._thread

    def schedule(self, lock: weakref.ref[Any], when: float, lane: float) -> Timer:
        """Fire the timer of the lock ``lock`` refers to (weakly) at clock time ``when``; returns
        the timer, for :meth:`cancel`.

        ``lane`` is the delay the timer was set for (any float): timers of one lane are
        expected, not required, to be scheduled in the order they fall due."""
        timer = Timer(when, lock)
        with self._mutex:
            if self._stopped:
                timer.cancelled = True
                return timer
            queue = self._lanes.get(lane)
            if queue is not None:
                # The timer set just before in this lane is often cancelled already (a lock
                # acquired and released again at once): drop it here, not in a later sweep.
                while queue and queue[-1].cancelled:
                    queue.pop()
                if queue and queue[-1].when > when:
                    queue = None  # it would fall due before the back of its lane
            elif len(self._lanes) < LANES:
                queue = self._lanes[lane] = deque()
            if queue is not None:
                queue.append(timer)
            else:
                heapq.heappush(self._heap, (when, next(self._sequence), timer))
            if when < self._sleeping_until:
                # Wake the thread only when it sleeps past this timer. Timers that fall due
                # later are picked up when it wakes anyway; waking it for each of them would
                # hand it the GIL on every acquisition.
                self._condition.notify()
            elif self._thread is None:
                self._start_thread()
        return timer

    def _start_thread(self) -> None:
        # Called with the mutex held, while no thread runs.
        if not self.threaded:
            return
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def arrive(self, lock: weakref.ref[Any]) -> None:
        """The lock ``lock`` refers to (weakly) was just granted and its first timer falls due
        at least :data:`ARRIVAL_LEAD` seconds from now: the thread sets it when it next wakes,
        if the lock is still held then (``Beats.arrived``). No mutex, no timer."""
        self._arrivals.append(lock)
        if self._thread is None:
            with self._mutex:
                if self._thread is None and not self._stopped:
                    self._start_thread()
        if len(self._arrivals) >= self._sweep_arrivals_at:
            self._sweep_arrivals()

    def _sweep_arrivals(self) -> None:
        # Arrivals of collected locks are dropped in place (other threads append and the
        # thread pops meanwhile, both atomic), in amortized O(1) like the timers' sweep.
        with self._mutex:
            arrivals = self._arrivals
            for _ in range(len(arrivals)):
                try:
                    reference = arrivals.popleft()
                except IndexError:
                    break
                if reference() is not None:
                    arrivals.append(reference)
            self._sweep_arrivals_at = max(_COMPACT_AFTER, 2 * len(arrivals))

    def _take_arrivals(self) -> None:
        """Set the timers of the locks that arrived and are still held. Called without the
        mutex: each lock takes its own, then this one to schedule."""
        arrivals = self._arrivals
        while arrivals:
            try:
                reference = arrivals.popleft()
            except IndexError:
                break
            lock = reference()
            if lock is not None:
                self._beats.arrived(lock)

    def give_back_dropped(self, key: str, token: str, let_go: Optional[Callable[[], object]] = None) -> None:
        """Library side, safe inside the garbage collector: the lock holding ``key`` with
        ``token`` was collected while held; queue its lease to be given back by the thread
        (``let_go()`` is called instead for a handle that shared the lease with other holds:
        it gives the key back only if that hold was the last).

        Nothing here blocks or reaches the store: the pair is queued, and the thread is woken
        only when its mutex is free at once (otherwise it finds the queue within a slice)."""
        self._dropped.append((key, token, let_go))
        if self._mutex.acquire(blocking=False):
            try:
                self._condition.notify()
            finally:
                self._mutex.release()

    def release_dropped(self) -> int:
        """Give back the leases queued by :meth:`give_back_dropped` (on the calling thread, the
        heartbeat's or a closing Locker's); returns how many were asked for. Best effort: a
        lease that cannot be given back runs out on the store."""
        dropped = self._dropped
        count = 0
        while dropped:
            try:
                key, token, let_go = dropped.popleft()
            except IndexError:
                break
            count += 1
            try:
                if let_go is None:
                    self._backend.release(key, token)
                else:
                    let_go()
            except Exception:  # noqa: BLE001 - the lease runs out on its own; keep serving the rest
                logger.warning("giving back the lease of dropped lock %r failed", key, exc_info=True)
        return count

    def cancel(self, timer: Timer) -> None:
        """Make ``timer`` never fire (no mutex: the timer is only marked)."""
        if timer.cancelled:
            return
        timer.cancelled = True
        self._cancelled += 1
        if self._cancelled >= self._compact_at:
            self._compact()

    def _compact(self) -> None:
        with self._mutex:
            for lane, queue in list(self._lanes.items()):
                kept = deque(timer for timer in queue if not timer.cancelled)
                if kept:
                    self._lanes[lane] = kept
                else:
                    del self._lanes[lane]
            self._heap = [entry for entry in self._heap if not entry[2].cancelled]
            heapq.heapify(self._heap)
            self._cancelled = 0
            live = len(self._heap) + sum(len(queue) for queue in self._lanes.values())
            self._compact_at = max(_COMPACT_AFTER, live)

    def _next_due(self) -> float:
        """When the earliest live timer falls due (``inf``: none); drops cancelled fronts.
        Called with the mutex held."""
        due = math.inf
        for lane, queue in list(self._lanes.items()):
            while queue and queue[0].cancelled:
                queue.popleft()
            if queue:
                due = min(due, queue[0].when)
            else:
                # An empty lane frees its place for another delay.
                del self._lanes[lane]
        heap = self._heap
        while heap and heap[0][2].cancelled:
            heapq.heappop(heap)
        if heap:
            due = min(due, heap[0][0])
        return due

    def pending(self) -> int:
        """Timers that will still fire (the locks that arrived get theirs first)."""
        self._take_arrivals()
        with self._mutex:
            timers = [entry[2] for entry in self._heap]
            for queue in self._lanes.values():
                timers.extend(queue)
            return sum(1 for timer in timers if not timer.cancelled)

    def _pop_due(self, now: float) -> list[Timer]:
        """Every live timer due at ``now``, earliest first; each is spent. Called with the mutex held."""
        fired: list[Timer] = []
        for queue in self._lanes.values():
            while queue and queue[0].when <= now:
                fired.append(queue.popleft())
        heap = self._heap
        while heap and heap[0][0] <= now:
            fired.append(heapq.heappop(heap)[2])
        fired.sort(key=_due_time)
        live = []
        for timer in fired:
            if not timer.cancelled:
                # A fired timer is spent: mark it so a later cancel() does not count it.
                timer.cancelled = True
                live.append(timer)
        return live

    def run_due(self) -> int:
        """Do every piece of work due at the clock's current reading (dropped locks' leases
        given back first); returns timers fired."""
        if self._dropped:
            self.release_dropped()
        self._take_arrivals()
        due: list[tuple[Beating, Timer]] = []
        beats = self._beats
        now = self._clock()
        with self._mutex:
            for timer in self._pop_due(now):
                lock = timer.lock()
                if lock is not None:
                    due.append((lock, timer))
                    if now - timer.when > OVERRUN_WARNING:
                        logger.warning(
                            "heartbeat ran %.2fs late for %r: too many locks or a slow backend",
                            now - timer.when, lock.key,
                        )
        plans: list[tuple[Beating, float]] = []
        for lock, timer in due:
            requested = beats.due(lock, now, timer)
            if requested is not None:
                plans.append((lock, requested))
        if plans:
            self._extend(plans)
        return len(due)

    def extend_batch(self, plans: list[tuple[Beating, float]]) -> None:
        """Send the planned extensions (each lock with the TTL it is due, counted in flight by
        its ``Beats.due``) as one ``extend_many``, each clamped as it leaves, and apply every
        answer. A driver error is each lock's failed extension, then raised."""
        beats = self._beats
        sent = self._clock()
        plans = [(lock, clamped) for lock, requested in plans if (clamped := beats.sending(lock, requested, sent))]
        try:
            answers = self._backend.extend_many(
                [ExtendRequest(lock.key, lock.token, requested) for lock, requested in plans]
            )
        except Exception as error:
            for lock, _ in plans:
                beats.failed(lock, error)
            raise
        # Every answer arrived with the batch: judge lateness by that moment, not by when the
        # loop below gets to each lock (thousands of answers take a while to apply).
        received = self._clock()
        for (lock, requested), granted in zip(plans, answers):
            beats.answered(lock, sent, received, requested, granted)

    def _extend(self, plans: list[tuple[Beating, float]]) -> None:
        beats = self._beats
        if len(plans) > 1 and self._backend.capabilities.batch_extend:
            # A driver error is each lock's failed extension, which extend_batch reported.
            with contextlib.suppress(Exception):
                self.extend_batch(plans)
            return
        for lock, planned in plans:
            sent = self._clock()
            clamped = beats.sending(lock, planned, sent)
            if clamped is None:
                continue
            try:
                granted = self._backend.extend(lock.key, lock.token, clamped)
            except Exception as error:  # noqa: BLE001 - a driver error is a failed extension
                beats.failed(lock, error)
                continue
            beats.answered(lock, sent, self._clock(), clamped, granted)

    def _run(self) -> None:
        while True:
            with self._condition:
                if self._stopped:
                    break
                due = self._next_due()
                wait = due - self._clock() if due != math.inf else _WAIT_SLICE
                if wait > 0 and not self._dropped:
                    wait = min(wait, _WAIT_SLICE)
                    self._sleeping_until = self._clock() + wait
                    self._condition.wait(wait)
                    self._sleeping_until = -math.inf
            if self._dropped:
                self.release_dropped()
            if wait > 0:
                # After each sleep, not before it: a lock granted just before it still gets its
                # timer in time (ARRIVAL_LEAD is two slices), and a lock held for a moment is
                # released and gone by then, so the thread never holds it for an instant.
                self._take_arrivals()
                continue
            try:
                self.run_due()
            except Exception:  # noqa: BLE001 - the thread must outlive any one bad beat
                logger.exception("heartbeat beat failed")
        # Stopped (a closing or dropped Locker): leases of locks collected just before still go back.
        self.release_dropped()

    def stop(self, *, wait: bool = True) -> None:
        """Stop the thread and drop every timer; with ``wait``, until the thread has ended.
        Idempotent."""
        with self._condition:
            self._stopped = True
            self._heap.clear()
            self._lanes.clear()
            self._arrivals.clear()
            self._cancelled = 0
            self._condition.notify_all()
            thread = self._thread
        if wait and thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)

    def after_fork(self) -> None:
        """In a forked child: the parent's thread does not exist here; start afresh, empty."""
        self._setup()


def _due_time(timer: Timer) -> float:
    return timer.when
