"""The :class:`Locker`: configuration, acquisition with retry and waiting, and lifecycle.

A Locker owns everything a backend does not: validation, retry and timeouts, the clock, the
heartbeat thread, release notifications, events and logging. Backends only answer atomic
primitives (see :mod:`lease_lock.backends.base`).
"""

from __future__ import annotations

import functools
import math
import os
import socket
import threading
import time
import warnings
import weakref
from dataclasses import replace
from datetime import timedelta
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, TypeVar, Union, cast

from .backends.base import Backend, LockState
from .clock import LeaseClock
from .errors import (
    BackendUnavailableError,
    LockHeldError,
    LockLostError,
    LockStateError,
    RateLimitedError,
    ValidationError,
)
from .events import EventHook, combine, logger, wanted
from .heartbeat import Heartbeat
from .leadership import Leadership
from .lock import LEASE_MARGIN, Lock
from .lockset import LockSet
from .options import LOCK_OPTIONS, LockOptions, check_extend_interval
from .reentry import ThreadHolds
from .retry import DEFAULT_RETRY, Retry, RetryState
from .validation import (
    check_bool,
    check_duration,
    check_key,
    check_owner,
    check_token,
    check_ttl,
)
from .waiting import ReleaseDispatcher

__all__ = ["Locker"]

_Function = TypeVar("_Function", bound=Callable[..., Any])
#: The longest a waiter sleeps between looks at a key while release notifications flow: the
#: holder's remaining lease or this, whichever is shorter.
NOTIFIED_WAIT_CAP = 1.0
#: How often a wait re-checks a cancel event.
_CANCEL_SLICE = 0.05

_LOCKERS: weakref.WeakSet[Locker] = weakref.WeakSet()
_DEFAULT_OPTIONS = LockOptions()
# try_acquire's options, built once: it is the hot path of skip-if-busy jobs.
_ONE_ATTEMPT = LockOptions(blocking=False)
_TRY_OPTION_NAMES = LOCK_OPTIONS - {"retry", "timeout", "blocking"}


class _Resources:
    """What a locker must free when it is closed or dropped: everything but the locker itself,
    so that a finalizer can hold it without keeping the locker alive."""

    def __init__(self, heartbeat: Heartbeat, dispatcher: ReleaseDispatcher, backend: Backend) -> None:
        self.heartbeat = heartbeat
        self.dispatcher = dispatcher
        self.backend = backend
        self.owns_backend = False

    @property
    def holds_anything(self) -> bool:
        """Whether freeing would end a thread, a subscription or a connection."""
        return self.owns_backend or self.heartbeat.thread is not None or self.dispatcher.watching

    def free(self, *, wait: bool) -> None:
        self.heartbeat.stop(wait=wait)
        self.dispatcher.close()
        if self.owns_backend:
            self.backend.close()


def _dropped(resources: _Resources, description: str) -> None:
    # The last reference to an open Locker went away (no close()). Its locks went first: each
    # lock keeps its locker alive, so none can still be read, and their leases run out on the
    # backend. Free the thread and connection, then warn like an unclosed file (a locker that
    # never opened anything has nothing to warn about). Freeing comes first because the
    # warning may be turned into an error.
    if not resources.holds_anything:
        return
    resources.free(wait=False)
    warnings.warn(f"unclosed {description}; call close() or use 'with'", ResourceWarning, stacklevel=2)


def _log_outage(key: str, error: BackendUnavailableError) -> None:
    # Once per outage of one acquisition, not once per attempt: each attempt is an
    # ``attempt_failed`` event (logged at debug level) already.
    logger.warning("backend unavailable while acquiring %r; retrying until the timeout: %s", key, error)


