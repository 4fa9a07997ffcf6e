"""A lock's life: its local lease, its state machine, the heartbeat's calls, and fork and close.

A :class:`Lock` (public as ``lease_lock.Lock``) is one object per lock: the user's handle and the
lease it holds. It moves through ``"unlocked" -> "held" -> ("released" | "lost")``. Its local
lease starts when the acquire or extend request *left* and ends 1% of the TTL early, so the
holder believes it holds the key for a little less than the backend does. Reading its state
consults the clock: a lease that ran out reads lost at once, whether or not the heartbeat thread
has run.

One path acquires every lock: :meth:`Lock._acquire` sends the first attempt itself and holds a
grant in time at once (two clock readings, the store's call, one pass through the lock's mutex);
anything else (a busy key, an outage, a cancel event, a re-entrant join) is a branch of it, and
waiting for a busy key goes to the Locker's acquisition (:mod:`lease_lock._acquisition`), which
hands a grant back through :func:`take_grant`.

A re-entrant acquire gives a second handle over one lease: that handle's ``_outer`` is the lock
whose lease it joined, every reading and action of the handle goes to that lease, and the lease
counts the handles still holding it, giving the key back when the last one lets go.

The heartbeat drives a lease through :data:`BEATS`, and the Locker, the acquisition and a
:class:`~lease_lock.LockSet` through the functions at the end of this module (``take_grant``,
``acquire_or_raise``, ``give_up``, ``run_guarded``, ``on_loss``, ``lost_cause``,
``close_lease``, ``fork_lease``): they are the library's, not the user's.
"""

from __future__ import annotations

import functools
import math
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Callable, NoReturn, Optional, Protocol, Sequence, TypeVar, Union

from ._crowd import Crowds
from ._held import HeldEntry, HeldLeases
from .backends.base import Backend
from .backends.service import SlowDown, ask_grant, request_id_scope
from .errors import BackendUnavailableError, LockHeldError, LockLostError, LockStateError, LostReason
from .events import EVENT_TYPES, EventHook, EventType, LockEvent, emit, logger, wanted
from .heartbeat import ARRIVAL_LEAD, Beating, Heartbeat, Timer, beat_interval, clamp_to_deadline, next_beat
from .options import LockOptions, check_extend_interval, check_request_id
from .retry import Retry
from .validation import check_cancel, check_ttl, describe_token

if TYPE_CHECKING:
    from types import TracebackType

__all__ = [
    "BEATS", "LEASE_MARGIN", "WAIT_SLICE", "Answer", "FirstAttempt", "GuardedBlock", "Lock", "LockHost", "LossSignal",
    "acquire_as", "acquire_or_raise", "close_lease", "fork_lease", "give_back", "give_up", "local_end", "lost_cause",
    "on_loss", "refresh_together", "run_guarded", "states_of", "take_grant", "wait_for_loss",
]

#: The longest real-time wait before the clock is read again (waits are sliced so that an
#: injected or pause-adjusted clock is honoured).
WAIT_SLICE = 1.0

#: The local lease ends this fraction of the TTL early, to absorb clock rate differences.
LEASE_MARGIN = 0.01
_KEPT = 1 - LEASE_MARGIN

#: What one grant request got: its fence, ``None`` (held), a pause the store asked for, or the
#: outage.
Answer = Union[int, SlowDown, None, BackendUnavailableError]
#: A first attempt that was not held at once: when it left, its answer, and when that came.
FirstAttempt = tuple[float, Answer, float]


def local_end(sent: float, requested: float, received: float) -> Optional[float]:
    """The local end of a lease of ``requested`` seconds asked for by a request that left at
    ``sent``, or ``None`` when its answer (at ``received``) came back too late to rely on."""
    end = sent + requested * _KEPT
    return end if received < end else None


def give_back(backend: Backend, key: str, token: str) -> None:
    """Return a lease nobody can rely on (a late or unwanted grant); best effort: a lease that
    cannot be given back runs out on its own."""
    try:
        backend.release(key, token)
    except Exception:  # noqa: BLE001 - the lease runs out on its own; nothing to report to
        logger.debug("giving back the lease of %r failed", key, exc_info=True)


#: The log levels of the events of every lock cycle, looked up once.
_ACQUIRED_LEVEL = EVENT_TYPES["acquired"]
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


#: An acquisition's plan: the merged retry policy, the retries and the timeout of its attempt
#: loop, the hold deadline, and whether it waits in the backend's line.
Plan = tuple[Retry, float, float, Optional[float], bool]


