"""A lease's life: its local timing, its state machine, the heartbeat's calls, and fork and close.

A :class:`Lease` is what a :class:`~lease_lock.Lock` (the user's handle) holds on to. It moves
through ``"unlocked" -> "held" -> ("released" | "lost")``. Its local lease starts when the
acquire or extend request *left* and ends 1% of the TTL early, so the holder believes it holds
the key for a little less than the backend does. Reading its state consults the clock: a lease
that ran out reads lost at once, whether or not the heartbeat thread has run.

The acquisition (:mod:`lease_lock._acquisition`), the heartbeat (through its ``Beating``
protocol) and the Locker drive a lease through the methods here; none of them is part of the
user's API, which is why this module is private. Re-entrant holds are more handles over one
lease: each has a :class:`Hold`, and the lease counts the holds still out, giving the key back
when the last one is released.

The user's handle, :class:`Lock` (public as ``lease_lock.Lock``), lives here too, with the few
functions through which the Locker and a :class:`~lease_lock.LockSet` reach the lease behind a
handle (``acquire_or_raise``, ``give_up``, ``run_guarded``, ``on_loss``, ``lost_cause``): they
are the library's, not the user's.
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol, TypeVar

from .backends.base import Backend
from .backends.service import request_id_scope
from .errors import LockHeldError, LockLostError, LockStateError, LostReason
from .events import EventHook, EventType, LockEvent, emit, logger, wanted
from .heartbeat import ARRIVAL_LEAD, Heartbeat, Timer, beat_interval, clamp_to_deadline, next_beat
from .options import LockOptions, check_extend_interval, check_request_id
from .retry import Retry
from .validation import check_cancel, check_ttl, describe_token

if TYPE_CHECKING:
    from types import TracebackType

__all__ = [
    "LEASE_MARGIN", "WAIT_SLICE", "GuardedBlock", "Hold", "JoinedHandles", "Lease", "Lock", "LockHost", "LossSignal",
    "acquire_or_raise", "give_back", "give_up", "local_end", "lost_cause", "on_loss", "run_guarded", "wait_for_loss",
]

#: The longest real-time wait before the clock is read again (waits are sliced so that an
#: injected or pause-adjusted clock is honoured).
WAIT_SLICE = 1.0

#: The local lease ends this fraction of the TTL early, to absorb clock rate differences.
LEASE_MARGIN = 0.01


def local_end(sent: float, requested: float, received: float) -> Optional[float]:
    """The local end of a lease of ``requested`` seconds asked for by a request that left at
    ``sent``, or ``None`` when its answer (at ``received``) came back too late to rely on."""
    end = sent + requested * (1 - LEASE_MARGIN)
    return end if received < end else None


def give_back(backend: Backend, key: str, token: str) -> None:
    """Return a lease nobody can rely on (a late or unwanted grant); best effort: a lease that
    cannot be given back runs out on its own."""
    try:
        backend.release(key, token)
    except Exception:  # noqa: BLE001 - the lease runs out on its own; nothing to report to
        logger.debug("giving back the lease of %r failed", key, exc_info=True)

#: The events that report how long the lock was held.
_EVENTS_WITH_HELD_FOR = frozenset({"lost", "extended", "extend_failed", "released", "release_failed"})


def wait_for_loss(
    signal: threading.Event,
    wait_flag: Callable[[float], bool],
    time_to_lapse: Callable[[], float],
    timeout: Optional[float],
) -> bool:
    """Wait until ``signal.is_set()`` (which reads the clock) or ``timeout`` real seconds pass.

    The wait on the event's own flag (``wait_flag``) is sliced to the time left before a lease
    lapses, at most :data:`WAIT_SLICE`, so a lease that simply runs out is noticed on time even
    though nothing sets the flag for it.
    """
    give_up = None if timeout is None else time.monotonic() + timeout
    while not signal.is_set():
        step = min(WAIT_SLICE, time_to_lapse())
        if give_up is not None:
            left = give_up - time.monotonic()
            if left <= 0:
                return False
            step = min(step, left)
        wait_flag(max(step, 0.001))
    return True


class LockHost(Protocol):
    """What a :class:`Lease` is served by (its Locker's acquisition): the store, the lease clock,
    the heartbeat, the event hook, and acquiring and forgetting locks."""

    @property
    def backend(self) -> Backend:
        """The store the lease lives in."""

    @property
    def clock(self) -> Callable[[], float]:
        """The lease clock (seconds)."""

    @property
    def heartbeat(self) -> Heartbeat:
        """The heartbeat that extends the lease."""

    @property
    def retry(self) -> Retry:
        """The Locker's retry policy, which a lock's own merges over."""

    @property
    def on_event(self) -> Optional[EventHook]:
        """The hook every event goes to, if any."""

    def acquire(self, lease: Lease, options: LockOptions, *, raise_on_contention: bool) -> Optional[Lease]:
        """Acquire ``lease``: the lease now held (``lease`` itself, or the one a re-entrant
        acquire joined); on contention ``None`` or ``LockHeldError``."""

    def forget(self, lease: Lease) -> None:
        """``lease`` was released or lost."""

    @property
    def holds(self) -> JoinedHandles:
        """The locks held, which also keep the handles that joined one (see :meth:`Lease.joined`)."""


class JoinedHandles(Protocol):
    """Where a handle that joined a held lease is kept (the Locker's set of held locks)."""

    def joined(self, handle: object, hold: Hold, lease: Lease) -> None:
        """``handle`` joined ``lease`` with ``hold``: give the hold back if the handle is
        collected before it lets go."""


class LossSignal(threading.Event):
    """``lock.lost``: a ``threading.Event`` set when the lease is lost.

    ``is_set()`` and ``wait()`` consult the lock's clock first, so a lease that ran out reads
    lost immediately, and ``wait(timeout)`` returns when the lease ends even if nothing else
    happens. ``set()`` and ``clear()`` belong to the library; calling them is a
    ``LockStateError``.
    """

    def __init__(self, lock: Lease) -> None:
        super().__init__()
        # A weak reference, so that the event (often kept by callers) does not keep the lock
        # alive: a garbage-collected lock must stop being extended.
        self._lock_ref = weakref.ref(lock)

    def set(self) -> None:
        """Not for callers: the library sets the signal."""
        raise LockStateError("lock.lost is set by the library; use lock.release()")

    def clear(self) -> None:
        """Not for callers: a lost lease cannot be found again."""
        raise LockStateError("lock.lost cannot be cleared; acquire a new lock")

    def _fire(self) -> None:
        super().set()

    def is_set(self) -> bool:
        """``True`` once the lease is lost (read against the clock now)."""
        lock = self._lock_ref()
        if lock is not None:
            lock._refresh()
        return super().is_set()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block until the lease is lost or ``timeout`` real seconds pass; ``True`` if lost."""
        return wait_for_loss(self, super().wait, self._time_to_lapse, timeout)

    def _time_to_lapse(self) -> float:
        lock = self._lock_ref()
        return math.inf if lock is None else lock._time_to_lapse()


class Hold:
    """One handle's share of a lease: whether that handle has let go of it.

    Every :class:`Lease` is one: the hold of the handle it was made for. A handle that joined
    another lease (a re-entrant acquire) keeps its own, never granted, lease as its hold, so no
    handle needs an object of its own for it.
    """

    # A class-level default, written on the instance only when the handle lets go.
    let_go = False
    #: The Locker method that made the handle (``"acquire"``, ``"try_acquire"``, ...): what the
    #: warning for a handle dropped while held names.
    made_by: str


class Lease(Hold):
    """One lease on one key, as the library drives it (see the module docstring); thread-safe."""

    # Every field that starts the same for each lease is a class attribute, written on the
    # instance only when it changes: most leases are made, held once and released, and
    # setting twenty fields in __init__ was a sixth of such a cycle (benchmarks.instructions).
    fence: Optional[int] = None
    # Built on first use: most locks are released without anyone looking at the signal, and
    # an Event costs a Condition and two locks.
    _lost_signal: Optional[LossSignal] = None
    _state = "unlocked"
    _busy_acquiring = False
    _lost_reason: Optional[LostReason] = None
    _lost_cause: Optional[BaseException] = None
    _acquired_at: Optional[float] = None
    _ended_at: Optional[float] = None
    _lease_end = -math.inf
    _deadline = math.inf
    _clamped = False
    #: A key handed over by a release, for a claim window that no extension has lengthened yet.
    _claimed = False
    _next_beat = math.inf
    _in_flight = 0
    _extend_error: Optional[BaseException] = None
    _timer: Optional[Timer] = None
    _releasing = False
    _thread: Optional[threading.Thread] = None
    #: Called (outside the mutex) when the lock is lost; a LockSet listens here. Made on first
    #: use: most locks have no listener.
    _loss_listeners: Optional[list[Callable[[], None]]] = None
    _given_back = False
    #: How many handles hold this lease: one from the grant, one more for each re-entrant
    #: acquire that joined it, one less for each that let go.
    _holds = 0

    def __init__(
        self, host: LockHost, key: str, ttl: float, options: LockOptions, token: str, owner: object = None,
        made_by: str = "lock",
    ) -> None:
        self._host = host
        self.made_by = made_by
        # The Locker that made this lock: kept alive while the lock lives, so that dropping the
        # Locker while holding one of its locks does not stop their heartbeat.
        self._locker = owner
        self.key = key
        self.token = token
        #: The latest TTL asked for, in seconds (a plain field: the acquisition reads it on
        #: every attempt).
        self.ttl = ttl
        self._options = options
        # Not re-entrant: nothing that runs under it (the clock, the heartbeat's bookkeeping)
        # comes back to this lock, and hooks and listeners run outside it.
        self._mutex = threading.Lock()

    # -- reading -------------------------------------------------------------------------------

    @property
    def lost(self) -> LossSignal:
        """A ``threading.Event`` set when the lease is lost (see :class:`LossSignal`)."""
        signal = self._lost_signal
        if signal is None:
            with self._mutex:
                signal = self._lost_signal
                if signal is None:
                    signal = self._lost_signal = LossSignal(self)
                    if self._state == "lost":
                        signal._fire()
        return signal

    @property
    def options(self) -> LockOptions:
        """The options the lease was made with."""
        return self._options

    @property
    def retry(self) -> Retry:
        """The merged retry policy (see :attr:`lease_lock.Lock.retry`)."""
        return self._host.retry.merged(self._options.retry)

    @property
    def lost_cause(self) -> Optional[BaseException]:
        """The error behind a loss (a failed extension's), or ``None``."""
        return self._lost_cause

    def on_loss(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` (outside the mutex) when the lease is lost."""
        with self._mutex:
            if self._loss_listeners is None:
                self._loss_listeners = []
            self._loss_listeners.append(listener)

    @property
    def state(self) -> str:
        """``"unlocked"``, ``"held"``, ``"lost"`` or ``"released"``, as of now."""
        self._refresh()
        return self._state

    @property
    def lost_reason(self) -> Optional[LostReason]:
        """Why the lease was lost, or ``None``."""
        self._refresh()
        return self._lost_reason

    @property
    def held_for(self) -> float:
        """Seconds since the acquisition; stops counting at loss or release."""
        self._refresh()
        if self._acquired_at is None:
            return 0.0
        end = self._ended_at if self._ended_at is not None else self._host.clock()
        return max(0.0, end - self._acquired_at)

    @property
    def expires_in(self) -> float:
        """Seconds left of the local lease (0 when not held)."""
        self._refresh()
        if self._state != "held":
            return 0.0
        return max(0.0, self._lease_end - self._host.clock())

    @property
    def holds(self) -> int:
        """How many holds share this lease (0 when not held)."""
        if self.state != "held":
            return 0
        return self._holds

    @property
    def thread(self) -> Optional[threading.Thread]:
        """The thread that was granted this lease (``None`` before the grant)."""
        return self._thread

    def __repr__(self) -> str:
        return f"<Lock key={self.key!r} state={self.state} token={describe_token(self.token)}>"

    # -- internal timing -----------------------------------------------------------------------

    def _time_to_lapse(self) -> float:
        if self._state != "held":
            return math.inf
        return max(0.0, self._lease_end - self._host.clock())

    def _lapse_reason(self) -> tuple[LostReason, Optional[BaseException]]:
        if self._in_flight:
            return "late-extend", None
        if self._extend_error is not None:
            return "extend-failed", self._extend_error
        if self._clamped:
            return "max-hold", None
        return "expired", None

    def _refresh(self) -> None:
        """Mark the lock lost if its local lease has run out."""
        if self._state == "held" and self._host.clock() >= self._lease_end:
            # Decided again under the mutex: an extension answered in between moved the end.
            self._mark_lost(None, lapsed=True)

    def _mark_lost(
        self,
        reason: Optional[LostReason],
        cause: Optional[BaseException] = None,
        *,
        at: Optional[float] = None,
        notify: bool = True,
        lapsed: bool = False,
    ) -> bool:
        """End the lock as lost; with ``lapsed``, only if its local lease has run out, with the
        reason that explains the lapse. Reports the loss once."""
        with self._mutex:
            if self._state != "held":
                return False
            if lapsed:
                if self._host.clock() < self._lease_end:
                    return False
                reason, cause = self._lapse_reason()
                at = self._lease_end
            assert reason is not None
            self._state = "lost"
            self._lost_reason = reason
            self._lost_cause = cause
            self._ended_at = at if at is not None else self._host.clock()
            self._cancel_timer()
            signal = self._lost_signal
            listeners = list(self._loss_listeners or ())
        # A lost lock has no lease to give back when it is dropped (see HeldLeases).
        self._host.forget(self)
        if signal is not None:
            signal._fire()
        for listener in listeners:
            listener()
        if notify:
            self._emit("lost", reason=reason, error=cause)
        return True

    def _emit(self, event_type: EventType, **fields: Any) -> None:
        hook = self._host.on_event
        if wanted(hook, event_type):
            if event_type in _EVENTS_WITH_HELD_FOR:
                # Read only for events someone receives: it costs a clock reading.
                fields["held_for"] = self.held_for
            emit(hook, LockEvent(type=event_type, key=self.key, ttl=self.ttl, **fields))

    def _interval(self) -> float:
        return beat_interval(self.ttl, self._options.extend_interval)

    def _extending(self) -> bool:
        """Whether the heartbeat extends this lease again (see :func:`lease_lock.heartbeat.next_beat`):
        always while a handed-over claim waits to become a full lease."""
        return (self._options.auto_extend and not self._clamped) or self._claimed

    # -- acquisition (driven by the Locker) ----------------------------------------------------

    def start_acquiring(self) -> None:
        """Library side (the acquisition calls it): mark the lock as being acquired, refusing a
        lock that was held once or that another thread is acquiring."""
        # The mutex of a lock cycle's own steps is taken with acquire() and release(): a with
        # statement costs twice as much (about 1,100 instructions more, benchmarks.instructions).
        mutex = self._mutex
        mutex.acquire()
        try:
            if self._state != "unlocked":
                raise LockStateError(f"lock {self.key!r} was already acquired once ({self._state}); create a new lock")
            if self._busy_acquiring:
                raise LockStateError(f"lock {self.key!r} is being acquired by another thread")
            self._busy_acquiring = True
        finally:
            mutex.release()

    def join(self) -> bool:
        """One more hold of this lease (a re-entrant acquire by the thread holding it);
        ``False`` when it stopped being held meanwhile."""
        self._refresh()
        with self._mutex:
            if self._state != "held" or self._releasing:
                return False
            self._holds += 1
        return True

    def joined(self, handle: object, hold: Hold) -> None:
        """Library side: ``handle`` (a :class:`~lease_lock.Lock`) joined this lease with ``hold``;
        collected before ``hold`` lets go, it is given back like a dropped lock (the library
        thread lets go of its hold)."""
        self._host.holds.joined(handle, hold, self)

    def stop_acquiring(self) -> None:
        """Library side: the acquisition this lock was in has ended, granted or not."""
        # A plain store, no mutex: only the acquiring thread writes while the flag is set, and
        # a thread reading it under the mutex sees either value of a finished acquisition.
        self._busy_acquiring = False

    def hold_granted(
        self, sent: float, end: float, requested: float, fence: Optional[int], max_hold: Optional[float]
    ) -> None:
        """Library side (the acquisition calls it): record a grant of ``requested`` seconds whose
        request left at ``sent`` and whose local lease ends at ``end`` (see
        :func:`local_end`)."""
        thread = threading.current_thread()
        options = self._options
        interval = beat_interval(self.ttl, options.extend_interval)
        mutex = self._mutex
        mutex.acquire()  # not a with statement: see start_acquiring
        try:
            self._state = "held"
            self._holds = 1
            self._busy_acquiring = False
            self._thread = thread
            self._acquired_at = sent
            if max_hold is not None:
                self._deadline = sent + max_hold
            self._lease_end = end
            self.fence = fence
            # _extending(), read here from what this grant sets.
            self._clamped = clamped = requested < self.ttl
            extend = options.auto_extend and not clamped
            self._next_beat = next_beat("granted", sent, interval, extending=extend)
            if (interval if extend else end - sent) >= ARRIVAL_LEAD:
                # Most locks are released long before their first timer: the heartbeat sets
                # it only if this one is still held when its thread next wakes.
                self._host.heartbeat.arrive(self)
            else:
                self._arm(interval)
        finally:
            mutex.release()

    def hold_claimed(
        self, sent: float, end: float, requested: float, fence: Optional[int], max_hold: Optional[float],
        claim: float,
    ) -> None:
        """Library side: record a key that a release handed over for a claim window of ``claim``
        seconds, judged from ``sent`` (the waiter's latest request before the grant) to end
        locally at ``end``. The heartbeat turns the claim into a full lease of ``requested``
        seconds early in the window, whatever ``auto_extend`` says (see the ``"claimed"`` step
        of :func:`lease_lock.heartbeat.next_beat`); a lock that is not auto-extended is extended
        that once only."""
        self.hold_granted(sent, end, requested, fence, max_hold)
        interval = min(beat_interval(claim, None), self._interval())
        with self._mutex:
            if self._state != "held":
                return
            self._claimed = True
            self._next_beat = next_beat("claimed", sent, interval, extending=True)
            if self._timer is not None or interval < ARRIVAL_LEAD:
                # Too soon for the arrivals queue, or a timer set for the full lease's plan.
                self._arm(interval)

    def _schedule(self) -> None:
        """(Re)arm this lock's one heartbeat timer: the next extension or the lease's end."""
        with self._mutex:
            if self._state != "held":
                return
            self._arm(self._interval())

    def _arm(self, interval: float) -> None:
        """Set the one timer: the next extension, or a check that the lease ran out (which
        reports the loss when nobody reads the lock). Called with the mutex held.

        The timer's lane is the delay it is set for, so that the timers of one locker's locks
        queue in the order they fall due (see :mod:`lease_lock.heartbeat`). ``interval`` is the
        lock's extension interval (see _interval)."""
        self._cancel_timer()
        if self._next_beat <= self._lease_end:
            self._timer = self._host.heartbeat.schedule(self, self._next_beat, interval)
        else:
            self._timer = self._host.heartbeat.schedule(self, self._lease_end, self.ttl)

    def _cancel_timer(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            self._host.heartbeat.cancel(timer)

    # -- heartbeat side ------------------------------------------------------------------------

    def heartbeat_due(self, now: float, timer: Timer) -> Optional[float]:
        """Library side (the heartbeat calls it when this lock's timer fires): the TTL to ask for,
        or ``None`` when no extension is due (the lock lapsed, or the timer was only a check)."""
        with self._mutex:
            if timer is not self._timer or self._state != "held":
                return None
        self._refresh()
        with self._mutex:
            if self._state != "held":
                return None
            if now < self._next_beat:
                self._arm(self._interval())
                return None
            requested = clamp_to_deadline(self.ttl, self._deadline, now)
            if requested > 0:
                self._in_flight += 1
                return requested
        # Hooks run outside the mutex so that an on_event hook reading the lock cannot stall
        # other threads.
        self._mark_lost("max-hold")
        return None

    def heartbeat_arrived(self) -> None:
        """Library side (the heartbeat calls it for a lock granted without a timer): set the
        timer if the lock is still held and has none yet."""
        with self._mutex:
            if self._state == "held" and self._timer is None:
                self._arm(self._interval())

    def heartbeat_sending(self, requested: float, sent: float) -> Optional[float]:
        """Library side: clamp a planned extension to the max-hold deadline as it leaves at ``sent``.

        Returns ``None`` (the lock then reads lost, ``"max-hold"``) when no time is left. Planned
        requests can wait behind others, so the clamp is applied at sending, not at planning.
        """
        clamped = clamp_to_deadline(requested, self._deadline, sent)
        if clamped > 0:
            return clamped
        with self._mutex:
            self._in_flight -= 1
        self._mark_lost("max-hold")
        return None

    def heartbeat_answered(self, sent: float, received: float, requested: float, granted: bool) -> bool:
        """Library side: apply an extension's answer (request left at ``sent``, answer at ``received``);
        returns ``True`` if the lock is still held after it."""
        with self._mutex:
            self._in_flight -= 1
            if self._state != "held":
                # Lapsed (or closed) while the request was in flight: a grant came too late.
                outcome = "late" if granted else "ended"
            elif received >= self._lease_end or (end := local_end(sent, requested, received)) is None:
                outcome = "late"
            elif not granted:
                outcome = "not-ours"
            else:
                outcome = "extended"
                self._lease_end = end
                self._clamped = requested < self.ttl
                self._claimed = False
                self._extend_error = None
                self._next_beat = next_beat("extended", sent, self._interval(), extending=self._extending())
        if outcome == "extended":
            self._emit("extended")
            self._schedule()
            return True
        if outcome == "late":
            self._mark_lost("late-extend")
            if granted:
                give_back(self._host.backend, self.key, self.token)
        elif outcome == "not-ours":
            self._mark_lost("extend")
        return False

    def heartbeat_failed(self, error: BaseException) -> None:
        """Library side: an extension raised; keep the lock (its confirmed lease still runs) and
        retry soon."""
        with self._mutex:
            self._in_flight -= 1
            if self._state != "held":
                return
            self._extend_error = error
            if self._next_beat != math.inf:
                self._next_beat = next_beat("failed", self._host.clock(), self._interval(), extending=self._extending())
        self._emit("extend_failed", error=error)
        self._schedule()

    # -- public API ----------------------------------------------------------------------------

    def acquire(self, options: LockOptions, *, raise_on_contention: bool) -> Optional[Lease]:
        """Acquire with ``options``: the lease now held (this one, or the one a re-entrant
        acquire joined); on contention ``None`` or, with ``raise_on_contention``, ``LockHeldError``."""
        return self._host.acquire(self, options, raise_on_contention=raise_on_contention)

    def release(self, hold: Hold, request_id: Optional[str] = None) -> bool:
        """``hold`` lets go; the last hold out gives the key back. ``True`` when that deleted our
        key (see :meth:`lease_lock.Lock.release` for every answer). A driver error propagates
        and leaves the lease and the hold as they were (the heartbeat keeps the lease alive)."""
        if request_id is not None:
            check_request_id(request_id)
        host = self._host
        # One clock reading serves the lapse check and, when the key is deleted, the end of the
        # hold (the moment the release request left).
        now = host.clock()
        if self._state == "held" and now >= self._lease_end:
            self._mark_lost(None, lapsed=True)
        mutex = self._mutex
        mutex.acquire()  # not a with statement: see start_acquiring
        try:
            state = self._state
            # The usual case, a lease held by this one hold, goes straight to the store.
            if state != "held" or self._holds != 1 or self._releasing or hold.let_go:
                settled = self._let_go_without_store(hold, state)
                if settled is not None:
                    return settled
            self._releasing = True
        finally:
            mutex.release()
        try:
            if request_id is None:
                deleted = host.backend.release(self.key, self.token)
            else:
                with request_id_scope(host.backend, request_id):
                    deleted = host.backend.release(self.key, self.token)
            mutex.acquire()
            try:
                self._given_back = True
                hold.let_go = True
                self._holds = 0
                # A lost lease (or one that lapsed while the release was in flight: that end was
                # reported already) is no release to report, though a key we deleted was ours.
                ended_here = deleted and self._state == "held"
                if ended_here:
                    self._state = "released"
                    self._ended_at = now
                    if self._timer is not None:
                        self._cancel_timer()
            finally:
                mutex.release()
        finally:
            # A plain store: this thread alone set the flag, and every reader takes the mutex
            # and finds the lock's state decided by now.
            self._releasing = False
        if ended_here:
            host.forget(self)
            # Checked here too, as for "acquired": a release nobody listens to costs no _emit call.
            if wanted(host.on_event, "released"):
                self._emit("released")
            return True
        if state == "lost":
            return False
        if not deleted:
            self._mark_lost("release")
            return False
        return True

    def _let_go_without_store(self, hold: Hold, state: str) -> Optional[bool]:
        """A release that needs no request of its own, decided under the mutex: its answer, or
        ``None`` when the key is to be given back (a lost lease still gives back a key our
        token holds)."""
        if state == "unlocked":
            raise LockStateError(f"lock {self.key!r} was never acquired")
        if hold.let_go:
            return False
        if self._holds > 1:
            # Other holds remain: this one lets go and the lease stays theirs. Decided under the
            # same mutex that marks a release in flight, which a joining acquire checks.
            hold.let_go = True
            self._holds -= 1
            return state == "held"
        if state == "released" or self._given_back or self._releasing or self._lost_reason == "forked":
            # Another thread's release (or close) is in flight: that one answers.
            return False
        return None

    def extend(
        self,
        ttl: Optional[float] = None,
        *,
        cancel: Optional[threading.Event] = None,
        request_id: Optional[str] = None,
    ) -> None:
        """What :meth:`lease_lock.Lock.extend` does, for this lease."""
        cancel = check_cancel(cancel)
        if request_id is not None:
            check_request_id(request_id)
        new_ttl = self.ttl if ttl is None else check_ttl(ttl)
        check_extend_interval(self._options.extend_interval, new_ttl)
        self.check()
        started = self._host.clock()
        if cancel is not None and cancel.is_set():
            raise self._renewal_cancelled(0, started)
        with self._mutex:
            requested = clamp_to_deadline(new_ttl, self._deadline, self._host.clock())
            if requested > 0:
                self._in_flight += 1
                if cancel is None:
                    self.ttl = new_ttl
        if requested <= 0:
            self._mark_lost("max-hold")
            raise LockLostError(self.key, "max-hold")
        sent = self._host.clock()
        clamped = self.heartbeat_sending(requested, sent)
        if clamped is None:
            raise LockLostError(self.key, "max-hold")
        requested = clamped
        backend = self._host.backend
        try:
            if request_id is None:
                granted = backend.extend(self.key, self.token, requested)
            else:
                with request_id_scope(backend, request_id):
                    granted = backend.extend(self.key, self.token, requested)
        except Exception as error:
            if cancel is not None and cancel.is_set():
                self._keep_lease(sent, requested, granted=False)
                raise self._renewal_cancelled(1, started) from error
            self.heartbeat_failed(error)
            raise
        received = self._host.clock()
        if cancel is not None:
            if cancel.is_set():
                self._keep_lease(sent, requested, granted=granted, received=received)
                raise self._renewal_cancelled(1, started)
            with self._mutex:
                self.ttl = new_ttl
        if not self.heartbeat_answered(sent, received, requested, granted):
            raise LockLostError(self.key, self._lost_reason or "extend") from self._lost_cause

    def _renewal_cancelled(self, attempts: int, started: float) -> LockHeldError:
        return LockHeldError(
            self.key,
            attempts=attempts,
            elapsed=self._host.clock() - started,
            reason="cancelled",
            holder="was not extended: the renewal was cancelled and the lease is as it was",
        )

    def _keep_lease(self, sent: float, requested: float, *, granted: bool, received: float = math.inf) -> None:
        """A cancelled renewal's answer is not applied; only a grant shorter than the local
        lease left moves its end (the store's lease must never end before the local one)."""
        with self._mutex:
            self._in_flight -= 1
            end = local_end(sent, requested, received) if granted else None
            shorter = self._state == "held" and end is not None and end < self._lease_end
            if shorter:
                assert end is not None
                self._lease_end = end
        if shorter:
            self._schedule()

    def is_held(self) -> bool:
        """What :meth:`lease_lock.Lock.is_held` does, for this lease."""
        self._refresh()
        if self._state != "held":
            return False
        if self._host.backend.is_held(self.key, self.token):
            self._refresh()
            return self._state == "held"
        self._mark_lost("observed")
        return False

    def check(self, verify: bool = False) -> None:
        """What :meth:`lease_lock.Lock.check` does, for this lease."""
        self._refresh()
        if self._state == "lost":
            raise LockLostError(self.key, self._lost_reason or "expired") from self._lost_cause
        if self._state != "held":
            raise LockStateError(f"lock {self.key!r} is {self._state}, not held")
        if verify and not self.is_held():
            # is_held() marked the lock lost (or its lease lapsed during the round trip).
            raise LockLostError(self.key, self._lost_reason or "observed") from self._lost_cause

    # -- context manager and outcome order -----------------------------------------------------

    def enter(self) -> Lease:
        """Enter a ``with`` block: acquire a fresh lease (raising on contention), or go on with
        one already held; the lease now held."""
        # A fresh lease (the usual case) has no end to check against the clock.
        if self._state == "unlocked":
            lease = self._host.acquire(self, self._options, raise_on_contention=True)
            assert lease is not None
            return lease
        state = self.state
        if state != "held":
            raise LockStateError(f"cannot enter lock {self.key!r}: it is {state}")
        return self

    def finish(self, hold: Hold, block_raised: bool, result: Any = None) -> None:
        """Leave a protected block through ``hold``: the block's own exception first, then a
        loss, then a failed release (reported as a ``release_failed`` event, never raised over
        the block's outcome: the heartbeat stops and the key runs out on its own)."""
        try:
            self.release(hold)
        except Exception as error:  # noqa: BLE001 - a failed release here is reported as an event, never raised over the block's own outcome
            self._stop_heartbeat()
            self._emit("release_failed", error=error)
        if block_raised:
            return
        # A release that found the key not ours marked the lease lost; a lock the block released
        # itself reads "released" and is no loss, although the release on exit answers False.
        if self._state == "lost":
            raise LockLostError(
                self.key, self._lost_reason or "release", completed=True, result=result
            ) from self._lost_cause

    def _stop_heartbeat(self) -> None:
        """No more extensions; the lapse timer stays, so the end is still reported."""
        with self._mutex:
            self._next_beat = math.inf
        self._schedule()

    # -- lifecycle hooks -----------------------------------------------------------------------

    def after_fork(self) -> None:
        """Library side (the Locker calls it in a forked child): this copy must never extend or
        release the parent's lease."""
        self._mutex = threading.Lock()
        # The timer sits in the parent's heap, which the child's heartbeat has dropped. Cancelling
        # it would take the parent's heartbeat lock, which a parent thread may have held at the
        # fork and will never release here.
        self._timer = None
        if self._state == "held":
            self._mark_lost("forked", notify=False)

    def locker_closed(self) -> None:
        """Library side: the Locker is closing; give the key back and read lost (``"closed"``)."""
        self._refresh()
        with self._mutex:
            if self._state != "held" or self._releasing:
                return
            self._releasing = True
        try:
            self._host.backend.release(self.key, self.token)
        except Exception:  # noqa: BLE001 - closing must reach every lock; the lease runs out
            logger.warning("releasing %r while closing failed", self.key, exc_info=True)
        self._given_back = True
        self._mark_lost("closed")


_Result = TypeVar("_Result")


class GuardedBlock:
    """Leaving a protected block, the same way for a ``with`` statement and a wrapped call.

    Subclasses implement ``_finish``, which applies the outcome order: the block's own
    exception first, then a loss, then a failed release.
    """

    __slots__ = ()

    def _finish(self, *, block_raised: bool, result: Any) -> None:
        raise NotImplementedError

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        self._finish(block_raised=exc is not None, result=None)

    def _run(self, function: Callable[..., _Result], *args: Any, **kwargs: Any) -> _Result:
        """Run ``function`` under the held lock(s) with the ``with`` outcome order."""
        try:
            result = function(*args, **kwargs)
        except BaseException:
            self._finish(block_raised=True, result=None)
            raise
        self._finish(block_raised=False, result=result)
        return result


def run_guarded(block: GuardedBlock, function: Callable[..., _Result], *args: Any, **kwargs: Any) -> _Result:
    """Run ``function`` under the already held ``block`` and leave it with the ``with`` outcome
    order (a loss after a completed call carries the call's result)."""
    return block._run(function, *args, **kwargs)


def acquire_or_raise(lock: Lock, options: LockOptions) -> None:
    """Acquire ``lock`` with ``options`` (the Locker's own acquire forms pass theirs), raising
    ``LockHeldError`` on contention."""
    lease = lock._lease.acquire(options, raise_on_contention=True)
    assert lease is not None
    if lease is not lock._lease:
        lock._joined(lease)


def give_up(block: GuardedBlock) -> None:
    """Leave ``block`` as after an error: release it (a half-acquired set, or a block that
    raised); a failed release becomes a ``release_failed`` event and the key runs out."""
    block._finish(block_raised=True, result=None)


def on_loss(lock: Lock, listener: Callable[[], None]) -> None:
    """Call ``listener()`` (on the thread that finds the loss, outside the lease's mutex) when
    the lease ``lock`` holds is lost; a :class:`~lease_lock.LockSet` listens to its members so."""
    lock._lease.on_loss(listener)


def lost_cause(lock: Lock) -> Optional[BaseException]:
    """The error behind ``lock``'s loss (a failed extension's), or ``None``."""
    return lock._lease.lost_cause


class Lock(GuardedBlock):
    """A lease on one key. Created unacquired by ``Locker.lock()``; ``with`` acquires it.

    Its public names are the whole of it: ``key`` (prefix included), ``token``, ``fence``
    (``int`` or ``None``), the read-only state (``ttl``, ``state``, ``lost``, ``lost_reason``,
    ``held_for``, ``expires_in``, ``holds``, ``thread``, ``retry``), ``acquire``, ``release``,
    ``extend``, ``check``, ``is_held`` and ``with``. The error behind a loss is the
    ``__cause__`` of the ``LockLostError`` that reports it.
    """

    __slots__ = ("__weakref__", "_hold", "_lease")

    def __init__(
        self, host: LockHost, key: str, ttl: float, options: LockOptions, token: str, owner: object = None,
        made_by: str = "lock",
    ) -> None:
        # The lease made for this handle is its hold too, also after a re-entrant acquire has
        # joined it to another lease (see Hold).
        self._lease = self._hold = Lease(host, key, ttl, options, token, owner, made_by)

    # -- reading -------------------------------------------------------------------------------

    @property
    def key(self) -> str:
        """The key, prefix included."""
        return self._lease.key

    @property
    def token(self) -> str:
        """The random token that holds the key for this lease."""
        return self._lease.token

    @property
    def fence(self) -> Optional[int]:
        """The fencing token of the grant (``None`` before it, or without fencing)."""
        return self._lease.fence

    @property
    def lost(self) -> LossSignal:
        """A ``threading.Event`` set when the lease is lost (see :class:`LossSignal`)."""
        return self._lease.lost

    @property
    def retry(self) -> Retry:
        """The retry policy an acquisition of this lock follows: the lock's own ``retry`` (and
        ``timeout``) merged field by field over the Locker's policy. ``acquire(blocking,
        timeout)`` arguments apply to their call only."""
        return self._lease.retry

    @property
    def ttl(self) -> float:
        """The latest TTL asked for, in seconds."""
        return self._lease.ttl

    @property
    def state(self) -> str:
        """``"unlocked"``, ``"held"``, ``"lost"`` or ``"released"``, as of now."""
        return self._lease.state

    @property
    def lost_reason(self) -> Optional[LostReason]:
        """Why the lease was lost, or ``None``."""
        return self._lease.lost_reason

    @property
    def held_for(self) -> float:
        """Seconds since the acquisition; stops counting at loss or release."""
        return self._lease.held_for

    @property
    def expires_in(self) -> float:
        """Seconds left of the local lease (0 when not held)."""
        return self._lease.expires_in

    @property
    def holds(self) -> int:
        """How many holds share this lease: 1 for a plain lock, more while re-entrant acquires
        (``reentrant=True``) of the same key by the same thread have joined it; 0 when not held."""
        return self._lease.holds

    @property
    def thread(self) -> Optional[threading.Thread]:
        """The thread that was granted this lease (``None`` before the grant). A re-entrant
        hold shares the lease, so it names the same thread."""
        return self._lease.thread

    def __repr__(self) -> str:
        return repr(self._lease)

    # -- acting --------------------------------------------------------------------------------

    def acquire(self, blocking: Optional[bool] = None, timeout: Optional[float] = None) -> bool:
        """Acquire like ``threading.Lock.acquire``: ``False`` on contention, never raises for it.

        Explicit arguments override the options given to ``lock()``. After a failed acquire the
        lock stays ``"unlocked"`` and may be tried again; a lock that has been held cannot be
        acquired again (``LockStateError``). A store that cannot be reached is no contention:
        ``BackendUnavailableError`` is raised when the last attempt could not reach it.
        """
        options = self._lease.options.with_attempt_budget(blocking, timeout)
        lease = self._lease.acquire(options, raise_on_contention=False)
        if lease is None:
            return False
        if lease is not self._lease:
            self._joined(lease)
        return True

    def _joined(self, lease: Lease) -> None:
        """Go on with ``lease``, which a re-entrant acquire joined (the usual grant is checked
        for without a call: it is the lease this handle already has)."""
        # A handle dropped without releasing must still let go of its hold.
        lease.joined(self, self._hold)
        self._lease = lease

    def release(self, *, request_id: Optional[str] = None) -> bool:
        """Give the key back. ``True`` when it deleted our key.

        ``False`` when the key was gone or another's, on a lost lock (which still gives the key
        back if our token holds it), and on every call after a successful one. A driver error
        propagates and leaves the lock as it was (the heartbeat keeps it alive).

        A lease shared by re-entrant holds is given back when the last of them releases; an
        earlier release gives up only its own hold and answers whether the lease is still held.

        ``request_id`` goes with the release request as ``acquire``'s does (the HTTP backend
        sends it as ``X-Volcano-Request-Id``; other backends accept and ignore it).
        """
        return self._lease.release(self._hold, request_id)

    def extend(
        self,
        ttl: Optional[float] = None,
        *,
        cancel: Optional[threading.Event] = None,
        request_id: Optional[str] = None,
    ) -> None:
        """Replace the lease with ``ttl`` seconds from now (default: the latest TTL).

        Clamped to the max-hold deadline. Raises ``LockStateError`` if unlocked or released,
        ``LockLostError`` if lost, not ours (``"extend"``) or answered late (``"late-extend"``;
        the late lease is given back). A driver error propagates; the lock stays held until its
        current lease runs out.

        ``cancel`` is the same kind of event ``acquire`` takes. Set before the renewal starts,
        no request is made; set while its request is on its way, the call still returns when
        the store answers (a request cannot be recalled) and the answer is not applied. Either
        way ``LockHeldError(reason="cancelled")`` is raised and the lock is left as it was:
        still held, with its TTL and heartbeat schedule (its local lease only ever becomes
        shorter, when the store granted less time than was left). ``request_id`` goes with the
        request as ``acquire``'s does.
        """
        self._lease.extend(ttl, cancel=cancel, request_id=request_id)

    def is_held(self) -> bool:
        """Ask the backend whether we still hold the key (one round trip when held).

        ``False`` marks the lock lost with reason ``"observed"``.
        """
        return self._lease.is_held()

    def check(self, verify: bool = False) -> None:
        """Raise ``LockLostError`` if lost, ``LockStateError`` if unlocked or released; local,
        unless ``verify=True`` also asks the store (one round trip).

        ``check()`` reads the local lease only: no round trip, so it sees a lease that ran out
        or a loss the heartbeat found, but not a key that was force-released or taken over
        since the last extension. ``check(verify=True)`` also asks the store whether our token
        still holds the key (one round trip, like :meth:`is_held`); when it does not, the lock
        is marked lost (reason ``"observed"``) and ``LockLostError`` is raised at once.
        """
        self._lease.check(verify)

    # -- context manager and outcome order -----------------------------------------------------

    def __enter__(self) -> Lock:
        lease = self._lease.enter()
        if lease is not self._lease:
            self._joined(lease)
        return self

    def __exit__(self, exc_type: object, exc: Optional[BaseException], traceback: object) -> None:
        # GuardedBlock's exit, one call shorter: it is how most locks are left.
        self._lease.finish(self._hold, exc is not None)

    def _finish(self, *, block_raised: bool, result: Any) -> None:
        self._lease.finish(self._hold, block_raised, result)
