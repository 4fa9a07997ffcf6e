"""The :class:`Lock` object: one lease on one key, its local timing and its loss signal.

A ``Lock`` moves through ``"unlocked" -> "held" -> ("released" | "lost")``. Its local lease
starts when the acquire or extend request *left* and ends 1% of the TTL early, so the
holder believes it holds the key for a little less than the backend does. Reading ``state``,
``lost_reason``, ``held_for``, ``expires_in`` or ``lost`` consults the clock: a lease that ran
out reads lost at once, whether or not the heartbeat thread has run.

A ``Lock`` is thread-safe and not tied to the thread that acquired it.
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
from .heartbeat import ARRIVAL_LEAD, Heartbeat, Timer
from .lease import give_back, local_end
from .options import LockOptions, check_extend_interval, check_request_id
from .retry import Retry
from .validation import check_cancel, check_ttl, describe_token

if TYPE_CHECKING:
    from types import TracebackType

__all__ = ["GuardedBlock", "Lock", "LockHost", "LossSignal", "run_guarded", "wait_for_loss"]
#: The longest real-time wait before the clock is read again (waits are sliced so that an
#: injected or pause-adjusted clock is honoured).
WAIT_SLICE = 1.0

#: The events that report how long the lock was held.
_EVENTS_WITH_HELD_FOR = frozenset({"lost", "extended", "extend_failed", "released", "release_failed"})

_Result = TypeVar("_Result")


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
    """What a :class:`Lock` is served by (its Locker's acquisition): the store, the lease clock,
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

    def acquire(self, lock: Lock, options: LockOptions, *, raise_on_contention: bool) -> bool:
        """Acquire ``lock``; on contention ``False`` or ``LockHeldError``."""

    def forget(self, lock: Lock) -> None:
        """``lock`` was released or lost."""


class LossSignal(threading.Event):
    """``lock.lost``: a ``threading.Event`` set when the lease is lost.

    ``is_set()`` and ``wait()`` consult the lock's clock first, so a lease that ran out reads
    lost immediately, and ``wait(timeout)`` returns when the lease ends even if nothing else
    happens. ``set()`` and ``clear()`` belong to the library; calling them is a
    ``LockStateError``.
    """

    def __init__(self, lock: Lock) -> None:
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


class Lock(GuardedBlock):
    """A lease on one key. Created unacquired by ``Locker.lock()``; ``with`` acquires it.

    Attributes: ``key`` (prefix included), ``token``, ``ttl`` (latest), ``fence`` (``int`` or
    ``None``), ``state``, ``lost_reason``, ``held_for``, ``expires_in``, ``lost``.
    """

    __slots__ = (
        "__weakref__",
        "_acquired_at",
        "_busy_acquiring",
        "_clamped",
        "_deadline",
        "_ended_at",
        "_extend_error",
        "_given_back",
        "_host",
        "_in_flight",
        "_joined",
        "_lease_end",
        "_let_go",
        "_locker",
        "_loss_listeners",
        "_lost_cause",
        "_lost_reason",
        "_lost_signal",
        "_mutex",
        "_next_beat",
        "_options",
        "_outer",
        "_releasing",
        "_state",
        "_thread",
        "_timer",
        "_ttl",
        "fence",
        "key",
        "token",
    )

    def __init__(
        self, host: LockHost, key: str, ttl: float, options: LockOptions, token: str, owner: object = None
    ) -> None:
        self._host = host
        # The Locker that made this lock: kept alive while the lock lives, so that dropping the
        # Locker while holding one of its locks does not stop their heartbeat.
        self._locker = owner
        self.key = key
        self.token = token
        self._ttl = ttl
        self._options = options
        self.fence: Optional[int] = None
        # Built on first use: most locks are released without anyone looking at the signal,
        # and an Event costs a Condition and two locks.
        self._lost_signal: Optional[LossSignal] = None
        # Not re-entrant: nothing that runs under it (the clock, the heartbeat's bookkeeping)
        # comes back to this lock, and hooks and listeners run outside it.
        self._mutex = threading.Lock()
        self._state = "unlocked"
        self._busy_acquiring = False
        self._lost_reason: Optional[LostReason] = None
        self._lost_cause: Optional[BaseException] = None
        self._acquired_at: Optional[float] = None
        self._ended_at: Optional[float] = None
        self._lease_end = -math.inf
        self._deadline = math.inf
        self._clamped = False
        self._next_beat = math.inf
        self._in_flight = 0
        self._extend_error: Optional[BaseException] = None
        self._timer: Optional[Timer] = None
        self._releasing = False
        self._thread: Optional[threading.Thread] = None
        #: Called (outside the mutex) when the lock is lost; a LockSet listens here. Made on
        #: first use: most locks have no listener.
        self._loss_listeners: Optional[list[Callable[[], None]]] = None
        self._given_back = False
        # Re-entrant holds (Locker._acquire_lock joins them): a joined handle points at the lock
        # whose lease it shares and reads and releases through it; that lock counts the joined
        # handles still holding and whether its own hold was given up already.
        self._outer: Optional[Lock] = None
        self._joined = 0
        self._let_go = False

    # -- reading -------------------------------------------------------------------------------

    @property
    def lost(self) -> LossSignal:
        """A ``threading.Event`` set when the lease is lost (see :class:`LossSignal`)."""
        if self._outer is not None:
            return self._outer.lost
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
        """The options this lock was made with."""
        return self._options

    @property
    def retry(self) -> Retry:
        """The retry policy an acquisition of this lock follows: the lock's own ``retry`` (and
        ``timeout``) merged field by field over the Locker's policy. ``acquire(blocking,
        timeout)`` arguments apply to their call only."""
        return self._host.retry.merged(self._options.retry)

    @property
    def lost_cause(self) -> Optional[BaseException]:
        """The error behind a loss (a failed extension's), or ``None``."""
        if self._outer is not None:
            return self._outer.lost_cause
        return self._lost_cause

    def on_loss(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` (on the thread that finds the loss, outside the lock's mutex) when
        the lease is lost; a :class:`~lease_lock.LockSet` listens to its members this way."""
        with self._mutex:
            if self._loss_listeners is None:
                self._loss_listeners = []
            self._loss_listeners.append(listener)

    @property
    def ttl(self) -> float:
        """The latest TTL asked for, in seconds."""
        return self._ttl if self._outer is None else self._outer.ttl

    @property
    def state(self) -> str:
        """``"unlocked"``, ``"held"``, ``"lost"`` or ``"released"``, as of now."""
        if self._outer is not None:
            return self._outer.state
        self._refresh()
        return self._state

    @property
    def lost_reason(self) -> Optional[LostReason]:
        """Why the lease was lost, or ``None``."""
        if self._outer is not None:
            return self._outer.lost_reason
        self._refresh()
        return self._lost_reason

    @property
    def held_for(self) -> float:
        """Seconds since the acquisition; stops counting at loss or release."""
        if self._outer is not None:
            return self._outer.held_for
        self._refresh()
        if self._acquired_at is None:
            return 0.0
        end = self._ended_at if self._ended_at is not None else self._host.clock()
        return max(0.0, end - self._acquired_at)

    @property
    def expires_in(self) -> float:
        """Seconds left of the local lease (0 when not held)."""
        if self._outer is not None:
            return self._outer.expires_in
        self._refresh()
        if self._state != "held":
            return 0.0
        return max(0.0, self._lease_end - self._host.clock())

    @property
    def holds(self) -> int:
        """How many holds share this lease: 1 for a plain lock, more while re-entrant acquires
        (``reentrant=True``) of the same key by the same thread have joined it; 0 when not held."""
        if self._outer is not None:
            return self._outer.holds
        if self.state != "held":
            return 0
        with self._mutex:
            return self._joined + (0 if self._let_go else 1)

    @property
    def thread(self) -> Optional[threading.Thread]:
        """The thread that was granted this lease (``None`` before the grant and for a hold that
        joined another's lease)."""
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
        # A lost lock has no lease to give back when it is dropped (see ThreadHolds).
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
            emit(hook, LockEvent(type=event_type, key=self.key, ttl=self._ttl, **fields))

    def _interval(self) -> float:
        return self._options.extend_interval or self._ttl / 3

    def _request_ttl(self, now: float) -> float:
        """The TTL to ask for: the lock's TTL, clamped to the time left before the max-hold deadline."""
        return min(self._ttl, self._deadline - now)

    # -- acquisition (driven by the Locker) ----------------------------------------------------

    def start_acquiring(self) -> None:
        """Library side (the acquisition calls it): mark the lock as being acquired, refusing a
        lock that was held once or that another thread is acquiring."""
        with self._mutex:
            if self._state != "unlocked":
                raise LockStateError(f"lock {self.key!r} was already acquired once ({self._state}); create a new lock")
            if self._busy_acquiring:
                raise LockStateError(f"lock {self.key!r} is being acquired by another thread")
            if self._outer is not None:
                raise LockStateError(f"lock {self.key!r} was already acquired once (re-entrant); create a new lock")
            self._busy_acquiring = True

    def join_hold(self, outer: Lock) -> bool:
        """Library side: share ``outer``'s lease as one more hold (a re-entrant acquire);
        ``False`` when ``outer`` stopped being held meanwhile."""
        outer._refresh()
        with outer._mutex:
            if outer._state != "held" or outer._releasing:
                return False
            outer._joined += 1
        self.token = outer.token
        self.fence = outer.fence
        self._outer = outer
        # Joined: the acquiring ends here (see stop_acquiring).
        self._busy_acquiring = False
        return True

    def _release_hold(self, handle: Lock, request_id: Optional[str] = None) -> bool:
        """A joined ``handle`` gives up its hold; the last hold out releases the key."""
        with self._mutex:
            if handle._let_go:
                return False
            handle._let_go = True
            self._joined -= 1
            last = self._joined == 0 and self._let_go
        if not last:
            return self.state == "held"
        try:
            return self.release(request_id=request_id)
        except BaseException:
            # The key is still ours and the heartbeat keeps it: the hold stays, to be retried.
            with self._mutex:
                handle._let_go = False
                self._joined += 1
            raise

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
        :func:`lease_lock.lease.local_end`)."""
        thread = threading.current_thread()
        with self._mutex:
            self._state = "held"
            self._busy_acquiring = False
            self._thread = thread
            self._acquired_at = sent
            self._deadline = sent + max_hold if max_hold is not None else math.inf
            self._lease_end = end
            self._clamped = requested < self._ttl
            self.fence = fence
            # A grant clamped to the deadline already ends there: an extension could only ask
            # for a sliver of time, which a normal round trip answers "late".
            extend = self._options.auto_extend and not self._clamped
            interval = self._interval()
            self._next_beat = sent + interval if extend else math.inf
            if (interval if extend else end - sent) >= ARRIVAL_LEAD:
                # Most locks are released long before their first timer: the heartbeat sets
                # it only if this one is still held when its thread next wakes.
                self._host.heartbeat.arrive(self)
            else:
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
            self._timer = self._host.heartbeat.schedule(self, self._lease_end, self._ttl)

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
            requested = self._request_ttl(now)
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
        clamped = min(requested, self._deadline - sent)
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
                self._clamped = requested < self._ttl
                self._extend_error = None
                # A clamped lease already ends at the deadline: extending again cannot help.
                extend_again = self._options.auto_extend and not self._clamped
                self._next_beat = sent + self._interval() if extend_again else math.inf
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
            if self._options.auto_extend and self._next_beat != math.inf:
                self._next_beat = self._host.clock() + self._interval() / 3
        self._emit("extend_failed", error=error)
        self._schedule()

    # -- public API ----------------------------------------------------------------------------

    def acquire(self, blocking: Optional[bool] = None, timeout: Optional[float] = None) -> bool:
        """Acquire like ``threading.Lock.acquire``: ``False`` on contention, never raises for it.

        Explicit arguments override the options given to ``lock()``. After a failed acquire the
        lock stays ``"unlocked"`` and may be tried again; a lock that has been held cannot be
        acquired again (``LockStateError``). A store that cannot be reached is no contention:
        ``BackendUnavailableError`` is raised when the last attempt could not reach it.
        """
        options = self._options.with_attempt_budget(blocking, timeout)
        return self._host.acquire(self, options, raise_on_contention=False)

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
        if request_id is not None:
            check_request_id(request_id)
        if self._outer is not None:
            return self._outer._release_hold(self, request_id)
        # One clock reading serves the lapse check and, when the key is deleted, the end of the
        # hold (the moment the release request left).
        now = self._host.clock()
        if self._state == "held" and now >= self._lease_end:
            self._mark_lost(None, lapsed=True)
        with self._mutex:
            state = self._state
            if state == "unlocked":
                raise LockStateError(f"lock {self.key!r} was never acquired")
            if self._joined:
                # Joined holds remain: this one lets go (once) and the lease stays theirs.
                # Decided under the same mutex that marks a release in flight, which a joining
                # acquire checks.
                if self._let_go:
                    return False
                self._let_go = True
                return state == "held"
            if state == "released" or self._given_back or self._releasing or self._lost_reason == "forked":
                # Another thread's release (or close) is in flight: that one answers.
                return False
            self._releasing = True
        try:
            if state == "lost":
                self._ask_release(request_id)
                self._given_back = True
                return False
            if not self._ask_release(request_id):
                self._given_back = True
                self._mark_lost("release")
                return False
            with self._mutex:
                self._given_back = True
                if self._state != "held":
                    # The local lease lapsed while the release was in flight: that end was
                    # reported already, but the key we deleted was ours.
                    return True
                self._state = "released"
                self._ended_at = now
                self._cancel_timer()
        finally:
            # A plain store: this thread alone set the flag, and every reader takes the mutex
            # and finds the lock's state decided by now.
            self._releasing = False
        self._host.forget(self)
        # Checked here too, as for "acquired": a release nobody listens to costs no _emit call.
        if wanted(self._host.on_event, "released"):
            self._emit("released")
        return True

    def _ask_release(self, request_id: Optional[str]) -> bool:
        backend = self._host.backend
        if request_id is None:
            return backend.release(self.key, self.token)
        with request_id_scope(backend, request_id):
            return backend.release(self.key, self.token)

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
        cancel = check_cancel(cancel)
        if request_id is not None:
            check_request_id(request_id)
        if self._outer is not None:
            self._outer.extend(ttl, cancel=cancel, request_id=request_id)
            return
        new_ttl = self._ttl if ttl is None else check_ttl(ttl)
        check_extend_interval(self._options.extend_interval, new_ttl)
        self.check()
        started = self._host.clock()
        if cancel is not None and cancel.is_set():
            raise self._renewal_cancelled(0, started)
        with self._mutex:
            requested = min(new_ttl, self._deadline - self._host.clock())
            if requested > 0:
                self._in_flight += 1
                if cancel is None:
                    self._ttl = new_ttl
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
                self._ttl = new_ttl
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
        """Ask the backend whether we still hold the key (one round trip when held).

        ``False`` marks the lock lost with reason ``"observed"``.
        """
        if self._outer is not None:
            return self._outer.is_held()
        self._refresh()
        if self._state != "held":
            return False
        if self._host.backend.is_held(self.key, self.token):
            self._refresh()
            return self._state == "held"
        self._mark_lost("observed")
        return False

    def check(self, verify: bool = False) -> None:
        """Raise ``LockLostError`` if lost, ``LockStateError`` if unlocked or released; local,
        unless ``verify=True`` also asks the store (one round trip).

        ``check()`` reads the local lease only: no round trip, so it sees a lease that ran out
        or a loss the heartbeat found, but not a key that was force-released or taken over
        since the last extension. ``check(verify=True)`` also asks the store whether our token
        still holds the key (one round trip, like :meth:`is_held`); when it does not, the lock
        is marked lost (reason ``"observed"``) and ``LockLostError`` is raised at once.
        """
        if self._outer is not None:
            self._outer.check(verify)
            return
        self._refresh()
        if self._state == "lost":
            raise LockLostError(self.key, self._lost_reason or "expired") from self._lost_cause
        if self._state != "held":
            raise LockStateError(f"lock {self.key!r} is {self._state}, not held")
        if verify and not self.is_held():
            # is_held() marked the lock lost (or its lease lapsed during the round trip).
            raise LockLostError(self.key, self._lost_reason or "observed") from self._lost_cause

    # -- context manager and outcome order -----------------------------------------------------

    def __enter__(self) -> Lock:
        # A fresh lock (the usual case) has no lease to check against the clock.
        state = "unlocked" if self._state == "unlocked" and self._outer is None else self.state
        if state == "unlocked":
            self._host.acquire(self, self._options, raise_on_contention=True)
        elif state != "held":
            raise LockStateError(f"cannot enter lock {self.key!r}: it is {state}")
        return self

    def release_on_exit(self) -> None:
        """Release when leaving a protected block (or giving up a half-acquired set); a driver
        error becomes a ``release_failed``
        event, the heartbeat stops and the key runs out on its own."""
        self._finish(block_raised=True, result=None)

    def _finish(self, *, block_raised: bool, result: Any) -> None:
        """Leave a protected block: the block's own exception first, then a loss, then a failed
        release (which only ``release_on_exit`` does, when the block raised)."""
        try:
            self.release()
        except Exception as error:  # noqa: BLE001 - a failed release here is reported as an event, never raised over the block's own outcome
            self._stop_heartbeat()
            self._emit("release_failed", error=error)
        if block_raised:
            return
        # A release that found the key not ours marked the lock lost; a lock the block released
        # itself reads "released" and is no loss, although the release on exit answers False.
        lease = self._outer if self._outer is not None else self
        if lease._state == "lost":
            raise LockLostError(
                lease.key, lease._lost_reason or "release", completed=True, result=result
            ) from lease._lost_cause

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