class LockHost(Protocol):
    """What a :class:`Lock` is served by (its Locker's acquisition): the store, the lease clock,
    the heartbeat, the event hook, the settings of a grant request, the held set, and waiting
    for a busy key."""

    backend: Backend
    clock: Callable[[], float]
    #: The lease clock read without its pause check: never ahead of ``clock``.
    peek: Callable[[], float]
    heartbeat: Heartbeat
    retry: Retry
    on_event: Optional[EventHook]
    owner: str
    fencing: bool
    reentrant: bool
    #: How many leases a key admits at once unless a lock's options say otherwise.
    limit: int
    closed: bool
    holds: HeldLeases[Lock]
    #: Attempt plans by ``id`` of the options they were made for (see ``plan_for``).
    plans: dict[int, tuple[LockOptions, Plan]]
    #: The Locker's threads waiting for a key, by key: empty (false) nearly always.
    crowds: Crowds

    def check_open(self) -> None:
        """Raise ``LockStateError`` once the Locker is closed."""

    def plan_for(self, options: LockOptions) -> Plan:
        """The attempt plan of ``options`` (remembered in ``plans``)."""

    def wait_for_grant(self, lock: Lock, options: LockOptions, plan: Plan, first: Optional[FirstAttempt]) -> None:
        """Go on from the ``first`` attempt (``None``: none was sent) until a grant, held through
        :func:`take_grant`, or raise what ended the wait."""


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


