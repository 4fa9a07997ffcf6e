"""Acquisition: turning a request for a key into a grant, or into ``LockHeldError``.

One :class:`Acquisition` serves one Locker. It owns everything between a caller's ``acquire``
and the backend's answer: joining a re-entrant hold, the attempts paced by the retry policy,
waiting for a release notification, a cancel event, the timeout, riding out an unreachable
store, judging a grant that came back too late (:func:`lease_lock.lease.local_end`), and the set
of locks currently held (which closing and forking need).
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any, Callable, Optional

from .backends.base import Backend
from .backends.service import request_id_scope
from .errors import BackendUnavailableError, LockHeldError, LockStateError, RateLimitedError
from .events import EventHook, LockEvent, emit, logger, wanted
from .heartbeat import Heartbeat
from .lease import give_back, local_end
from .lock import Lock
from .options import LockOptions
from .reentry import ThreadHolds
from .retry import Retry, RetryState
from .waiting import ReleaseDispatcher

__all__ = ["NOTIFIED_WAIT_CAP", "Acquisition"]

#: The longest a waiter sleeps between looks at a key while release notifications flow (the
#: retry delay, the holder's remaining lease when known, or this, whichever is shortest).
NOTIFIED_WAIT_CAP = 1.0
#: How often a wait re-checks a cancel event.
_CANCEL_SLICE = 0.05


#: See Acquisition._plan_for.
_Plan = tuple[Retry, float, float, Optional[float], bool]
#: How many attempt plans an acquisition keeps before it starts afresh.
_PLANS = 16


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
    """

    __slots__ = (
        "_plans", "backend", "clock", "closed", "dispatcher", "fencing",
        "heartbeat", "holds", "max_hold", "on_event", "owner", "reentrant", "retry",
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
    ) -> None:
        self.backend = backend
        self.clock = clock
        self.heartbeat = Heartbeat(backend, clock)
        self.dispatcher = ReleaseDispatcher(backend)
        self.retry = retry
        self.max_hold = max_hold
        self.fencing = fencing
        self.owner = owner
        self.reentrant = reentrant
        self.on_event = on_event
        #: Set by the Locker's close(): no attempt starts, and a grant in flight goes back.
        self.closed = False
        #: The locks held, and by thread and key once asked (re-entrant joins, "this very thread").
        self.holds = ThreadHolds(self.heartbeat.give_back_dropped)
        # The attempt plans of the options recently acquired with, by id (see _plan_for).
        self._plans: dict[int, tuple[LockOptions, Retry, _Plan]] = {}

    # -- the set of held locks -----------------------------------------------------------------

    def forget(self, lock: Lock) -> None:
        """``lock`` was released or lost: closing the locker has nothing left to give back for it."""
        self.holds.forget(lock)

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
        self.holds = ThreadHolds(self.heartbeat.give_back_dropped)
        self.heartbeat.after_fork()
        self.dispatcher.after_fork()
        return held

    def check_open(self) -> None:
        """Raise ``LockStateError`` once the Locker is closed."""
        if self.closed:
            raise LockStateError("this Locker is closed")

    # -- acquiring -----------------------------------------------------------------------------

    def acquire(self, lock: Lock, options: LockOptions, *, raise_on_contention: bool) -> bool:
        """Acquire ``lock`` with ``options``: ``True`` when held; on contention ``False`` or,
        with ``raise_on_contention``, ``LockHeldError``."""
        if self.closed:
            self.check_open()
        lock.start_acquiring()
        try:
            reentrant = self.reentrant if options.reentrant is None else options.reentrant
            if reentrant:
                outer = self.holds.find(lock.key)
                if outer is not None and lock.join_hold(outer):
                    return True
            self._attempt(lock, options)
        except BaseException as error:
            # A grant (in its pass through the lock's mutex) or a join ended the acquiring
            # already; every other way out ends it here.
            lock.stop_acquiring()
            if not isinstance(error, LockHeldError):
                raise
            if not raise_on_contention:
                return False
            explained = self.holds.explain(lock.key, error)
            if explained is error:
                raise
            raise explained from None
        return True

    def _max_hold_for(self, options: LockOptions) -> Optional[float]:
        if options.max_hold is not None:
            return options.max_hold if math.isfinite(options.max_hold) else None
        if options.auto_extend and math.isfinite(self.max_hold):
            return self.max_hold
        return None

    def _emit(self, lock: Lock, event_type: str, **fields: Any) -> None:
        hook = self.on_event
        if wanted(hook, event_type):
            emit(hook, LockEvent(type=event_type, key=lock.key, ttl=lock.ttl, **fields))

    def _plan_for(self, options: LockOptions) -> _Plan:
        """What ``options`` make of this acquisition's policy: the merged retry policy, the
        retries and the timeout of the attempt loop, the hold deadline, and whether to wait
        for release notifications.

        Most calls of a program pass one of a few options objects (the defaults, try_acquire's,
        or options remembered by ``lock_options``), so the plans of the latest few are kept
        (_attempt looks them up first); each options object is kept with its plan, so an
        identity check cannot be fooled by a reused id."""
        policy = self.retry.merged(options.retry)
        retries = policy.retries if options.blocking else 0
        assert retries is not None and policy.timeout is not None
        timeout = policy.timeout if options.blocking else math.inf
        notify = self.dispatcher.available and options.blocking and retries > 0
        plan = (policy, retries, timeout, self._max_hold_for(options), notify)
        if len(self._plans) >= _PLANS:
            self._plans = {}
        self._plans[id(options)] = (options, self.retry, plan)
        return plan

    def _attempt(self, lock: Lock, options: LockOptions) -> None:
        """The retry loop: attempts paced by the retry policy until its timeout.

        Returns on a grant. Otherwise raises what the last attempt saw: ``LockHeldError`` when
        the store answered (or the wait was cancelled), ``BackendUnavailableError`` when it
        could not be reached."""
        cached = self._plans.get(id(options))
        if cached is not None and cached[0] is options and cached[1] is self.retry:
            policy, retries, timeout, max_hold, notify = cached[2]
        else:
            policy, retries, timeout, max_hold, notify = self._plan_for(options)
        requested = min(lock.ttl, max_hold) if max_hold is not None else lock.ttl
        cancel = options.cancel
        wake: Optional[threading.Event] = None
        start = sent = self.clock()
        attempts = 0
        unreachable = False
        previous_delay: Optional[float] = None
        reason = "held"
        # The error of the latest attempt that could not reach the store (None once an attempt
        # is answered again): what a wait ending on an unreachable store reports.
        outage: Optional[BackendUnavailableError] = None
        try:
            while True:
                if self.closed:
                    self.check_open()
                if cancel is not None and cancel.is_set():
                    reason = "cancelled"
                    break
                if wake is not None:
                    wake.clear()
                if attempts:
                    sent = self.clock()
                attempts += 1
                rate_limit_pause: Optional[float] = None
                unreachable = False
                try:
                    if options.request_id is None:
                        granted, fence = self._ask(lock, requested)
                    else:
                        with request_id_scope(self.backend, options.request_id):
                            granted, fence = self._ask(lock, requested)
                except RateLimitedError as error:
                    # The HTTP service asked us to slow down: a blocking acquisition waits as
                    # long as it says (cut by the timeout) and counts that as an attempt; a
                    # single attempt (try_acquire) has nothing to wait for and raises it.
                    if attempts > retries:
                        raise
                    granted, fence, rate_limit_pause = False, None, error.retry_after
                except BackendUnavailableError as error:
                    # While the budget lasts an outage is one more failed attempt: the waiter
                    # rides it out on its retry schedule. A single attempt raises it at once.
                    if attempts == 1 and retries == 0:
                        raise
                    if outage is None:
                        _log_outage(lock.key, error)
                    granted, fence, unreachable, outage = False, None, True, error
                received = self.clock()
                # The local end of a granted lease, None when the grant came back too late.
                end = local_end(sent, requested, received) if granted else None
                if outage is not None and not unreachable:
                    logger.warning("backend reachable again while acquiring %r", lock.key)
                    outage = None
                if end is not None:
                    # A grant in time: the usual outcome, so judged first.
                    if cancel is not None and cancel.is_set():
                        # A winning attempt still in flight when the wait was cancelled is given
                        # back: nobody will use it.
                        give_back(self.backend, lock.key, lock.token)
                        reason = "cancelled"
                        break
                    if self.closed:
                        # close() ran while this attempt was in flight: nobody would extend or give
                        # back this lease, so it goes back now, and check_open() raises (a closed
                        # Locker never reopens).
                        give_back(self.backend, lock.key, lock.token)
                        self.check_open()
                    lock.hold_granted(sent, end, requested, fence, max_hold)
                    self.holds.add(lock)
                    # Checked here too so that the uncontended path builds no event fields.
                    if wanted(self.on_event, "acquired"):
                        self._emit(lock, "acquired", waited=received - start, attempts=attempts)
                    return
                if unreachable:
                    reason = "unavailable"
                    self._emit(
                        lock, "attempt_failed", attempt=attempts, elapsed=received - start, reason=reason, error=outage
                    )
                elif rate_limit_pause is not None:
                    reason = "held"
                elif granted:
                    # Granted, but the answer came back after the local lease had ended.
                    give_back(self.backend, lock.key, lock.token)
                    reason = "late-acquire"
                    self._emit(lock, "contended", attempt=attempts, elapsed=received - start, reason="late")
                else:
                    reason = "held"
                    self._emit(lock, "contended", attempt=attempts, elapsed=received - start, reason="held")
                if attempts > retries:
                    break
                elapsed = self.clock() - start
                left = timeout - elapsed
                if left <= 0:
                    reason = "timeout"
                    break
                if notify and wake is None:
                    # Registered only once the first attempt failed, which keeps uncontended
                    # acquisitions cheap. A release between that attempt and registering wakes
                    # nobody here, but the wait is bounded by the retry delay (and a wake-one
                    # watcher answers such a release as it queues the waiter).
                    try:
                        wake = self.dispatcher.register(lock.key)
                    except BackendUnavailableError as error:
                        # No notifications while the store is down: pace by the retry delay
                        # and try to subscribe again after the next failed attempt.
                        if outage is None:
                            _log_outage(lock.key, error)
                        outage = error
                if rate_limit_pause is not None:
                    pause = rate_limit_pause
                else:
                    # The policy's delay bounds every wait; while notifications flow, a release
                    # (or the holder's lease ending first) only brings the next attempt sooner.
                    pause = previous_delay = policy.delay_for(RetryState(attempts, elapsed, previous_delay))
                    if not unreachable and wake is not None and self.dispatcher.active and pause > 0:
                        sooner = self._sooner(lock.key) if reason == "held" else 0.0
                        if sooner is not None:
                            pause = min(pause, sooner)
                # A rate limit must be waited out in full: a release notification cannot end it.
                notified = self._pause(min(pause, left), wake if rate_limit_pause is None else None, cancel)
                if not notified and self.clock() - start >= timeout:
                    # The last wait is cut to the time left, and no attempt starts after the timeout.
                    reason = "timeout"
                    break
        finally:
            if wake is not None:
                self.dispatcher.unregister(lock.key, wake)
        elapsed = self.clock() - start
        if reason == "timeout":
            self._emit(lock, "timed_out", attempts=attempts, elapsed=elapsed)
        if unreachable and reason != "cancelled":
            # The wait ended with an attempt that could not reach the store: that is what it
            # says, not "held" (nobody answered that the key is held).
            assert outage is not None
            raise _unreachable(lock.key, attempts, elapsed, outage)
        raise LockHeldError(lock.key, attempts=attempts, elapsed=elapsed, reason=reason) from outage

    def _ask(self, lock: Lock, requested: float) -> tuple[bool, Optional[int]]:
        """One grant request to the backend: whether it granted, and the fence if fencing."""
        if self.fencing:
            fence = self.backend.acquire_fenced(lock.key, lock.token, requested, self.owner)
            return fence is not None, fence
        return self.backend.acquire(lock.key, lock.token, requested, self.owner), None

    def _sooner(self, key: str) -> Optional[float]:
        """How soon the next attempt may come while notifications flow, when the wake-one
        watcher knows it without a round trip (the holder's lease ending, or a kept turn),
        else ``None``."""
        known = self.dispatcher.lease_left(key)
        if known is None:
            return None
        return min(NOTIFIED_WAIT_CAP, max(known, 0.0))

    def _pause(self, seconds: float, wake: Optional[threading.Event], cancel: Optional[threading.Event]) -> bool:
        """Wait ``seconds`` on the lease clock (bounded in real time too); ``True`` if a release
        notification ended the wait early."""
        target = self.clock() + seconds
        real_deadline = time.monotonic() + seconds
        while True:
            left = min(target - self.clock(), real_deadline - time.monotonic())
            if left <= 0:
                return False
            if cancel is not None:
                if cancel.is_set():
                    return False
                left = min(left, _CANCEL_SLICE)
            if wake is not None:
                if wake.wait(left):
                    return True
            else:
                time.sleep(left)
