"""Acquisition: turning a request for a key into a grant, or into ``LockHeldError``.

One :class:`Acquisition` serves one Locker: the settings every lock's grant request takes, the
set of locks currently held (which closing, forking and re-entrant joins need), and every
acquisition that the first attempt did not end: the attempts paced by the retry policy,
waiting in the backend's line, a cancel event, the timeout, riding out an unreachable store,
and judging a grant that came back too late (:func:`lease_lock._lease.local_end`).

Waiting for a busy key has one seam: the backend's waiting line
(:meth:`~lease_lock.backends.base.Backend.join_line`), joined after the first refused attempt.
How a line is woken (a grant handed over in the store, an announced release, the holder's lease
end) is the backend's; without a line the waiter sleeps out its retry pause.

An acquisition that no cancel event can stop sends its first attempt before any of the loop
is set up (in the lock: see :mod:`lease_lock._lease`): a grant in time is held at once, and
any other answer is handed to :meth:`Acquisition.wait_for_grant`, which judges it as if it had
sent it. The loop is three parts:
:meth:`Acquisition.attempt` sends one grant request (through
:func:`lease_lock.backends.service.ask_grant`, which knows the backends' request ids and rate
limits) and names its :data:`Outcome`; :func:`pick_pause` chooses the wait before the next
attempt; ``Acquisition._attempt`` joins them until a grant, the retries, the timeout or a
cancel ends it. :class:`Attempts` is what they share about one acquisition.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any, Callable, Literal, NoReturn, Optional, Union

from ._crowd import Crowds, Place
from ._held import HeldLeases
from ._lease import BEATS, Answer, FirstAttempt, Lock, Plan, give_back, local_end, take_grant
from .backends.base import Backend, LineGrant, WaitingLine, limit_mismatch
from .backends.service import SlowDown, ask_grant, request_id_scope
from .clock import QUIET_PAUSE, LeaseClock
from .errors import BackendUnavailableError, HeldReason, LockHeldError, LockStateError
from .events import EventHook, EventType, LockEvent, emit, logger, wanted
from .heartbeat import Heartbeat
from .options import LockOptions
from .retry import Retry, RetryState

__all__ = [
    "GRANTED", "HELD", "LATE", "RATE_LIMITED", "UNREACHABLE", "Acquisition", "Attempts", "Outcome", "pick_pause",
]

#: How often a wait re-checks a cancel event.
_CANCEL_SLICE = 0.05
#: How often a wait in line looks whether its Locker was closed meanwhile.
_CLOSE_SLICE = 1.0


#: How many attempt plans an acquisition keeps before it starts afresh.
_PLANS = 16


#: What one attempt came to (see :meth:`Acquisition.attempt`).
Outcome = Literal["granted", "held", "late", "unreachable", "rate-limited"]
#: The store granted the key, and the answer came back while the local lease still runs.
GRANTED: Outcome = "granted"
#: The store answered that another holder has the key.
HELD: Outcome = "held"
#: The store granted the key, but the answer came back after the local lease had ended.
LATE: Outcome = "late"
#: The store could not be reached.
UNREACHABLE: Outcome = "unreachable"
#: The store asked for a pause before the next request (the HTTP service's 429).
RATE_LIMITED: Outcome = "rate-limited"


class Attempts:
    """The attempts of one acquisition so far: its budget, what the latest one saw, its wait.

    Built with the merged retry ``policy``, the ``retries`` and ``timeout`` of the loop, the
    ``requested`` lease, the hold deadline ``max_hold`` and the lease-clock reading ``start``.
    """

    __slots__ = (
        "asked", "attempts", "claim", "end", "fence", "handed", "line", "max_hold", "outage", "place", "policy",
        "previous_delay", "reason", "received", "requested", "retries", "sent", "start", "timeout", "unreachable",
    )

    def __init__(
        self, policy: Retry, retries: float, timeout: float, requested: float, max_hold: Optional[float], start: float
    ) -> None:
        self.policy = policy
        self.retries = retries
        self.timeout = timeout
        self.requested = requested
        self.max_hold = max_hold
        #: When the acquisition began, when the latest attempt was sent and when it was answered.
        self.start = self.sent = self.received = start
        #: How many attempts were sent.
        self.attempts = 0
        #: What a wait ending now reports as LockHeldError's reason.
        self.reason: Union[HeldReason, Literal["unavailable"]] = "held"
        #: Whether the latest attempt could not reach the store.
        self.unreachable = False
        #: The error of the latest attempt (or registration) that could not reach the store,
        #: ``None`` once an attempt is answered again.
        self.outage: Optional[BackendUnavailableError] = None
        #: The retry delay last waited (the retry policy's ``previous_delay``).
        self.previous_delay: Optional[float] = None
        #: The pause the store asked for after a rate-limited attempt.
        self.asked = 0.0
        #: The local end and the fence of a grant in time.
        self.end = start
        self.fence: Optional[int] = None
        #: The waiter's line (see Backend.join_line), once it waits in one; a grant that
        #: reached it there and is yet to be judged; the claim window of a grant in time that
        #: a release handed over (``None`` for a grant of the full lease).
        self.line: Optional[WaitingLine] = None
        self.handed: Optional[LineGrant] = None
        self.claim: Optional[float] = None
        #: The waiter's place in its key's crowd (see lease_lock._crowd), once it waits in one.
        self.place: Optional[Place] = None


def pick_pause(tries: Attempts, outcome: Outcome, elapsed: float) -> tuple[float, bool]:
    """How long to wait after a refused attempt, and whether the waiter's line (when it has
    one) may end the wait early: ``(seconds, in_line)``, before the cut to the time left.

    The waiting rule: with the retry ``delay`` unset, a waiter in a line waits until the line
    brings the key (an announced release, a grant handed over, the holder's lease end), never
    polling, and a waiter without one pauses :data:`~lease_lock.clock.QUIET_PAUSE`. A delay
    (or delay function) that is set bounds every pause, and the line ends a pause early.

    - After ``rate-limited``: the pause the store asked for, waited out in full, out of line.
    - After ``unreachable``: the delay, or the quiet pause when unset, out of line.
    - After ``late``: at once in a line (the key was free), else the delay.
    """
    if outcome == RATE_LIMITED:
        return tries.asked, False
    # A follower in its key's crowd waits in line too: the crowd's (see lease_lock._crowd).
    place = tries.place
    in_line = (tries.line is not None or (place is not None and not place.leads)) and outcome != UNREACHABLE
    policy = tries.policy
    if policy.delay is None:
        return (math.inf if outcome != LATE else 0.0) if in_line else QUIET_PAUSE, in_line
    pause = tries.previous_delay = policy.delay_for(RetryState(tries.attempts, elapsed, tries.previous_delay))
    if in_line and outcome == LATE:
        pause = 0.0
    return pause, in_line


def _unreachable(key: str, attempts: int, elapsed: float, last: BackendUnavailableError) -> BackendUnavailableError:
    """What a wait whose last attempt could not reach the store raises: how many attempts over
    how long, and the driver's reason (the driver's error stays the ``__cause__``)."""
    error = BackendUnavailableError(
        f"store unreachable while acquiring {key!r}: {attempts} attempt(s) over {elapsed:.3f}s, "
        f"the last one failed: {last}",
        backend=last.backend,
    )
    error.__cause__ = last.__cause__ if last.__cause__ is not None else last
    return error


def _log_outage(key: str, error: BackendUnavailableError) -> None:
    # Once per outage of one acquisition, not once per attempt: each attempt is an
    # ``attempt_failed`` event (logged at debug level) already.
    logger.warning("backend unavailable while acquiring %r; retrying until the timeout: %s", key, error)


class Acquisition:
    """Acquires locks for one Locker and keeps the set of those held.

    It is also what every :class:`~lease_lock.Lock` of that Locker is served by (the
    ``LockHost`` a lock is built with): the backend, the lease clock, the heartbeat, the event
    hook, acquiring and forgetting a released lock.

    The waits between attempts end on the lease clock and are bounded in real time too
    (``time.sleep`` and ``time.monotonic``), so a lease clock that stands still cannot stretch
    them. A ``clock`` that has a ``sleep(seconds)`` method of its own (a test's fake clock) is
    injected time for the waits as well: they sleep with that method and pass on that clock
    alone, taking no real time; such a wait joins no line (a thread blocked on the store could
    not follow injected time) and sleeps out its retry pause.
    """

    __slots__ = (
        "backend", "clock", "closed", "crowds", "fake_time", "fencing", "heartbeat", "holds", "limit", "max_hold",
        "on_event", "owner", "peek", "plans", "real_clock", "reentrant", "retry", "sleep",
    )

    def __init__(
        self,
        backend: Backend,
        clock: Callable[[], float],
        *,
        retry: Retry,
        max_hold: float,
        fencing: bool,
        owner: str,
        reentrant: bool,
        on_event: Optional[EventHook],
        limit: int = 1,
    ) -> None:
        self.backend = backend
        # A LeaseClock is read through its bound method: calling the instance itself goes
        # through its type's call slot, some 400 instructions more on each of a cycle's reads.
        self.clock: Callable[[], float] = clock.__call__ if isinstance(clock, LeaseClock) else clock
        #: The lease clock without its pause check, for the send of a first attempt.
        self.peek: Callable[[], float] = clock.peek if isinstance(clock, LeaseClock) else clock
        own_sleep: Optional[Callable[[float], None]] = getattr(clock, "sleep", None)
        #: Whether the waits between attempts pass on the lease clock alone (see the class
        #: docstring); what they sleep with, and what bounds them besides the lease clock.
        self.fake_time = own_sleep is not None
        self.sleep: Callable[[float], None] = own_sleep or time.sleep
        self.real_clock: Callable[[], float] = clock if self.fake_time else time.monotonic
        self.heartbeat = Heartbeat(backend, clock, BEATS)
        self.retry = retry
        self.max_hold = max_hold
        self.fencing = fencing
        self.owner = owner
        self.reentrant = reentrant
        #: How many leases a key admits at once unless a lock's options say otherwise.
        self.limit = limit
        self.on_event = on_event
        #: Set by the Locker's close(): no attempt starts, and a grant in flight goes back.
        self.closed = False
        #: The locks held, and by thread and key once asked (re-entrant joins, "this very thread").
        self.holds: HeldLeases[Lock] = HeldLeases(self.heartbeat.give_back_dropped)
        #: The threads waiting for a key, by key (see lease_lock._crowd).
        self.crowds = Crowds()
        # The attempt plans of the options recently acquired with, by id (see _plan_for).
        self.plans: dict[int, tuple[LockOptions, Plan]] = {}

    # -- the set of held locks -----------------------------------------------------------------

    def release_dropped(self) -> None:
        """Give back, on the calling thread, the leases of locks collected while held that the
        heartbeat has not given back yet (the Locker is closing)."""
        self.heartbeat.release_dropped()

    def take_held(self) -> list[Lock]:
        """Every lock still held, emptying the set (the Locker is closing)."""
        return self.holds.take()

    def after_fork(self) -> list[Lock]:
        """In a forked child: fresh mutexes, no thread's holds, and the locks a parent thread
        held at the fork (returned, emptying the set), which the child must never use."""
        held = self.holds.take()
        self.holds = HeldLeases(self.heartbeat.give_back_dropped)
        self.crowds = Crowds()
        self.heartbeat.after_fork()
        return held

    def check_open(self) -> None:
        """Raise ``LockStateError`` once the Locker is closed."""
        if self.closed:
            raise LockStateError("this Locker is closed")

    # -- acquiring -----------------------------------------------------------------------------

    def wait_for_grant(self, lock: Lock, options: LockOptions, plan: Plan, first: Optional[FirstAttempt]) -> None:
        """Go on from the ``first`` attempt of ``lock`` (``None``: no attempt was sent yet, as
        for a wait with a cancel event) until a grant, held through
        :func:`~lease_lock._lease.take_grant`; otherwise raise what ended the wait."""
        if options.request_id is None:
            self._attempt(lock, options, plan, first)
            return
        # Every request of the call goes with its id, the line's waits among them.
        with request_id_scope(self.backend, options.request_id):
            self._attempt(lock, options, plan, first)

    def _max_hold_for(self, options: LockOptions) -> Optional[float]:
        if options.max_hold is not None:
            return options.max_hold if math.isfinite(options.max_hold) else None
        if options.auto_extend and math.isfinite(self.max_hold):
            return self.max_hold
        return None

    def _emit(self, lock: Lock, event_type: EventType, **fields: Any) -> None:
        hook = self.on_event
        if wanted(hook, event_type):
            emit(hook, LockEvent(type=event_type, key=lock.key, ttl=lock.ttl, **fields))

    def plan_for(self, options: LockOptions) -> Plan:
        """What ``options`` make of this acquisition's policy: the merged retry policy, the
        retries and the timeout of the attempt loop, the hold deadline, and whether to wait
        in the backend's line (not with injected time, which a thread blocked on the store
        cannot follow).

        Most calls of a program pass one of a few options objects (the defaults, try_acquire's,
        or options remembered by ``lock_options``), so the plans of the latest few are kept
        (_attempt looks them up first); each options object is kept with its plan, so an
        identity check cannot be fooled by a reused id."""
        policy = self.retry.merged(options.retry)
        retries = policy.retries if options.blocking else 0
        assert retries is not None and policy.timeout is not None
        timeout = policy.timeout if options.blocking else math.inf
        in_line = options.blocking and retries > 0 and not self.fake_time
        plan = (policy, retries, timeout, self._max_hold_for(options), in_line)
        if len(self.plans) >= _PLANS:
            self.plans = {}
        self.plans[id(options)] = (options, plan)
        return plan

    def _attempt(self, lock: Lock, options: LockOptions, plan: Plan, first: Optional[FirstAttempt] = None) -> None:
        """The retry loop: attempts paced by the retry policy until its timeout, going on from
        the ``first`` attempt when the lock sent it (see ``Lock._acquire``).

        Returns on a grant. Otherwise raises what the last attempt saw: ``LockHeldError`` when
        the store answered (or the wait was cancelled), ``BackendUnavailableError`` when it
        could not be reached."""
        policy, retries, timeout, max_hold, in_line = plan
        requested = min(lock.ttl, max_hold) if max_hold is not None else lock.ttl
        cancel = options.cancel
        outcome: Optional[Outcome] = None
        if first is None:
            tries = Attempts(policy, retries, timeout, requested, max_hold, self.clock())
        else:
            tries = Attempts(policy, retries, timeout, requested, max_hold, first[0])
            tries.attempts = 1
            outcome = self._judge(lock, tries, first[1], first[2])
            del first  # see attempt: no reference cycle through an outage's error
        granted = False
        try:
            # A counting key's waiters wait each in its own place: a freed place is one of several.
            crowded = in_line and lock.limit == 1
            if outcome is None and crowded and self.crowds.asking(lock.key):
                self._queue(lock, tries, cancel)
            while True:
                if outcome is None:
                    if self.closed:
                        self.check_open()
                    if cancel is not None and cancel.is_set():
                        tries.reason = "cancelled"
                        break
                    outcome = self._judge_handed(lock, tries) or self.attempt(lock, tries)
                if outcome == GRANTED:
                    granted = self._take(lock, tries, cancel)
                    if granted:
                        return
                    break
                self._refused(lock, tries, outcome)
                if not self._wait(lock, tries, outcome, in_line, cancel):
                    break
                outcome = None
        finally:
            try:
                if tries.line is not None:
                    tries.line.leave(granted)
            finally:
                # After the line: the next thread's place in the store's line follows this one's.
                if tries.place is not None:
                    self.crowds.leave(lock.key, tries.place)
        self._give_up(lock, tries)

    def _queue(self, lock: Lock, tries: Attempts, cancel: Optional[threading.Event]) -> None:
        """Before the first attempt, while a thread of the key's crowd asks for it after a
        release (see :mod:`lease_lock._crowd`): queue behind the crowd until it is this one's
        turn, a thread of the Locker released the key, its pause ends or its time is up; the
        attempt follows (a waiter asks at least once)."""
        place = tries.place = self.crowds.join(lock.key)
        if not place.leads:
            pause, _ = pick_pause(tries, HELD, 0.0)
            self._wait_in_crowd(lock, tries, min(pause, tries.timeout), cancel)

    def attempt(self, lock: Lock, tries: Attempts) -> Outcome:
        """One grant request for ``lock``, counted and timed in ``tries``, and what came of it.

        ``granted`` (in time: ``tries.end`` and ``tries.fence`` say what to hold), ``held``,
        ``late`` (granted, but the answer came after the local lease had ended),
        ``rate-limited`` (the store asked for ``tries.asked`` seconds of quiet) or
        ``unreachable`` (``tries.outage`` is the error). What cannot be ridden out is raised
        instead: a single attempt's unreachable store, and a rate limit on the last attempt
        allowed (the store's own error, as it is).
        """
        if tries.attempts:
            tries.sent = self.clock()
        tries.attempts += 1
        answer: Answer
        try:
            # Bounded by the time the wait has left, so that a silent store ends the wait at
            # its timeout; in line, the line asks: it keeps the waiter's place, and a grant
            # takes it out. A request id reaches the store through the scope acquire() enters.
            with self.backend.call_budget(max(tries.timeout - (tries.sent - tries.start), 0.0)):
                answer = ask_grant(
                    self.backend, lock.key, lock.token, tries.requested, self.owner, self.fencing, None,
                    tries.line, lock.limit,
                )
        except BackendUnavailableError as error:
            answer = error
        try:
            return self._judge(lock, tries, answer, self.clock())
        finally:
            # An error's traceback holds this frame, and through it every caller's frame, the
            # lock among their locals: kept here, it would make a reference cycle that only the
            # cyclic collector frees, and a lock its holder drops would outlive the drop.
            del answer

    def _judge_handed(self, lock: Lock, tries: Attempts) -> Optional[Outcome]:
        """What a grant that reached the waiter in line came to (``granted`` or ``late``), as
        if the request it names had been the latest attempt; ``None`` when none came."""
        grant = tries.handed
        if grant is None:
            return None
        tries.handed = None
        tries.sent = grant.sent
        # Counted as an attempt, the one the grant answers: every grant ends an acquisition's
        # count of attempts as it would had the waiter asked for it itself.
        tries.attempts += 1
        outcome = self._judge(lock, tries, grant.fence, tries.received, grant.lease)
        tries.claim = grant.lease if grant.claimed else None
        return outcome

    def _judge(
        self, lock: Lock, tries: Attempts, answer: Answer, received: float, lease: Optional[float] = None
    ) -> Outcome:
        """What the answer to the latest attempt (``answer``, at ``received``) came to; see
        :meth:`attempt`. ``lease`` is the seconds a grant runs in the store when that is not the
        lease asked for (a claim window)."""
        tries.unreachable = False
        tries.received = received
        if isinstance(answer, BackendUnavailableError):
            # While the budget lasts an outage is one more failed attempt: the waiter rides it
            # out on its retry schedule. A single attempt raises it at once.
            if tries.attempts == 1 and tries.retries == 0:
                raise answer
            if tries.outage is None:
                _log_outage(lock.key, answer)
            tries.outage = answer
            tries.unreachable = True
            return UNREACHABLE
        if tries.outage is not None:
            logger.warning("backend reachable again while acquiring %r", lock.key)
            tries.outage = None
        if isinstance(answer, SlowDown):
            if tries.attempts > tries.retries:
                # No attempt may follow (a single attempt, as try_acquire's): nothing is left
                # to wait for, and the store's answer is the caller's.
                raise answer.error
            tries.asked = answer.seconds
            return RATE_LIMITED
        if answer is None:
            return HELD
        # The local end of the granted lease; None when the grant came back too late.
        end = local_end(tries.sent, tries.requested if lease is None else lease, received)
        if end is None:
            return LATE
        tries.end = end
        # A counting lease always carries its fence: it tells its holders apart.
        tries.fence = answer if self.fencing or lock.limit > 1 else None
        return GRANTED

    def _take(self, lock: Lock, tries: Attempts, cancel: Optional[threading.Event]) -> bool:
        """Hold the grant of the latest attempt; ``False`` (the grant given back) when the wait
        was cancelled while that attempt was in flight."""
        if cancel is not None and cancel.is_set():
            # A winning attempt still in flight when the wait was cancelled is given back:
            # nobody will use it.
            give_back(self.backend, lock.key, lock.token)
            tries.reason = "cancelled"
            return False
        if self.closed:
            # close() ran while this attempt was in flight: nobody would extend or give back
            # this lease, so it goes back now, and check_open() raises (a closed Locker never
            # reopens).
            give_back(self.backend, lock.key, lock.token)
            self.check_open()
        take_grant(
            lock, tries.sent, tries.end, tries.requested, tries.fence, tries.max_hold, tries.received - tries.start,
            tries.attempts, tries.claim,
        )
        return True

    def _refused(self, lock: Lock, tries: Attempts, outcome: Outcome) -> None:
        """Note an attempt that got no grant: its reason, its event, and a late grant given back."""
        elapsed = tries.received - tries.start
        if outcome == UNREACHABLE:
            tries.reason = "unavailable"
            self._emit(
                lock, "attempt_failed", attempt=tries.attempts, elapsed=elapsed, reason="unavailable",
                error=tries.outage,
            )
        elif outcome == RATE_LIMITED:
            tries.reason = "held"
        elif outcome == LATE:
            give_back(self.backend, lock.key, lock.token)
            tries.reason = "late-acquire"
            self._emit(lock, "contended", attempt=tries.attempts, elapsed=elapsed, reason="late")
        else:
            if tries.attempts == 1 and lock.limit == 1 and self.backend.capabilities.counting:
                self._check_not_counting(lock)
            tries.reason = "held"
            self._emit(lock, "contended", attempt=tries.attempts, elapsed=elapsed, reason="held")

    def _check_not_counting(self, lock: Lock) -> None:
        """An exclusive acquire's first refusal, on a store that grants counting leases: refuse
        a key whose live holders hold counting leases with ``limit_mismatch``'s error (a store's
        exclusive grant only finds such a key held). One ``inspect``, on contention only."""
        state = self.backend.inspect(lock.key)
        if state.held and state.limit != 1:
            raise limit_mismatch(lock.key, 1, state.limit)

    def _wait(
        self, lock: Lock, tries: Attempts, outcome: Outcome, in_line: bool, cancel: Optional[threading.Event]
    ) -> bool:
        """Wait before the next attempt; ``False`` when none may follow (the retries are spent,
        or the timeout came)."""
        if tries.place is not None:
            tries.place.asks = False  # its attempt was answered
        if tries.attempts > tries.retries:
            return False
        elapsed = self.clock() - tries.start
        left = tries.timeout - elapsed
        if left <= 0:
            tries.reason = "timeout"
            return False
        busy = outcome in (HELD, LATE)
        if in_line and tries.line is None and busy:
            # Joined once the key was found busy, which keeps uncontended acquisitions cheap: the
            # key's crowd in this Locker, whose first thread alone joins the store's line (a
            # counting key's waiter joins it itself: see _attempt).
            place = tries.place
            if place is None and lock.limit == 1:
                place = tries.place = self.crowds.join(lock.key)
            if place is None or place.leads:
                self._join_line(lock, tries)
        pause, waits_in_line = pick_pause(tries, outcome, elapsed)
        pause = min(pause, left)
        if waits_in_line and tries.line is not None:
            self._wait_in_line(lock, tries, pause, cancel)
        elif busy and tries.place is not None:
            self._wait_in_crowd(lock, tries, pause, cancel)
        else:
            self._pause(pause, cancel)
        if tries.handed is not None:
            return True
        if self.clock() - tries.start >= tries.timeout:
            # The last wait is cut to the time left, and no attempt starts after the timeout.
            tries.reason = "timeout"
            return False
        return True

    def _join_line(self, lock: Lock, tries: Attempts) -> None:
        """Take the crowd's place in the store's line (``tries.line``, ``None`` on a store that
        offers none); a release the leader was woken for meanwhile is its line's to bring."""
        # ``limit`` only for a counting key: a backend's join_line may predate the argument.
        counting = {"limit": lock.limit} if lock.limit > 1 else {}
        tries.line = self.backend.join_line(
            lock.key, lock.token, tries.requested, self.owner, self.fencing, self.clock, **counting
        )
        if tries.line is not None and tries.place is not None:
            tries.place.line = tries.line
            tries.place.wake.clear()

    def _wait_in_crowd(
        self, lock: Lock, tries: Attempts, seconds: float, cancel: Optional[threading.Event]
    ) -> None:
        """Wait up to ``seconds`` in the key's crowd (see :mod:`lease_lock._crowd`), looking at a
        cancel event and at the Locker's close between slices of it.

        A follower that takes the lead meanwhile takes the crowd's place in the store's line at
        once and waits there for the rest (on a store without a line, it asks at once). A release
        of the key by a thread of this Locker ends the wait of the first place no line wakes (a
        follower, or a leader on a store without a line), and it asks at once."""
        place = tries.place
        assert place is not None
        led = place.leads
        slice_ = _CLOSE_SLICE if cancel is None else _CANCEL_SLICE
        deadline = self.real_clock() + seconds
        while True:
            left = deadline - self.real_clock()
            if left <= 0 or self.closed or (cancel is not None and cancel.is_set()):
                return
            if place.wake.wait(min(left, slice_)):
                break
        place.wake.clear()
        if led or not place.leads:
            return  # a release by a thread of this Locker: ask at once
        self._join_line(lock, tries)
        if tries.line is not None:
            self._wait_in_line(lock, tries, max(deadline - self.real_clock(), 0.0), cancel)

    def _wait_in_line(
        self, lock: Lock, tries: Attempts, seconds: float, cancel: Optional[threading.Event]
    ) -> None:
        """Wait up to ``seconds`` in the waiter's line: ``tries.handed`` is the grant that
        reached it there, if any. The wait looks at a cancel event and at the Locker's close
        between slices of it.

        A line that cannot reach the store is left, and the wait counts as an attempt that
        could not: a wait that ends that way ends as ``BackendUnavailableError``, never as
        "held". The next wait joins a line again."""
        line = tries.line
        assert line is not None
        slice_ = _CLOSE_SLICE if cancel is None else _CANCEL_SLICE
        deadline = self.real_clock() + seconds
        try:
            while True:
                left = deadline - self.real_clock()
                if left <= 0 or self.closed or (cancel is not None and cancel.is_set()):
                    return
                # The store calls of a wait (a line's refresh, an announced waiter's attempt at
                # the end of a slice) end with the whole wait, as an attempt's do.
                with self.backend.call_budget(max(tries.timeout - (self.clock() - tries.start), 0.0)):
                    handed = line.wait(min(left, slice_))
                if handed is not None:
                    tries.handed = handed
                    tries.received = self.clock()
                    return
        except BackendUnavailableError as error:
            line.leave(False)
            tries.line = None
            if tries.place is not None:
                tries.place.line = None
            if tries.outage is None:
                _log_outage(lock.key, error)
            tries.outage = error
            tries.unreachable = True
            tries.reason = "unavailable"
            # Paced as after an attempt that could not reach the store, within the time left.
            self._pause(min(max(deadline - self.real_clock(), 0.0), QUIET_PAUSE), cancel)

    def _give_up(self, lock: Lock, tries: Attempts) -> NoReturn:
        """Raise what ends an acquisition without a grant (after its ``timed_out`` event)."""
        elapsed = self.clock() - tries.start
        if tries.reason == "timeout":
            self._emit(lock, "timed_out", attempts=tries.attempts, elapsed=elapsed)
        if tries.unreachable and tries.reason != "cancelled":
            # The wait ended with an attempt that could not reach the store: that is what it
            # says, not "held" (nobody answered that the key is held).
            assert tries.outage is not None
            raise _unreachable(lock.key, tries.attempts, elapsed, tries.outage)
        # An attempt that could not reach the store ended in BackendUnavailableError above.
        assert tries.reason != "unavailable"
        raise LockHeldError(lock.key, attempts=tries.attempts, elapsed=elapsed, reason=tries.reason) from tries.outage

    def _pause(self, seconds: float, cancel: Optional[threading.Event]) -> None:
        """Wait ``seconds`` on the lease clock (bounded on the waits' own clock too)."""
        target = self.clock() + seconds
        real_deadline = self.real_clock() + seconds
        while True:
            left = min(target - self.clock(), real_deadline - self.real_clock())
            if left <= 0:
                return
            if cancel is not None:
                if cancel.is_set():
                    return
                left = min(left, _CANCEL_SLICE)
            self.sleep(left)
