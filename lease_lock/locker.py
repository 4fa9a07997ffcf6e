"""The :class:`Locker`: configuration, building locks, and lifecycle.

A Locker validates its settings and each call's key and options, makes tokens and
:class:`~lease_lock.Lock` objects, and hands them to its :class:`~lease_lock._acquisition.Acquisition`,
which asks the backend (retry, waiting, timeouts, outages) and serves each lock its clock,
heartbeat and events. A ``ttl`` goes from :meth:`Locker.acquire` into the ``Lock``, to the
acquisition's request to the backend, and from the grant (judged by
:func:`lease_lock._lease.local_end`) to the lock's heartbeat timer (:mod:`lease_lock.heartbeat`).
Backends only answer atomic primitives (see :mod:`lease_lock.backends.base`).
"""

from __future__ import annotations

import functools
import math
import os
import socket
import threading
import warnings
import weakref
from dataclasses import replace
from datetime import timedelta
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, TypeVar, Union, cast

from ._acquisition import Acquisition
from ._lease import Lock, acquire_as, acquire_or_raise, close_lease, fork_lease, give_up, refresh_together, run_guarded
from .backends.base import Backend, LockState
from .backends.service import request_id_scope
from .clock import LeaseClock
from .errors import LockHeldError, LockLostError, ValidationError
from .events import EventHook
from .heartbeat import Heartbeat
from .leadership import Leadership
from .lockset import LockSet
from .options import (
    LOCK_OPTIONS,
    NOT_GIVEN,
    LockOptions,
    Seconds,
    check_extend_interval,
    check_locker_options,
    check_request_id,
    given_options,
    lock_options,
)
from .retry import DEFAULT_RETRY, Retry
from .validation import (
    check_bool,
    check_key,
    check_token,
    check_ttl,
)

__all__ = ["Locker"]

_Function = TypeVar("_Function", bound=Callable[..., Any])

_LOCKERS: weakref.WeakSet[Locker] = weakref.WeakSet()
_DEFAULT_OPTIONS = LockOptions()
# try_acquire's options, built once: it is the hot path of skip-if-busy jobs.
_ONE_ATTEMPT = LockOptions(blocking=False)
#: The options each call gave, read from its ``locals()``: try_acquire takes no waiting options.
_GIVEN = given_options(LOCK_OPTIONS)
_GIVEN_TO_TRY = given_options(LOCK_OPTIONS - {"retry", "timeout", "blocking"})
#: How many validated keys a Locker remembers before it starts afresh.
_CHECKED_KEYS = 4096


def _check_counting(backend: Backend, limit: int) -> None:
    """Refuse ``limit`` > 1 on a backend that grants no counting leases, before anything is written."""
    if limit > 1 and not backend.capabilities.counting:
        raise ValidationError(
            f"limit={limit} needs a backend that grants counting leases; {type(backend).__name__} does not"
        )