def _after_fork_in_child() -> None:
    for locker in list(_LOCKERS):
        locker._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class Locker:
    """Hands out leases on one backend.

    ``ttl`` and ``max_hold`` are the default lease length and hold deadline in seconds;
    ``retry`` merges over the built-in policy (wait up to ten seconds); ``key_prefix`` is put in
    front of every key; ``fencing=True`` gives every grant a fence; ``owner`` is the label stored
    beside each lease (default ``"<hostname>:<pid>"``); ``on_event`` receives every
    :class:`~lease_lock.LockEvent` (given a list of hooks, each receives every event);
    ``clock`` replaces the lease clock (tests); ``token_factory`` makes tokens (default: the
    backend's preferred form); ``reentrant=True`` makes a nested acquire of a key that the same
    thread already holds through this locker join that hold instead of contending with it (also
    a per-call option; see :meth:`acquire`).
    """

    def __init__(
        self,
        backend: Backend,
        *,
        ttl: Union[float, timedelta] = 30.0,
        max_hold: Union[float, timedelta] = 3600.0,
        retry: Optional[Retry] = None,
        key_prefix: str = "",
        fencing: bool = False,
        owner: Optional[str] = None,
        on_event: Union[EventHook, Sequence[EventHook], None] = None,
        clock: Optional[Callable[[], float]] = None,
        token_factory: Optional[Callable[[], str]] = None,
        reentrant: bool = False,
    ) -> None:
        settings = self.check_settings(
            ttl=ttl, max_hold=max_hold, retry=retry, key_prefix=key_prefix, fencing=fencing,
            owner=owner, on_event=on_event, clock=clock, token_factory=token_factory, reentrant=reentrant,
        )
        if not isinstance(backend, Backend):
            raise ValidationError(f"backend must be a lease_lock Backend, not {type(backend).__name__}")
        if settings["fencing"] and not backend.capabilities.fencing:
            raise ValidationError(f"fencing=True needs a backend with fencing; {type(backend).__name__} has none")
        self._backend = backend
        self.ttl: float = settings["ttl"]
        self.max_hold: float = settings["max_hold"]
        self.retry: Retry = DEFAULT_RETRY.merged(retry)
        self.key_prefix: str = key_prefix
        self.fencing: bool = fencing
        self.reentrant: bool = settings["reentrant"]
        self._thread_holds = ThreadHolds()
        self.owner: str = owner if owner is not None else f"{socket.gethostname()}:{os.getpid()}"
        self._default_owner = owner is None
        self._on_event: Optional[EventHook] = settings.get("on_event")
        self._clock: Callable[[], float] = clock or LeaseClock()
        self._token_factory = token_factory
        self._heartbeat = Heartbeat(backend, self._clock)
        self._dispatcher = ReleaseDispatcher(backend)
        self._held: weakref.WeakSet[Lock] = weakref.WeakSet()
        self._held_mutex = threading.Lock()
        self._closed = False
        self._resources = _Resources(self._heartbeat, self._dispatcher, backend)
        # Holds the resources, never the locker: the heartbeat thread, the watcher and the
        # backend do not keep a dropped locker alive, and dropping it frees them.
        self._finalizer = weakref.finalize(self, _dropped, self._resources, repr(self))
        # Like an unclosed file, a locker still open when the interpreter exits is not reported.
        self._finalizer.atexit = False
        _LOCKERS.add(self)

    @property
    def _owns_backend(self) -> bool:
        """Whether :meth:`close` (or dropping the locker) closes the backend too."""
        return self._resources.owns_backend

    @_owns_backend.setter
    def _owns_backend(self, owns: bool) -> None:
        self._resources.owns_backend = owns

    @staticmethod
    def check_settings(**settings: Any) -> dict[str, Any]:
        """Validate ``Locker`` keyword settings without building anything (``connect()`` uses
        this so that bad settings fail before a backend is created)."""
        known = {
            "ttl", "max_hold", "retry", "key_prefix", "fencing", "owner", "on_event", "clock", "token_factory",
            "reentrant",
        }
        unknown = set(settings) - known
        if unknown:
            raise ValidationError(f"unknown Locker option(s): {', '.join(sorted(unknown))}")
        checked = dict(settings)
        checked["ttl"] = check_ttl(settings.get("ttl", 30.0))
        checked["max_hold"] = check_duration(settings.get("max_hold", 3600.0), "max_hold", allow_inf=True)
        retry = settings.get("retry")
        if retry is not None and not isinstance(retry, Retry):
            raise ValidationError(f"retry must be a lease_lock.Retry, not {type(retry).__name__}")
        prefix = settings.get("key_prefix", "")
        if not isinstance(prefix, str):
            raise ValidationError(f"key_prefix must be a str, not {type(prefix).__name__}")
        if prefix:
            check_key(prefix, "key_prefix")
        checked["fencing"] = check_bool(settings.get("fencing", False), "fencing")
        checked["reentrant"] = check_bool(settings.get("reentrant", False), "reentrant")
        if settings.get("owner") is not None:
            check_owner(settings["owner"])
        if isinstance(settings.get("on_event"), (list, tuple)):
            # A list of hooks: each receives every event (see events.combine).
            checked["on_event"] = combine(settings["on_event"])
        for name in ("clock", "token_factory"):
            value = settings.get(name)
            if value is not None and not callable(value):
                raise ValidationError(f"{name} must be callable")
        if checked.get("on_event") is not None and not callable(checked["on_event"]):
            raise ValidationError("on_event must be callable or a list of callables")
        return checked

    # -- plumbing ------------------------------------------------------------------------------

    @property
    def backend(self) -> Backend:
        """The backend this locker uses."""
        return self._backend

    @property
    def heartbeat(self) -> Heartbeat:
        """The heartbeat serving this locker's locks (``run_due()`` is handy in tests)."""
        return self._heartbeat

    @property
    def closed(self) -> bool:
        """``True`` after :meth:`close`."""
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise LockStateError("this Locker is closed")

    def _full_key(self, key: object, name: str = "key") -> str:
        full = check_key(key, name)
        if self.key_prefix:
            full = check_key(self.key_prefix + full, name)
        self._backend.check_key(full)
        return full

    def _new_token(self) -> str:
        if self._token_factory is None:
            return self._backend.new_token()
        token = check_token(self._token_factory(), "token_factory()")
        self._backend.check_token(token)
        return token

    def _forget(self, lock: Lock) -> None:
        with self._held_mutex:
            self._held.discard(lock)

    def _after_fork(self) -> None:
        # Locks that a parent thread held at the fork stay locked for ever in the child: renew
        # the clock and the heartbeat first, since marking the locks lost reads the clock.
        self._held_mutex = threading.Lock()
        if isinstance(self._clock, LeaseClock):
            self._clock.after_fork()
        self._heartbeat.after_fork()
        for lock in list(self._held):
            lock._forked()
        self._held = weakref.WeakSet()
        self._dispatcher.after_fork()
        self._thread_holds = ThreadHolds()
        if self._default_owner:
            self.owner = f"{socket.gethostname()}:{os.getpid()}"

    # -- making locks --------------------------------------------------------------------------

    def lock(self, key: str, ttl: Optional[float] = None, **opts: Any) -> Lock:
        """An unacquired :class:`Lock` on ``key``; ``with`` acquires and releases it."""
        return self._make_lock(key, ttl, LockOptions.from_kwargs(opts) if opts else _DEFAULT_OPTIONS)

    def _make_lock(self, key: str, ttl: Optional[float], options: LockOptions) -> Lock:
        self._check_open()
        full_key = self._full_key(key)
        lease = self.ttl if ttl is None else check_ttl(ttl)
        check_extend_interval(options.extend_interval, lease)
        if options.token is not None:
            self._backend.check_token(options.token)
            token = options.token
        else:
            token = self._new_token()
        return Lock(self, full_key, lease, options, token)

    def acquire(self, key: str, ttl: Optional[float] = None, **opts: Any) -> Lock:
        """A held :class:`Lock`; raises ``LockHeldError`` when the retry budget is spent.

        With ``reentrant=True`` (here or on the Locker), when the calling thread already holds
        ``key`` through this locker the returned lock joins that lease without asking the
        store: one more hold, given up by its own ``release()`` or ``with`` exit; the key is
        released when the last hold is. Without it a nested acquire contends with the outer
        hold like any other holder, and its ``LockHeldError`` says so.

        While the budget lasts, a store that cannot be reached (``BackendUnavailableError``)
        is one more failed attempt (an ``attempt_failed`` event): the call keeps trying on its
        retry schedule, and a timeout spent that way has the last such error as ``__cause__``.
        A non-blocking call raises ``BackendUnavailableError`` at once.
        """
        lock = self.lock(key, ttl, **opts)
        self._acquire_lock(lock, lock._options, raise_on_contention=True)
        return lock

    def try_acquire(self, key: str, ttl: Optional[float] = None, **opts: Any) -> Optional[Lock]:
        """Exactly one attempt: a held :class:`Lock`, or ``None`` when another holder has it.

        A grant that came back after its local lease ended raises
        ``LockHeldError(reason="late-acquire")`` instead, since then nobody holds the key. A
        store that cannot be reached raises ``BackendUnavailableError``.
        """
        if opts:
            options = replace(LockOptions.from_kwargs(opts, allowed=_TRY_OPTION_NAMES), blocking=False)
        else:
            options = _ONE_ATTEMPT
        lock = self._make_lock(key, ttl, options)
        try:
            self._acquire_lock(lock, lock._options, raise_on_contention=True)
        except LockHeldError as error:
            # None means "another holder has the key" and nothing else: every other failure raises.
            if error.reason != "held":
                raise
            return None
        return lock

    def locked(
        self, key: Union[str, Callable[..., str]], ttl: Optional[float] = None, *, skip: bool = False, **opts: Any
    ) -> Callable[[_Function], _Function]:
        """A decorator running the function under a fresh lock per call.

        ``key`` may be a callable receiving the call's arguments. With ``skip=True`` the lock
        makes one attempt (unless ``blocking`` or ``timeout`` is given) and a busy key returns
        ``None`` without running; otherwise contention raises ``LockHeldError``. The ``with``
        outcome order applies; ``LockLostError.result`` carries the return value.
        """
        self._check_open()
        check_bool(skip, "skip")
        if skip and "blocking" not in opts and "timeout" not in opts:
            opts = {**opts, "blocking": False}
        options = LockOptions.from_kwargs(opts)
        lease = None if ttl is None else check_ttl(ttl)
        check_extend_interval(options.extend_interval, self.ttl if lease is None else lease)
        if not callable(key):
            self._full_key(key)

        def decorator(function: _Function) -> _Function:
            @functools.wraps(function)
            def guarded(*args: Any, **kwargs: Any) -> Any:
                name = key(*args, **kwargs) if callable(key) else key
                lock = self._make_lock(name, lease, options)
                try:
                    self._acquire_lock(lock, options, raise_on_contention=True)
                except LockHeldError as error:
                    if skip and error.reason != "late-acquire":
                        return None
                    raise
                return lock._run(function, *args, **kwargs)

            return cast(_Function, guarded)

        return decorator

    def acquire_many(self, keys: Iterable[str], ttl: Optional[float] = None, **opts: Any) -> LockSet:
        """Hold every key or none: deduplicated, sorted, acquired in order.

        ``timeout`` covers the whole set and ``retry.retries`` applies to each key. On failure
        the locks already taken are released and ``LockHeldError`` is raised. After the last
        grant the earlier leases are extended so that all of them overlap. A set never joins
        holds of the calling thread (``reentrant`` does not apply).
        """
        if "token" in opts:
            raise ValidationError("token cannot be given to acquire_many: each lock needs its own")
        if opts.get("reentrant"):
            raise ValidationError("reentrant=True cannot be given to acquire_many: a set holds its own leases")
        opts = {**opts, "reentrant": False}
        if isinstance(keys, str) or not isinstance(keys, Iterable):
            raise ValidationError("keys must be an iterable of str (not a single str)")
        options = LockOptions.from_kwargs(opts)
        wanted = list(keys)
        for name in wanted:
            self._full_key(name, "keys[]")
        names = sorted(set(wanted))
        if not names:
            raise ValidationError("keys must not be empty")
        locks = [self._make_lock(name, ttl, options) for name in names]
        policy = self.retry.merged(options.retry)
        budget = policy.timeout if policy.timeout is not None else math.inf
        start = self._clock()
        taken: list[Lock] = []
        try:
            for lock in locks:
                left = max(0.0, budget - (self._clock() - start))
                step = options.with_attempt_budget(None, left if math.isfinite(left) else math.inf)
                self._acquire_lock(lock, step, raise_on_contention=True)
                taken.append(lock)
            for lock in taken[:-1]:
                try:
                    lock.extend()
                except LockLostError as error:
                    # An earlier lease ran out before the last key was granted: the set as a
                    # whole came back too late to be held together.
                    raise LockHeldError(
                        lock.key, attempts=1, elapsed=self._clock() - start, reason="late-acquire"
                    ) from error
        except BaseException:
            for lock in taken:
                # The original failure is what the caller must see; a failed give-back here
                # becomes a release_failed event and the lease runs out on its own.
                lock._release_on_exit()
            raise
        return LockSet(tuple(taken))

    def elect(
        self,
        key: str,
        *,
        on_elected: Optional[Callable[[Lock], object]] = None,
        on_revoked: Optional[Callable[[str], object]] = None,
        ttl: Optional[float] = None,
    ) -> Leadership:
        """Campaign for leadership of ``key`` in the background; see :class:`~lease_lock.Leadership`.

        The holder of ``key`` is the leader; it keeps the key with the heartbeat, calls
        ``on_revoked(reason)`` when the lease is lost and campaigns again. With
        ``fencing=True`` each term has a larger fence than the one before.
        """
        self._check_open()
        return Leadership(self, key, on_elected=on_elected, on_revoked=on_revoked, ttl=ttl)

    # -- acquisition ---------------------------------------------------------------------------

    def _acquire_lock(self, lock: Lock, options: LockOptions, *, raise_on_contention: bool) -> bool:
        self._check_open()
        lock._start_acquiring()
        try:
            reentrant = self.reentrant if options.reentrant is None else options.reentrant
            if reentrant:
                outer = self._thread_holds.find(lock.key)
                if outer is not None and lock._join(outer):
                    return True
            self._attempt(lock, options)
        except LockHeldError as error:
            if not raise_on_contention:
                return False
            explained = self._thread_holds.explain(lock.key, error)
            if explained is error:
                raise
            raise explained from None
        finally:
            lock._stop_acquiring()
        self._thread_holds.note(lock)
        return True

    def _max_hold_for(self, options: LockOptions) -> Optional[float]:
        if options.max_hold is not None:
            return options.max_hold if math.isfinite(options.max_hold) else None
        if options.auto_extend and math.isfinite(self.max_hold):
            return self.max_hold
        return None

    def _attempt(self, lock: Lock, options: LockOptions) -> None:
        """The retry loop: attempts paced by the retry policy until its timeout.

        Returns on a grant, raises ``LockHeldError`` otherwise."""
        policy = self.retry.merged(options.retry)
        retries = policy.retries if options.blocking else 0
        assert retries is not None and policy.timeout is not None
        timeout = policy.timeout if options.blocking else math.inf
        max_hold = self._max_hold_for(options)
        requested = min(lock.ttl, max_hold) if max_hold is not None else lock.ttl
        notify = self._dispatcher.available and options.blocking and retries > 0
        cancel = options.cancel
        wake: Optional[threading.Event] = None
        start = sent = self._clock()
        attempts = 0
        previous_delay: Optional[float] = None
        reason = "held"
        # The error of the latest attempt that could not reach the store (None once an attempt
        # is answered again): the cause of a timeout, and what a spent retry budget raises.
        outage: Optional[BackendUnavailableError] = None
        try:
            while True:
                self._check_open()
                if cancel is not None and cancel.is_set():
                    reason = "cancelled"
                    break
                if wake is not None:
                    wake.clear()
                if attempts:
                    sent = self._clock()
                attempts += 1
                rate_limit_pause: Optional[float] = None
                unreachable = False
                try:
                    if options.request_id is None:
                        granted, fence = self._ask(lock, requested)
                    else:
                        with self._backend.request_id_scope(options.request_id):
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
                    if attempts > retries:
                        raise
                    if outage is None:
                        _log_outage(lock.key, error)
                    granted, fence, unreachable, outage = False, None, True, error
                received = self._clock()
                if not unreachable and outage is not None:
                    logger.warning("backend reachable again while acquiring %r", lock.key)
                    outage = None
                if unreachable:
                    reason = "unavailable"
                    lock._emit(
                        "attempt_failed", attempt=attempts, elapsed=received - start, reason=reason, error=outage
                    )
                elif rate_limit_pause is not None:
                    reason = "held"
                elif granted and received >= sent + requested * (1 - LEASE_MARGIN):
                    lock._give_back()
                    reason = "late-acquire"
                    self._emit_contended(lock, attempts, received - start, "late")
                elif granted and cancel is not None and cancel.is_set():
                    # A winning attempt still in flight when the wait was cancelled is given back: nobody will use it.
                    lock._give_back()
                    reason = "cancelled"
                    break
                elif granted and self._closed:
                    # close() ran while this attempt was in flight: nobody would extend or give
                    # back this lease, so it goes back now.
                    lock._give_back()
                    self._check_open()
                elif granted:
                    lock._grant(sent, requested, fence, max_hold)
                    with self._held_mutex:
                        self._held.add(lock)
                    # Checked here too so that the uncontended path builds no event fields.
                    if wanted(self._on_event, "acquired"):
                        lock._emit("acquired", waited=received - start, attempts=attempts)
                    return
                else:
                    reason = "held"
                    self._emit_contended(lock, attempts, received - start, "held")
                if attempts > retries:
                    if outage is not None:
                        # The last attempt could not reach the store: say so, not "held".
                        raise outage
                    break
                elapsed = self._clock() - start
                left = timeout - elapsed
                if left <= 0:
                    reason = "timeout"
                    break
                if notify and wake is None:
                    # Registered only once the first attempt failed, which keeps uncontended
                    # acquisitions cheap. No release is missed: the holder_wait() look at the
                    # key below happens after registering and finds a key freed before it.
                    try:
                        wake = self._dispatcher.register(lock.key)
                    except BackendUnavailableError as error:
                        # No notifications while the store is down: pace by the retry delay
                        # and try to subscribe again after the next failed attempt.
                        if outage is None:
                            _log_outage(lock.key, error)
                        outage = error
                pause = None
                if rate_limit_pause is not None:
                    pause = rate_limit_pause
                elif not unreachable and wake is not None and self._dispatcher.active:
                    try:
                        pause = self._holder_wait(lock.key) if reason == "held" else 0.0
                    except BackendUnavailableError as error:
                        # The store went away between the attempt and this look: pace the
                        # next attempt by the retry delay, as after a failed attempt.
                        if outage is None:
                            _log_outage(lock.key, error)
                        outage = error
                if pause is None:
                    pause = policy.delay_for(RetryState(attempts, elapsed, previous_delay))
                    previous_delay = pause
                # A rate limit must be waited out in full: a release notification cannot end it.
                notified = self._pause(min(pause, left), wake if rate_limit_pause is None else None, cancel)
                if not notified and self._clock() - start >= timeout:
                    # The last wait is cut to the time left, and no attempt starts after the timeout.
                    reason = "timeout"
                    break
        finally:
            if wake is not None:
                self._dispatcher.unregister(lock.key, wake)
        elapsed = self._clock() - start
        if reason == "timeout":
            lock._emit("timed_out", attempts=attempts, elapsed=elapsed)
        raise LockHeldError(lock.key, attempts=attempts, elapsed=elapsed, reason=reason) from outage

    def _ask(self, lock: Lock, requested: float) -> tuple[bool, Optional[int]]:
        """One grant request to the backend: whether it granted, and the fence if fencing."""
        if self.fencing:
            fence = self._backend.acquire_fenced(lock.key, lock.token, requested, self.owner)
            return fence is not None, fence
        return self._backend.acquire(lock.key, lock.token, requested, self.owner), None

    def _emit_contended(self, lock: Lock, attempt: int, elapsed: float, reason: str) -> None:
        lock._emit("contended", attempt=attempt, elapsed=elapsed, reason=reason)

    def _holder_wait(self, key: str) -> float:
        """How long to sleep while notifications flow: the holder's remaining lease, at most a
        second, and never sooner (a release notification cuts it short)."""
        known = self._dispatcher.lease_left(key)  # a wake-one watcher may know it already
        remaining = self._backend.inspect(key).expires_in if known is None else known
        if remaining is None:
            return 0.0
        return min(NOTIFIED_WAIT_CAP, max(remaining, 0.0))

    def _pause(self, seconds: float, wake: Optional[threading.Event], cancel: Optional[threading.Event]) -> bool:
        """Wait ``seconds`` on the lease clock (bounded in real time too); ``True`` if a release
        notification ended the wait early."""
        target = self._clock() + seconds
        real_deadline = time.monotonic() + seconds
        while True:
            left = min(target - self._clock(), real_deadline - time.monotonic())
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

    # -- inspection and administration ---------------------------------------------------------

    def _visible(self, state: LockState) -> LockState:
        if not self.fencing and state.fence is not None:
            return replace(state, fence=None)
        return state

    def get(self, key: str) -> LockState:
        """The state of ``key`` (prefix applied); no token needed."""
        self._check_open()
        return self._visible(self._backend.inspect(self._full_key(key)))

    def list(self, prefix: str = "") -> Iterator[LockState]:
        """Held keys under ``key_prefix + prefix``, for backends that can scan."""
        self._check_open()
        if not isinstance(prefix, str):
            raise ValidationError(f"prefix must be a str, not {type(prefix).__name__}")
        if prefix or self.key_prefix:
            # A prefix obeys the key rules (no NUL, at most 1024 bytes with the key prefix).
            check_key(self.key_prefix + prefix, "prefix")
        if not self._backend.capabilities.scan:
            raise ValidationError(f"{type(self._backend).__name__} cannot list keys")
        return (self._visible(state) for state in self._backend.scan(self.key_prefix + prefix))

    def force_release(self, key: str) -> bool:
        """Drop whatever token holds ``key``; ``True`` when a live lease was dropped."""
        self._check_open()
        return self._backend.force_release(self._full_key(key))

    def close(self) -> None:
        """Stop the heartbeat, give back every lock still held (each reads lost, reason
        ``"closed"``) and close what the locker opened. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._finalizer.detach()
        self._heartbeat.stop()
        self._dispatcher.close()
        with self._held_mutex:
            held = list(self._held)
            self._held = weakref.WeakSet()
        for lock in held:
            lock._close()
        if self._owns_backend:
            self._backend.close()
        _LOCKERS.discard(self)

    def __enter__(self) -> Locker:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<Locker {type(self._backend).__name__} prefix={self.key_prefix!r} {state}>"