class Lock(GuardedBlock):
    """A lease on one key. Created unacquired by ``Locker.lock()``; ``with`` acquires it.

    Its public names are the whole of it: ``key`` (prefix included), ``token``, ``fence``
    (``int`` or ``None``), the read-only state (``ttl``, ``limit``, ``state``, ``lost``, ``lost_reason``,
    ``held_for``, ``expires_in``, ``holds``, ``thread``, ``retry``), ``acquire``, ``release``,
    ``extend``, ``check``, ``is_held`` and ``with``. The error behind a loss is the
    ``__cause__`` of the ``LockLostError`` that reports it. Thread-safe.
    """

    # Every field that starts the same for each lock is a class attribute, written on the
    # instance only when it changes: most locks are made, held once and released, and setting
    # twenty fields in __init__ was a sixth of such a cycle (benchmarks.instructions).
    #: The lock whose lease a re-entrant acquire joined (``None``: this lock's own lease).
    _outer: Optional[Lock] = None
    #: Whether this handle has let go of its hold.
    _let_go = False
    #: This lock's entry in the Locker's held set, once granted (see HeldLeases.add).
    _held_ref: Optional[HeldEntry] = None
    _fence: Optional[int] = None
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
    #: When the next extension leaves; ``None`` until the plan after the grant (or after the
    #: latest extension, which left at ``_plan_from``) is first needed: most locks are released
    #: before it is (see _arm).
    _next_beat: Optional[float] = None
    _plan_from: Optional[float] = None
    _in_flight = 0
    _extend_error: Optional[BaseException] = None
    _timer: Optional[Timer] = None
    _releasing = False
    _thread: Optional[threading.Thread] = None
    #: Called (outside the mutex) when the lock is lost; a LockSet listens here. Made on first
    #: use: most locks have no listener.
    _loss_listeners: Optional[list[Callable[[], None]]] = None
    _given_back = False
    #: Whether the grant's ``acquired`` event reached anyone: its ``released`` event is then
    #: offered too, and only then (one logger check per cycle instead of two; both are DEBUG).
    _reported = False
    #: How many handles hold this lease while it is held: one from the grant, one more for each
    #: re-entrant acquire that joined it, one less for each that let go.
    _holds = 1

    def __init__(
        self, host: LockHost, key: str, ttl: float, options: LockOptions, token: str, owner: object = None,
        made_by: str = "lock",
    ) -> None:
        self._host = host
        #: The Locker method that made the lock: what the warning for a lock dropped while held names.
        self._made_by = made_by
        # The Locker that made this lock: kept alive while the lock lives, so that dropping the
        # Locker while holding one of its locks does not stop their heartbeat.
        self._locker = owner
        self._key = key
        self._token = token
        #: The latest TTL asked for, in seconds.
        self._ttl = ttl
        self._options = options
        # Not re-entrant: nothing that runs under it (the clock, the heartbeat's bookkeeping)
        # comes back to this lock, and hooks and listeners run outside it.
        self._mutex = threading.Lock()

    # -- reading -------------------------------------------------------------------------------

    @property
    def key(self) -> str:
        """The key, prefix included."""
        return self._key

    @property
    def token(self) -> str:
        """The random token that holds the key for this lease."""
        return (self._outer or self)._token

    @property
    def fence(self) -> Optional[int]:
        """The fencing token of the grant (``None`` before it, or without fencing)."""
        return (self._outer or self)._fence

    @property
    def lost(self) -> LossSignal:
        """A ``threading.Event`` set when the lease is lost (see :class:`LossSignal`)."""
        lease = self._outer or self
        signal = lease._lost_signal
        if signal is None:
            with lease._mutex:
                signal = lease._lost_signal
                if signal is None:
                    signal = lease._lost_signal = LossSignal(lease)
                    if lease._state == "lost":
                        signal._fire()
        return signal

    @property
    def retry(self) -> Retry:
        """The retry policy an acquisition of this lock follows: the lock's own ``retry`` (and
        ``timeout``) merged field by field over the Locker's policy. ``acquire(blocking,
        timeout)`` arguments apply to their call only."""
        lease = self._outer or self
        return lease._host.retry.merged(lease._options.retry)

    @property
    def ttl(self) -> float:
        """The latest TTL asked for, in seconds."""
        return (self._outer or self)._ttl

    @property
    def limit(self) -> int:
        """How many leases the key admits at once: 1 for an exclusive lock, N for one of the N
        places of a counting key (the lock's ``limit`` option, else its Locker's)."""
        lease = self._outer or self
        return lease._options.limit or lease._host.limit

    @property
    def state(self) -> str:
        """``"unlocked"``, ``"held"``, ``"lost"`` or ``"released"``, as of now."""
        lease = self._outer or self
        lease._refresh()
        return lease._state

    @property
    def lost_reason(self) -> Optional[LostReason]:
        """Why the lease was lost, or ``None``."""
        lease = self._outer or self
        lease._refresh()
        return lease._lost_reason

    @property
    def held_for(self) -> float:
        """Seconds since the acquisition; stops counting at loss or release."""
        lease = self._outer or self
        lease._refresh()
        if lease._acquired_at is None:
            return 0.0
        end = lease._ended_at if lease._ended_at is not None else lease._host.clock()
        return max(0.0, end - lease._acquired_at)

    @property
    def expires_in(self) -> float:
        """Seconds left of the local lease (0 when not held)."""
        lease = self._outer or self
        lease._refresh()
        if lease._state != "held":
            return 0.0
        return max(0.0, lease._lease_end - lease._host.clock())

    @property
    def holds(self) -> int:
        """How many holds share this lease: 1 for a plain lock, more while re-entrant acquires
        (``reentrant=True``) of the same key by the same thread have joined it; 0 when not held."""
        if self.state != "held":
            return 0
        return (self._outer or self)._holds

    @property
    def thread(self) -> Optional[threading.Thread]:
        """The thread that was granted this lease (``None`` before the grant). A re-entrant
        hold shares the lease, so it names the same thread."""
        return (self._outer or self)._thread

    def __repr__(self) -> str:
        lease = self._outer or self
        return f"<Lock key={lease._key!r} state={lease.state} token={describe_token(lease._token)}>"

    # -- acting --------------------------------------------------------------------------------

    def acquire(self, blocking: Optional[bool] = None, timeout: Optional[float] = None) -> bool:
        """Acquire like ``threading.Lock.acquire``: ``False`` on contention, never raises for it.

        Explicit arguments override the options given to ``lock()``. After a failed acquire the
        lock stays ``"unlocked"`` and may be tried again; a lock that has been held cannot be
        acquired again (``LockStateError``). A store that cannot be reached is no contention:
        ``BackendUnavailableError`` is raised when the last attempt could not reach it.
        """
        return self._acquire(self._options.with_attempt_budget(blocking, timeout), False)

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
        return (self._outer or self)._release(self, request_id)

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
        (self._outer or self)._extend(ttl, cancel, request_id)

    def is_held(self) -> bool:
        """Ask the backend whether we still hold the key (one round trip when held).

        ``False`` marks the lock lost with reason ``"observed"``.
        """
        return (self._outer or self)._is_held()

    def check(self, verify: bool = False) -> None:
        """Raise ``LockLostError`` if lost, ``LockStateError`` if unlocked or released; local,
        unless ``verify=True`` also asks the store (one round trip).

        ``check()`` reads the local lease only: no round trip, so it sees a lease that ran out
        or a loss the heartbeat found, but not a key that was force-released or taken over
        since the last extension. ``check(verify=True)`` also asks the store whether our token
        still holds the key (one round trip, like :meth:`is_held`); when it does not, the lock
        is marked lost (reason ``"observed"``) and ``LockLostError`` is raised at once.
        """
        (self._outer or self)._check(verify)

    # -- context manager and outcome order -----------------------------------------------------

    def __enter__(self) -> Lock:
        # A fresh lock (the usual case) has no lease end to check against the clock.
        if self._state == "unlocked" and self._outer is None:
            self._acquire(self._options, True)
            return self
        state = self.state
        if state != "held":
            raise LockStateError(f"cannot enter lock {self._key!r}: it is {state}")
        return self

    def __exit__(self, exc_type: object, exc: Optional[BaseException], traceback: object) -> None:
        # GuardedBlock's exit, one call shorter: it is how most locks are left.
        (self._outer or self)._leave(self, exc is not None, None)

    def _finish(self, *, block_raised: bool, result: Any) -> None:
        (self._outer or self)._leave(self, block_raised, result)

    # -- acquiring -----------------------------------------------------------------------------

    def _acquire(self, options: LockOptions, raise_on_contention: bool, timeout: Optional[float] = None) -> bool:
        """Acquire with ``options``: ``True`` once held (or joined to the calling thread's hold
        of the key); on contention ``False`` or, with ``raise_on_contention``, ``LockHeldError``.
        ``timeout`` cuts a blocking wait to the seconds a caller has left (a set's later keys).

        The first attempt is sent here, before any of the waiting is set up: most acquisitions
        are granted at once, and every other answer is judged by the acquisition exactly as if
        it had sent that attempt itself."""
        host = self._host
        if host.closed:
            host.check_open()
        # The mutex of a lock cycle's own steps is taken with acquire() and release(): a with
        # statement costs twice as much (benchmarks.instructions).
        mutex = self._mutex
        mutex.acquire()
        if self._state == "unlocked" and not self._busy_acquiring and self._outer is None:
            self._busy_acquiring = True
            mutex.release()
        else:
            mutex.release()
            self._refuse_acquiring()
        try:
            reentrant = options.reentrant
            if reentrant is None:
                reentrant = host.reentrant
            if reentrant and self._join_held():
                return True
            cached = host.plans.get(id(options))
            plan = cached[1] if cached is not None and cached[0] is options else host.plan_for(options)
            if timeout is not None and options.blocking:
                plan = (plan[0], plan[1], min(plan[2], timeout), plan[3], plan[4])
            first: Optional[FirstAttempt] = None
            # While threads of this Locker wait for a key (rarely), the acquisition sees first
            # whether this one queues behind them (see lease_lock._crowd).
            if options.cancel is None and not host.crowds:
                max_hold = plan[3]
                requested = self._ttl
                if max_hold is not None and max_hold < requested:
                    requested = max_hold
                # The send needs no pause check of its own: the reading at the answer finds a
                # pause of the round trip (or before it), which only makes the grant look later.
                limit = options.limit or host.limit
                sent = host.peek()
                answer: Answer
                try:
                    answer = ask_grant(
                        host.backend, self._key, self._token, requested, host.owner, host.fencing,
                        options.request_id, None, limit,
                    )
                except BackendUnavailableError as error:
                    answer = error
                received = host.clock()
                if type(answer) is int and not host.closed:
                    end = sent + requested * _KEPT
                    if received < end:
                        # A counting lease always carries its fence: it tells its holders apart.
                        take_grant(
                            self, sent, end, requested, answer if host.fencing or limit > 1 else None, max_hold,
                            received - sent, 1,
                        )
                        return True
                first = (sent, answer, received)
                # See Acquisition.attempt: no reference cycle through an outage's error.
                del answer
            host.wait_for_grant(self, options, plan, first)
            del first
        except LockHeldError as error:
            return self._refused(error, raise_on_contention)
        except BaseException:
            # A grant (in its pass through the lock's mutex) ended the acquiring already;
            # every other way out ends it here.
            self._busy_acquiring = False
            raise
        return True

    def _refused(self, error: LockHeldError, raise_on_contention: bool) -> bool:
        """End an acquisition that ``error`` refused: ``False``, or the error (made clearer
        when the calling thread itself holds the key)."""
        self._busy_acquiring = False
        if not raise_on_contention:
            return False
        explained = self._host.holds.explain(self._key, error)
        if explained is error:
            raise error
        raise explained from None

    def _refuse_acquiring(self) -> NoReturn:
        """Raise why this lock cannot be acquired now (held once, or another thread acquires it)."""
        if self._state != "unlocked" or self._outer is not None:
            raise LockStateError(f"lock {self._key!r} was already acquired once ({self.state}); create a new lock")
        raise LockStateError(f"lock {self._key!r} is being acquired by another thread")

    def _join_held(self) -> bool:
        """Join the lease the calling thread holds on this key through this Locker (a
        re-entrant acquire); ``False`` when it holds none."""
        host = self._host
        outer = host.holds.find(self._key)
        if outer is None:
            return False
        outer._refresh()
        with outer._mutex:
            if outer._state != "held" or outer._releasing:
                return False
            outer._holds += 1
        self._busy_acquiring = False
        self._outer = outer
        # A handle dropped without releasing must still let go of its hold.
        self._held_ref = host.holds.joined(
            self, outer._key, outer._token, self._made_by, functools.partial(outer._release, _DroppedHold())
        )
        return True

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
        self._host.holds.forget(self._held_ref)
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
            emit(hook, LockEvent(type=event_type, key=self._key, ttl=self._ttl, **fields))

    def _interval(self) -> float:
        return beat_interval(self._ttl, self._options.extend_interval)

    def _extending(self) -> bool:
        """Whether the heartbeat extends this lease again (see :func:`lease_lock.heartbeat.next_beat`):
        always while a handed-over claim waits to become a full lease."""
        return (self._options.auto_extend and not self._clamped) or self._claimed

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
        reference = self._held_ref
        assert reference is not None and self._acquired_at is not None
        beat = self._next_beat
        if beat is None:
            if self._plan_from is None:
                beat = next_beat("granted", self._acquired_at, interval, extending=self._extending())
            else:
                beat = next_beat("extended", self._plan_from, interval, extending=self._extending())
            self._next_beat = beat
        if beat <= self._lease_end:
            self._timer = self._host.heartbeat.schedule(reference, beat, interval)
        else:
            self._timer = self._host.heartbeat.schedule(reference, self._lease_end, self._ttl)

    def _cancel_timer(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            self._host.heartbeat.cancel(timer)

    # -- heartbeat side (through BEATS) --------------------------------------------------------

    def _beat_due(self, now: float, timer: Timer) -> Optional[float]:
        with self._mutex:
            if timer is not self._timer or self._state != "held":
                return None
        self._refresh()
        with self._mutex:
            if self._state != "held":
                return None
            if self._next_beat is None or now < self._next_beat:
                self._arm(self._interval())
                return None
            requested = clamp_to_deadline(self._ttl, self._deadline, now)
            if requested > 0:
                self._in_flight += 1
                return requested
        # Hooks run outside the mutex so that an on_event hook reading the lock cannot stall
        # other threads.
        self._mark_lost("max-hold")
        return None

    def _beat_arrived(self) -> None:
        with self._mutex:
            if self._state == "held" and self._timer is None:
                self._arm(self._interval())

    def _beat_sending(self, requested: float, sent: float) -> Optional[float]:
        clamped = clamp_to_deadline(requested, self._deadline, sent)
        if clamped > 0:
            return clamped
        with self._mutex:
            self._in_flight -= 1
        self._mark_lost("max-hold")
        return None

    def _beat_answered(self, sent: float, received: float, requested: float, granted: bool) -> bool:
        rearm = False
        with self._mutex:
            self._in_flight -= 1
            if self._state != "held":
                # Lapsed (or closed) while the request was in flight: a grant came too late.
                outcome = "late" if granted else "ended"
            elif received >= self._lease_end or received >= (end := sent + requested * _KEPT):
                # Too late for the lease it renewed, or for its own (see local_end).
                outcome = "late"
            elif not granted:
                outcome = "not-ours"
            else:
                outcome = "extended"
                self._lease_end = end
                self._clamped = requested < self._ttl
                self._claimed = False
                self._extend_error = None
                # Planned when the timer is set (see _arm): a lock still waiting in the
                # heartbeat's arrivals gets its timer there; only a timer already set is moved.
                self._next_beat = None
                self._plan_from = sent
                rearm = self._timer is not None
        if outcome == "extended":
            self._emit("extended")
            if rearm:
                self._schedule()
            return True
        if outcome == "late":
            self._mark_lost("late-extend")
            if granted:
                give_back(self._host.backend, self._key, self._token)
        elif outcome == "not-ours":
            self._mark_lost("extend")
        return False

    def _beat_failed(self, error: BaseException) -> None:
        with self._mutex:
            self._in_flight -= 1
            if self._state != "held":
                return
            self._extend_error = error
            if self._next_beat != math.inf:
                self._next_beat = next_beat("failed", self._host.clock(), self._interval(), extending=self._extending())
        self._emit("extend_failed", error=error)
        self._schedule()

    # -- the lease's own steps (on the lock whose lease it is) ---------------------------------

    def _release(self, hold: _Hold, request_id: Optional[str] = None) -> bool:
        """``hold`` (a handle of this lease) lets go; the last hold out gives the key back.
        ``True`` when that deleted our key (see :meth:`release` for every answer). A driver
        error propagates and leaves the lease and the hold as they were (the heartbeat keeps
        the lease alive)."""
        host = self._host
        # One clock reading serves the lapse check and, when the key is deleted, the end of the
        # hold (the moment the release request left).
        now = host.clock()
        if self._state == "held" and now >= self._lease_end:
            self._mark_lost(None, lapsed=True)
        mutex = self._mutex
        mutex.acquire()  # not a with statement: see _acquire
        try:
            state = self._state
            # The usual case, a lease held by this one hold, goes straight to the store.
            if state != "held" or self._holds != 1 or self._releasing or hold._let_go:
                settled = self._let_go_without_store(hold, state)
                if settled is not None:
                    return settled
            self._releasing = True
        finally:
            mutex.release()
        try:
            if request_id is None:
                deleted = host.backend.release(self._key, self._token)
            else:
                with request_id_scope(host.backend, request_id):
                    deleted = host.backend.release(self._key, self._token)
            mutex.acquire()
            try:
                self._given_back = True
                hold._let_go = True
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
        if hold is not self:
            host.holds.forget(hold._held_ref)
        if ended_here:
            # HeldLeases.forget, without its call: a grant was given an entry.
            self._held_ref.done = True  # type: ignore[union-attr]
            if host.crowds:
                # Threads of this Locker wait for the key: the next one asks at once.
                host.crowds.released(self._key)
            # A lock whose grant nobody heard of has no release to tell either (see _reported).
            if self._reported:
                self._emit("released")
            return True
        if state == "lost":
            return False
        if not deleted:
            self._mark_lost("release")
            return False
        return True

    def _let_go_without_store(self, hold: _Hold, state: str) -> Optional[bool]:
        """A release that needs no request of its own, decided under the mutex: its answer, or
        ``None`` when the key is to be given back (a lost lease still gives back a key our
        token holds)."""
        if state == "unlocked":
            raise LockStateError(f"lock {self._key!r} was never acquired")
        if hold._let_go:
            return False
        if self._holds > 1:
            # Other holds remain: this one lets go and the lease stays theirs. Decided under the
            # same mutex that marks a release in flight, which a joining acquire checks.
            hold._let_go = True
            self._holds -= 1
            if hold is not self:
                self._host.holds.forget(hold._held_ref)
            return state == "held"
        if state == "released" or self._given_back or self._releasing or self._lost_reason == "forked":
            # Another thread's release (or close) is in flight: that one answers.
            return False
        return None

    def _leave(self, hold: _Hold, block_raised: bool, result: Any) -> None:
        """Leave a protected block through ``hold``: the block's own exception first, then a
        loss, then a failed release (reported as a ``release_failed`` event, never raised over
        the block's outcome: the heartbeat stops and the key runs out on its own)."""
        try:
            self._release(hold)
        except Exception as error:  # noqa: BLE001 - a failed release here is reported as an event, never raised over the block's own outcome
            self._stop_heartbeat()
            self._emit("release_failed", error=error)
        if block_raised:
            return
        # A release that found the key not ours marked the lease lost; a lock the block released
        # itself reads "released" and is no loss, although the release on exit answers False.
        if self._state == "lost":
            raise LockLostError(
                self._key, self._lost_reason or "release", completed=True, result=result
            ) from self._lost_cause

    def _stop_heartbeat(self) -> None:
        """No more extensions; the lapse timer stays, so the end is still reported."""
        with self._mutex:
            self._next_beat = math.inf
        self._schedule()

    def _extend(self, ttl: Optional[float], cancel: Optional[threading.Event], request_id: Optional[str]) -> None:
        cancel = check_cancel(cancel)
        if request_id is not None:
            check_request_id(request_id)
        new_ttl = self._ttl if ttl is None else check_ttl(ttl)
        check_extend_interval(self._options.extend_interval, new_ttl)
        self._check(False)
        started = self._host.clock()
        if cancel is not None and cancel.is_set():
            raise self._renewal_cancelled(0, started)
        with self._mutex:
            requested = clamp_to_deadline(new_ttl, self._deadline, self._host.clock())
            if requested > 0:
                self._in_flight += 1
                if cancel is None:
                    self._ttl = new_ttl
        if requested <= 0:
            self._mark_lost("max-hold")
            raise LockLostError(self._key, "max-hold")
        sent = self._host.clock()
        clamped = self._beat_sending(requested, sent)
        if clamped is None:
            raise LockLostError(self._key, "max-hold")
        requested = clamped
        backend = self._host.backend
        try:
            if request_id is None:
                granted = backend.extend(self._key, self._token, requested)
            else:
                with request_id_scope(backend, request_id):
                    granted = backend.extend(self._key, self._token, requested)
        except Exception as error:
            if cancel is not None and cancel.is_set():
                self._keep_lease(sent, requested, granted=False)
                raise self._renewal_cancelled(1, started) from error
            self._beat_failed(error)
            raise
        received = self._host.clock()
        if cancel is not None:
            if cancel.is_set():
                self._keep_lease(sent, requested, granted=granted, received=received)
                raise self._renewal_cancelled(1, started)
            with self._mutex:
                self._ttl = new_ttl
        if not self._beat_answered(sent, received, requested, granted):
            raise LockLostError(self._key, self._lost_reason or "extend") from self._lost_cause

    def _renewal_cancelled(self, attempts: int, started: float) -> LockHeldError:
        return LockHeldError(
            self._key,
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

    def _is_held(self) -> bool:
        self._refresh()
        if self._state != "held":
            return False
        if self._host.backend.is_held(self._key, self._token):
            self._refresh()
            return self._state == "held"
        self._mark_lost("observed")
        return False

    def _check(self, verify: bool) -> None:
        self._refresh()
        if self._state == "lost":
            raise LockLostError(self._key, self._lost_reason or "expired") from self._lost_cause
        if self._state != "held":
            raise LockStateError(f"lock {self._key!r} is {self._state}, not held")
        if verify and not self._is_held():
            # _is_held() marked the lock lost (or its lease lapsed during the round trip).
            raise LockLostError(self._key, self._lost_reason or "observed") from self._lost_cause


class _DroppedHold:
    """The hold of a re-entrant handle collected before it let go: what letting go of it for
    the handle marks (see HeldLeases.joined)."""

    _let_go = False
    _held_ref: Optional[HeldEntry] = None


#: A handle's share of a lease: the handle itself, or the stand-in of a collected one.
_Hold = Union[Lock, _DroppedHold]


# -- the library's side ------------------------------------------------------------------------


def take_grant(
    lock: Lock, sent: float, end: float, requested: float, fence: Optional[int], max_hold: Optional[float],
    waited: float, attempts: int, claim: Optional[float] = None,
) -> None:
    """Hold a grant in time of ``requested`` seconds, whose request left at ``sent`` and whose
    local lease ends at ``end`` (see :func:`local_end`): the lock's state, the Locker's held
    set, the heartbeat, the ``acquired`` event. ``claim`` is the claim window of a key that a
    release handed over: the heartbeat turns the claim into a full lease early in the window,
    whatever ``auto_extend`` says (see the ``"claimed"`` step of
    :func:`lease_lock.heartbeat.next_beat`)."""
    host = lock._host
    options = lock._options
    ttl = lock._ttl
    interval = beat_interval(ttl, options.extend_interval)
    clamped = requested < ttl
    extend = options.auto_extend and not clamped
    # The thread first (the held set indexes a lock by it), then the held set, before the lease
    # is held: a lock dropped from here on is given back.
    lock._thread = threading.current_thread()
    reference = lock._held_ref = host.holds.add(lock, lock._key, lock._token, lock._made_by)
    mutex = lock._mutex
    mutex.acquire()  # not a with statement: see Lock._acquire
    try:
        lock._state = "held"
        lock._busy_acquiring = False
        lock._acquired_at = sent
        if max_hold is not None:
            lock._deadline = sent + max_hold
        lock._lease_end = end
        if fence is not None:
            lock._fence = fence
        if clamped:
            lock._clamped = True
        if claim is None:
            # The next extension is planned (next_beat, "granted") when the timer is first set.
            if (interval if extend else end - sent) >= ARRIVAL_LEAD:
                # Most locks are released long before their first timer: the heartbeat sets
                # it only if this one is still held when its thread next wakes.
                host.heartbeat.arrive(reference)
            else:
                lock._arm(interval)
        else:
            claim_interval = min(beat_interval(claim, None), interval)
            lock._claimed = True
            lock._next_beat = next_beat("claimed", sent, claim_interval, extending=True)
            lock._arm(claim_interval)
    finally:
        mutex.release()
    # Checked here (as events.wanted does) so that the uncontended path builds no event fields.
    if host.on_event is not None or logger.isEnabledFor(_ACQUIRED_LEVEL):
        lock._reported = True
        lock._emit("acquired", waited=waited, attempts=attempts)


class _LeaseBeats:
    """The heartbeat's calls into the locks it serves (see :class:`lease_lock.heartbeat.Beats`)."""

    def due(self, lock: Lock, now: float, timer: Timer) -> Optional[float]:
        """The lock's timer fired at ``now``: the TTL to ask for, or ``None`` when no extension
        is due (the lock lapsed, or the timer was only a check)."""
        return lock._beat_due(now, timer)

    def arrived(self, lock: Lock) -> None:
        """The heartbeat takes on a lock granted without a timer: set the timer if the lock is
        still held and has none yet."""
        lock._beat_arrived()

    def sending(self, lock: Lock, requested: float, sent: float) -> Optional[float]:
        """Clamp a planned extension to the max-hold deadline as it leaves at ``sent``;
        ``None`` (the lock then reads lost, ``"max-hold"``) when no time is left. Planned
        requests can wait behind others, so the clamp is applied at sending."""
        return lock._beat_sending(requested, sent)

    def answered(self, lock: Lock, sent: float, received: float, requested: float, granted: bool) -> bool:
        """Apply an extension's answer (request left at ``sent``, answer at ``received``);
        ``True`` if the lock is still held after it."""
        return lock._beat_answered(sent, received, requested, granted)

    def failed(self, lock: Lock, error: BaseException) -> None:
        """An extension raised: keep the lock (its confirmed lease still runs), retry soon."""
        lock._beat_failed(error)


#: How the heartbeat drives a Locker's locks.
BEATS = _LeaseBeats()


def run_guarded(block: GuardedBlock, function: Callable[..., _Result], *args: Any, **kwargs: Any) -> _Result:
    """Run ``function`` under the already held ``block`` and leave it with the ``with`` outcome
    order (a loss after a completed call carries the call's result)."""
    return block._run(function, *args, **kwargs)


def acquire_or_raise(lock: Lock, options: LockOptions, timeout: Optional[float] = None) -> None:
    """Acquire ``lock`` with ``options`` (the Locker's own acquire forms pass theirs), raising
    ``LockHeldError`` on contention; ``timeout`` cuts a blocking wait to the seconds left."""
    lock._acquire(options, True, timeout)


def acquire_as(lock: Lock, made_by: str) -> None:
    """Acquire ``lock`` with its own options, raising ``LockHeldError`` on contention, as the
    lock of ``Locker.<made_by>()`` (the name a warning for the lock dropped while held gives)."""
    lock._made_by = made_by
    lock._acquire(lock._options, True)


def refresh_together(locks: Sequence[Lock], request_id: Optional[str] = None) -> None:
    """Renew, to their full TTL, the held leases of ``locks`` (of one Locker) that have run for
    more than :data:`LEASE_MARGIN` of it: one ``extend_many`` round trip where the backend
    batches (``batch_extend``), else one ``extend`` each. A lease that lost less would gain
    less than the margin the local lease gives up anyway, so it is left as it is. Raises
    ``LockLostError`` for a lease that is lost; a driver error propagates (each lease keeps what
    it had, as after a failed extension)."""
    if not locks:
        return
    host = locks[0]._host
    now = host.peek()
    stale = []
    for lock in locks:
        if lock._state != "held":
            raise LockLostError(lock._key, lock._lost_reason or "expired") from lock._lost_cause
        if now + lock._ttl * _KEPT - lock._lease_end > lock._ttl * LEASE_MARGIN:
            stale.append(lock)
    if stale:
        _renew(host, stale, request_id)


def _renew(host: LockHost, locks: list[Lock], request_id: Optional[str]) -> None:
    backend = host.backend
    if len(locks) == 1 or not backend.capabilities.batch_extend:
        for lock in locks:
            lock.extend(request_id=request_id)
        return
    # Each renewal in flight, as the heartbeat counts a due one, then the heartbeat's own batch.
    for lock in locks:
        with lock._mutex:
            lock._in_flight += 1
    plans: list[tuple[Beating, float]] = [(lock, lock._ttl) for lock in locks]
    if request_id is None:
        host.heartbeat.extend_batch(plans)
    else:
        with request_id_scope(backend, request_id):
            host.heartbeat.extend_batch(plans)
    for lock in locks:
        if lock._state != "held":
            raise LockLostError(lock._key, lock._lost_reason or "extend") from lock._lost_cause


def give_up(block: GuardedBlock) -> None:
    """Leave ``block`` as after an error: release it (a half-acquired set, or a block that
    raised); a failed release becomes a ``release_failed`` event and the key runs out."""
    block._finish(block_raised=True, result=None)


def on_loss(lock: Lock, listener: Callable[[], None]) -> None:
    """Call ``listener()`` (on the thread that finds the loss, outside the lease's mutex) when
    the lease ``lock`` holds is lost; a :class:`~lease_lock.LockSet` listens to its members so."""
    lease = lock._outer or lock
    with lease._mutex:
        if lease._loss_listeners is None:
            lease._loss_listeners = []
        lease._loss_listeners.append(listener)


def states_of(locks: Sequence[Lock]) -> list[str]:
    """The state of each of ``locks`` (of one Locker) as of one clock reading: what reading
    ``lock.state`` of each says, with one reading of the clock instead of one per lock."""
    now = locks[0]._host.clock()
    states = []
    for lock in locks:
        lease = lock._outer or lock
        if lease._state == "held" and now >= lease._lease_end:
            lease._mark_lost(None, lapsed=True)
        states.append(lease._state)
    return states


def lost_cause(lock: Lock) -> Optional[BaseException]:
    """The error behind ``lock``'s loss (a failed extension's), or ``None``."""
    return (lock._outer or lock)._lost_cause


def fork_lease(lock: Lock) -> None:
    """In a forked child (the Locker calls it for each lock a parent thread held): this copy
    must never extend or release the parent's lease."""
    lock._mutex = threading.Lock()
    # The timer sits in the parent's heap, which the child's heartbeat has dropped. Cancelling
    # it would take the parent's heartbeat lock, which a parent thread may have held at the
    # fork and will never release here.
    lock._timer = None
    if lock._state == "held":
        lock._mark_lost("forked", notify=False)


def close_lease(lock: Lock) -> None:
    """The Locker is closing: give the key back and read lost (``"closed"``)."""
    lock._refresh()
    with lock._mutex:
        if lock._state != "held" or lock._releasing:
            return
        lock._releasing = True
    try:
        lock._host.backend.release(lock._key, lock._token)
    except Exception:  # noqa: BLE001 - closing must reach every lock; the lease runs out
        logger.warning("releasing %r while closing failed", lock._key, exc_info=True)
    lock._given_back = True
    lock._mark_lost("closed")