class _Resources:
    """What a locker must free when it is closed or dropped: everything but the locker itself,
    so that a finalizer can hold it without keeping the locker alive."""

    def __init__(self, heartbeat: Heartbeat, backend: Backend, owns_backend: bool) -> None:
        self.heartbeat = heartbeat
        self.backend = backend
        self.owns_backend = owns_backend

    @property
    def holds_anything(self) -> bool:
        """Whether freeing would end a thread or a connection."""
        return self.owns_backend or self.heartbeat.thread is not None

    def free(self, *, wait: bool) -> None:
        self.heartbeat.stop(wait=wait)
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
    a per-call option; see :meth:`acquire`); ``limit=N`` makes a key admit up to N leases at once
    (a counting lease; 1, the default, is exclusive; also a per-call option).

    ``heartbeat_thread=False`` runs no heartbeat thread: the program does the heartbeat's work
    itself by calling :meth:`run_heartbeat`, on its own schedule (an injected ``clock``'s tests
    move time and then call it; an event loop calls it at least every third of the shortest TTL).
    ``owns_backend=True`` makes :meth:`close` (or dropping the locker) close ``backend`` too, as a
    locker from :func:`~lease_lock.connect` does with the backend it built.
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
        heartbeat_thread: bool = True,
        owns_backend: bool = False,
        limit: int = 1,
    ) -> None:
        settings = check_locker_options(
            ttl=ttl, max_hold=max_hold, retry=retry, key_prefix=key_prefix, fencing=fencing,
            owner=owner, on_event=on_event, clock=clock, token_factory=token_factory, reentrant=reentrant,
            heartbeat_thread=heartbeat_thread, limit=limit,
        )
        check_bool(owns_backend, "owns_backend")
        if not isinstance(backend, Backend):
            raise ValidationError(f"backend must be a lease_lock Backend, not {type(backend).__name__}")
        if settings["fencing"] and not backend.capabilities.fencing:
            raise ValidationError(f"fencing=True needs a backend with fencing; {type(backend).__name__} has none")
        _check_counting(backend, settings["limit"])
        self._backend = backend
        self.ttl: float = settings["ttl"]
        self.key_prefix: str = key_prefix
        # Keys already validated under ``_checked_prefix`` (see _full_key).
        self._checked_keys: dict[str, str] = {}
        self._checked_prefix = key_prefix
        self._default_owner = owner is None
        self._clock: Callable[[], float] = clock or LeaseClock()
        self._token_factory = token_factory
        # Everything from a request for a key to its grant lives in the acquisition, which also
        # serves the locks this locker makes (their clock, backend, heartbeat and event hook).
        self._acquisition = Acquisition(
            backend,
            self._clock,
            retry=DEFAULT_RETRY.merged(retry),
            max_hold=settings["max_hold"],
            fencing=fencing,
            owner=owner if owner is not None else f"{socket.gethostname()}:{os.getpid()}",
            reentrant=settings["reentrant"],
            on_event=settings.get("on_event"),
            limit=settings["limit"],
        )
        self._heartbeat = self._acquisition.heartbeat
        # Set before any lock exists: the thread starts with the first lock to look after.
        self._heartbeat.threaded = settings["heartbeat_thread"]
        self._resources = _Resources(self._heartbeat, backend, owns_backend)
        # Holds the resources, never the locker: the heartbeat thread and the
        # backend do not keep a dropped locker alive, and dropping it frees them.
        self._finalizer = weakref.finalize(self, _dropped, self._resources, repr(self))
        # Like an unclosed file, a locker still open when the interpreter exits is not reported.
        self._finalizer.atexit = False  # type: ignore[misc,unused-ignore]  # typeshed for 3.9 lists no atexit slot
        _LOCKERS.add(self)

    @property
    def max_hold(self) -> float:
        """The default hold deadline in seconds (``inf``: none)."""
        return self._acquisition.max_hold

    @property
    def retry(self) -> Retry:
        """The retry policy acquisitions start from (a call's ``retry`` merges over it)."""
        return self._acquisition.retry

    @property
    def fencing(self) -> bool:
        """Whether every grant carries a fence."""
        return self._acquisition.fencing

    @property
    def owner(self) -> str:
        """The label stored beside each lease."""
        return self._acquisition.owner

    @property
    def limit(self) -> int:
        """How many leases a key admits at once unless a call says otherwise (1: exclusive)."""
        return self._acquisition.limit

    @property
    def reentrant(self) -> bool:
        """Whether a nested acquire by the holding thread joins its hold by default."""
        return self._acquisition.reentrant

    # -- plumbing ------------------------------------------------------------------------------

    @property
    def backend(self) -> Backend:
        """The backend this locker uses."""
        return self._backend

    def run_heartbeat(self) -> int:
        """Do the heartbeat's due work now, on the calling thread: extend the leases whose
        extension is due on the lease clock, report the ones that ran out, and give back the
        leases of locks dropped while held. Returns how many lock timers fell due.

        A locker built with ``heartbeat_thread=False`` relies on it; with the thread it is
        never needed (calling it anyway is harmless)."""
        return self._heartbeat.run_due()

    @property
    def closed(self) -> bool:
        """``True`` after :meth:`close`."""
        return self._acquisition.closed

    def _check_open(self) -> None:
        self._acquisition.check_open()

    def _full_key(self, key: object, name: str = "key") -> str:
        # Most programs lock a few keys over and over: a key checked once (with this prefix)
        # is looked up instead of checked again. ``key_prefix`` is a public attribute, so a
        # changed prefix empties the cache.
        if type(key) is str:
            if self._checked_prefix is not self.key_prefix:
                self._checked_keys = {}
                self._checked_prefix = self.key_prefix
            full = self._checked_keys.get(key)
            if full is not None:
                return full
        full = check_key(key, name)
        prefix = self.key_prefix
        if prefix:
            full = check_key(prefix + full, name)
        self._backend.check_key(full)
        if type(key) is str and self._checked_prefix is prefix:
            if len(self._checked_keys) >= _CHECKED_KEYS:
                self._checked_keys = {}
            self._checked_keys[key] = full
        return full

    def _factory_token(self) -> str:
        assert self._token_factory is not None
        token = check_token(self._token_factory(), "token_factory()")
        self._backend.check_token(token)
        return token

    def _after_fork(self) -> None:
        # Locks that a parent thread held at the fork stay locked for ever in the child: renew
        # the clock and the heartbeat first, since marking the locks lost reads the clock.
        if isinstance(self._clock, LeaseClock):
            self._clock.after_fork()
        for lock in self._acquisition.after_fork():
            fork_lease(lock)
        if self._default_owner:
            self._acquisition.owner = f"{socket.gethostname()}:{os.getpid()}"

    # -- making locks --------------------------------------------------------------------------

    def lock(
        self,
        key: str,
        ttl: Optional[Seconds] = None,
        *,
        retry: Optional[Retry] = None,
        timeout: Optional[Seconds] = None,
        blocking: bool = True,
        cancel: Optional[threading.Event] = None,
        auto_extend: bool = True,
        max_hold: Optional[Seconds] = None,
        extend_interval: Optional[Seconds] = None,
        token: Optional[str] = None,
        request_id: Optional[str] = None,
        reentrant: Optional[bool] = None,
        limit: Optional[int] = None,
    ) -> Lock:
        """An unacquired :class:`Lock` on ``key``; ``with`` acquires and releases it.

        The options (keyword only) are those of :meth:`acquire`, taken when the lock is acquired.
        """
        # Most calls give no option. Saying so with identity checks spares reading locals(): some
        # 11,000 instructions of a cycle (benchmarks.instructions). The checks name every option:
        # tests/unit/test_option_types.py passes each one a bad value.
        defaults = (
            retry is None
            and timeout is None
            and blocking is True
            and cancel is None
            and auto_extend is True
            and max_hold is None
            and extend_interval is None
            and token is None
            and request_id is None
            and reentrant is None
            and limit is None
        )
        if not defaults:
            return self._make_lock(key, ttl, lock_options(_GIVEN(locals())))
        # The usual call (a key locked before, its default TTL) builds its lock here, without the
        # checks and calls of _make_lock: each call is a few hundred instructions of a cycle.
        if (
            ttl is None
            and type(key) is str
            and self._token_factory is None
            and self._checked_prefix is self.key_prefix
            and not self._acquisition.closed
        ):
            full_key = self._checked_keys.get(key)
            if full_key is not None:
                return Lock(self._acquisition, full_key, self.ttl, _DEFAULT_OPTIONS, self._backend.new_token(), self)
        return self._make_lock(key, ttl, _DEFAULT_OPTIONS)

    def _make_lock(self, key: str, ttl: Optional[Seconds], options: LockOptions, made_by: str = "lock") -> Lock:
        if self._acquisition.closed:
            self._check_open()
        full_key = self._full_key(key)
        lease = self.ttl if ttl is None else check_ttl(ttl)
        if options.extend_interval is not None:
            check_extend_interval(options.extend_interval, lease)
        if options.limit is not None:
            _check_counting(self._backend, options.limit)
        if options.token is not None:
            self._backend.check_token(options.token)
            token = options.token
        elif self._token_factory is None:
            token = self._backend.new_token()
        else:
            token = self._factory_token()
        return Lock(self._acquisition, full_key, lease, options, token, self, made_by)

    def acquire(
        self,
        key: str,
        ttl: Optional[Seconds] = None,
        *,
        retry: Optional[Retry] = None,
        timeout: Optional[Seconds] = None,
        blocking: bool = True,
        cancel: Optional[threading.Event] = None,
        auto_extend: bool = True,
        max_hold: Optional[Seconds] = None,
        extend_interval: Optional[Seconds] = None,
        token: Optional[str] = None,
        request_id: Optional[str] = None,
        reentrant: Optional[bool] = None,
        limit: Optional[int] = None,
    ) -> Lock:
        """A held :class:`Lock`; raises ``LockHeldError`` when the retry budget is spent.

        The options are keyword only; a name that is not one of them raises ``TypeError`` and a
        bad value ``ValidationError``. ``retry`` and ``timeout`` shape the attempts (``timeout``
        overrides ``retry.timeout``), ``blocking=False`` makes one, ``cancel`` (a
        ``threading.Event``) stops the wait; ``auto_extend``, ``max_hold`` and
        ``extend_interval`` shape the heartbeat; ``token`` is the lock's own token,
        ``request_id`` the id of its requests to the store. ``None`` means the locker's default.

        With ``reentrant=True`` (here or on the Locker), when the calling thread already holds
        ``key`` through this locker the returned lock joins that lease without asking the
        store: one more hold, given up by its own ``release()`` or ``with`` exit; the key is
        released when the last hold is. Without it a nested acquire contends with the outer
        hold like any other holder, and its ``LockHeldError`` says so.

        ``limit=N`` (here or on the Locker) takes one of the N places of a counting key: up to
        N holders at once, each with a lease, heartbeat and fence of its own; an acquire beyond
        them contends as on a held key. Every holder of a key must use one limit: another one
        raises ``ValidationError`` naming both, and a backend that cannot count refuses
        ``limit > 1`` the same way.

        While the budget lasts, a store that cannot be reached (``BackendUnavailableError``)
        is one more failed attempt (an ``attempt_failed`` event): the call keeps trying on its
        retry schedule. When the budget is spent, the error describes the last attempt: one
        that could not reach the store raises ``BackendUnavailableError`` (how many attempts
        over how long, the driver's error as ``__cause__``); ``LockHeldError`` means the store
        answered that the key is held. A non-blocking call raises ``BackendUnavailableError``
        at once.
        """
        lock = self.lock(
            key, ttl, retry=retry, timeout=timeout, blocking=blocking, cancel=cancel, auto_extend=auto_extend,
            max_hold=max_hold, extend_interval=extend_interval, token=token, request_id=request_id,
            reentrant=reentrant, limit=limit,
        )
        acquire_as(lock, "acquire")
        return lock

    def try_acquire(
        self,
        key: str,
        ttl: Optional[Seconds] = None,
        *,
        cancel: Optional[threading.Event] = None,
        auto_extend: bool = True,
        max_hold: Optional[Seconds] = None,
        extend_interval: Optional[Seconds] = None,
        token: Optional[str] = None,
        request_id: Optional[str] = None,
        reentrant: Optional[bool] = None,
        limit: Optional[int] = None,
    ) -> Optional[Lock]:
        """Exactly one attempt: a held :class:`Lock`, or ``None`` when another holder has it.

        The options are those of :meth:`acquire` but ``retry``, ``timeout`` and ``blocking``.

        A grant that came back after its local lease ended raises
        ``LockHeldError(reason="late-acquire")`` instead, since then nobody holds the key. A
        store that cannot be reached raises ``BackendUnavailableError``.
        """
        if (
            cancel is None
            and auto_extend is True
            and max_hold is None
            and extend_interval is None
            and token is None
            and request_id is None
            and reentrant is None
            and limit is None
        ):
            options = _ONE_ATTEMPT
        else:
            options = replace(LockOptions.from_kwargs(_GIVEN_TO_TRY(locals())), blocking=False)
        lock = self._make_lock(key, ttl, options, "try_acquire")
        try:
            acquire_or_raise(lock, options)
        except LockHeldError as error:
            # None means "another holder has the key" and nothing else: every other failure raises.
            if error.reason != "held":
                raise
            return None
        return lock

    def locked(
        self,
        key: Union[str, Callable[..., str]],
        ttl: Optional[Seconds] = None,
        *,
        skip: bool = False,
        retry: Optional[Retry] = None,
        timeout: Optional[Seconds] = None,
        blocking: bool = NOT_GIVEN,
        cancel: Optional[threading.Event] = None,
        auto_extend: bool = True,
        max_hold: Optional[Seconds] = None,
        extend_interval: Optional[Seconds] = None,
        token: Optional[str] = None,
        request_id: Optional[str] = None,
        reentrant: Optional[bool] = None,
        limit: Optional[int] = None,
    ) -> Callable[[_Function], _Function]:
        """A decorator running the function under a fresh lock per call.

        ``key`` may be a callable receiving the call's arguments. With ``skip=True`` the lock
        makes one attempt (unless ``blocking`` or ``timeout`` is given) and a busy key returns
        ``None`` without running; otherwise contention raises ``LockHeldError``. The ``with``
        outcome order applies; ``LockLostError.result`` carries the return value. The other
        options are those of :meth:`acquire`.
        """
        opts = _GIVEN(locals())
        self._check_open()
        check_bool(skip, "skip")
        if skip and blocking is NOT_GIVEN and "timeout" not in opts:
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
                lock = self._make_lock(name, lease, options, "locked")
                try:
                    acquire_or_raise(lock, options)
                except LockHeldError as error:
                    if skip and error.reason != "late-acquire":
                        return None
                    raise
                return run_guarded(lock, function, *args, **kwargs)

            return cast(_Function, guarded)

        return decorator

    def acquire_many(
        self,
        keys: Iterable[str],
        ttl: Optional[Seconds] = None,
        *,
        retry: Optional[Retry] = None,
        timeout: Optional[Seconds] = None,
        blocking: bool = True,
        cancel: Optional[threading.Event] = None,
        auto_extend: bool = True,
        max_hold: Optional[Seconds] = None,
        extend_interval: Optional[Seconds] = None,
        token: None = None,
        request_id: Optional[str] = None,
        reentrant: Optional[bool] = None,
        limit: Optional[int] = None,
    ) -> LockSet:
        """Hold every key or none: deduplicated, sorted, acquired in order.

        ``timeout`` covers the whole set and ``retry.retries`` applies to each key. On failure
        the locks already taken are released and ``LockHeldError`` is raised. After the last
        grant, every earlier lease that has run for more than 1% of its TTL (a wait for a
        later key) is renewed, in one round trip where the store batches extensions, so that
        the set's leases end within 1% of a TTL of each other. A set never joins
        holds of the calling thread (``reentrant`` does not apply). The other options are those
        of :meth:`acquire` but ``token``.
        """
        opts = _GIVEN(locals())
        if "token" in opts:
            raise ValidationError("token cannot be given to acquire_many: each lock needs its own")
        if opts.get("reentrant"):
            raise ValidationError("reentrant=True cannot be given to acquire_many: a set holds its own leases")
        opts = {**opts, "reentrant": False}
        if isinstance(keys, str) or not isinstance(keys, Iterable):
            raise ValidationError("keys must be an iterable of str (not a single str)")
        # Remembered like lock()'s: the same options object, and so the same cached plan.
        options = lock_options(opts)
        wanted = list(keys)
        for name in wanted:
            self._full_key(name, "keys[]")
        names = sorted(set(wanted))
        if not names:
            raise ValidationError("keys must not be empty")
        locks = [self._make_lock(name, ttl, options, "acquire_many") for name in names]
        policy = self.retry.merged(options.retry)
        budget = policy.timeout if policy.timeout is not None else math.inf
        # The time the set has left is read without the pause check: each acquisition reads
        # the clock in full, and a pause only makes a set's later keys wait less.
        peek = self._acquisition.peek
        start = peek()
        taken: list[Lock] = []
        try:
            for lock in locks:
                # The set's time left, as a number: the options (and their cached plan) stay one.
                left = None if budget == math.inf else max(0.0, budget - (peek() - start))
                acquire_or_raise(lock, options, left)
                taken.append(lock)
            try:
                refresh_together(taken[:-1], options.request_id)
            except LockLostError as error:
                # An earlier lease ran out before the last key was granted: the set as a whole
                # came back too late to be held together.
                raise LockHeldError(
                    error.key, attempts=1, elapsed=self._clock() - start, reason="late-acquire"
                ) from error
        except BaseException:
            for lock in taken:
                # The original failure is what the caller must see; a failed give-back here
                # becomes a release_failed event and the lease runs out on its own.
                give_up(lock)
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

    # -- inspection and administration ---------------------------------------------------------

    def get(self, key: str, *, request_id: Optional[str] = None) -> LockState:
        """The state of ``key`` (prefix applied); no token needed. Its ``limit`` and ``holders``
        tell how many leases the key admits and who holds them (see :class:`~lease_lock.LockState`).

        ``request_id`` goes with the request as ``acquire``'s does (the HTTP backend sends it as
        ``X-Volcano-Request-Id``; other backends accept and ignore it)."""
        self._check_open()
        full_key = self._full_key(key)
        if request_id is None:
            return self._backend.inspect(full_key)
        with request_id_scope(self._backend, check_request_id(request_id)):
            return self._backend.inspect(full_key)

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
        return iter(self._backend.scan(self.key_prefix + prefix))

    def force_release(self, key: str, *, request_id: Optional[str] = None) -> bool:
        """Drop whatever token holds ``key`` (every place of a counting key); ``True`` when a live
        lease was dropped.

        ``request_id`` goes with the request as ``acquire``'s does (the HTTP backend sends it as
        ``X-Volcano-Request-Id``; other backends accept and ignore it)."""
        self._check_open()
        full_key = self._full_key(key)
        if request_id is None:
            return self._backend.force_release(full_key)
        with request_id_scope(self._backend, check_request_id(request_id)):
            return self._backend.force_release(full_key)

    def close(self) -> None:
        """Stop the heartbeat, give back every lock still held (each reads lost, reason
        ``"closed"``) and the leases of locks dropped while held, and close what the locker
        opened. Idempotent."""
        if self._acquisition.closed:
            return
        self._acquisition.closed = True
        self._finalizer.detach()
        self._heartbeat.stop()
        for lock in self._acquisition.take_held():
            close_lease(lock)
        # Locks collected while held whose leases the heartbeat had not given back yet.
        self._acquisition.release_dropped()
        if self._resources.owns_backend:
            self._backend.close()
        _LOCKERS.discard(self)

    def __enter__(self) -> Locker:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<Locker {type(self._backend).__name__} prefix={self.key_prefix!r} {state}>"

