"""Celery integration (extra ``celery``): ``SingletonTask`` runs one instance per key at a time.

::

    app = Celery("shop", broker="redis://localhost:6379/0")

    @app.task(base=SingletonTask, lock_on_enqueue=True)
    def sync_customer(customer_id):
        ...

The locker is ``app.conf.lease_lock_locker`` when set (a :class:`~lease_lock.Locker` you
built). Otherwise one is built, once per process (each prefork child builds its own after the
fork) and closed at exit, from the first of: ``app.conf.lease_lock_url``, the
``LEASE_LOCK_URL`` environment variable, and the app's ``broker_url`` when that is a Redis
(``redis://``, ``rediss://``) or Redis Sentinel (``sentinel://``) URL; ``app.conf.lease_lock_options``
is a dict of ``connect()`` options. When none applies, or an option is one the backend does
not take, the worker refuses to start with a ``ValidationError`` naming the settings to fix.
"""

from __future__ import annotations

import inspect
import random
import threading
import urllib.parse
import weakref
from typing import Any, Callable, ClassVar, Optional, Union

from celery import Celery, Task, bootsteps
from celery.exceptions import Ignore
from celery.utils import uuid
from celery.utils.log import get_task_logger

from ..backends import LockState
from ..connect import connect
from ..errors import LockLostError, ValidationError
from ..locker import Locker
from ..validation import check_bool, check_duration, check_limit, check_ttl
from ._config import check_backend_options, resolve_url
from ._enqueue import (
    adopt,
    call_key,
    check_adopts,
    check_limit_alone,
    claim,
    first_lease_end,
    job_id_of,
    log_skip,
    run_holder,
    unclaim,
)
from ._lazy import LazyLocker

__all__ = [
    "DUPLICATE",
    "ON_BUSY",
    "AlreadyQueued",
    "CheckSettingsStep",
    "SingletonTask",
    "broker_lock_url",
    "check_settings",
    "task_locker",
]

#: The accepted values of ``lock_on_busy``.
ON_BUSY = ("skip", "retry")
#: The accepted values of ``lock_duplicate``.
DUPLICATE = ("existing", "raise", "skip")

logger = get_task_logger(__name__)
#: The backoff's own generator: the program's global ``random`` state is left alone.
_JITTER = random.Random()

_holders: weakref.WeakKeyDictionary[Celery, LazyLocker] = weakref.WeakKeyDictionary()
_holders_mutex = threading.Lock()
_SETTINGS_TO_ADD = "app.conf.lease_lock_url (or a redis://, rediss:// or sentinel:// broker_url)"


class AlreadyQueued(Exception):
    """A task with ``lock_on_enqueue`` and ``lock_duplicate = "raise"`` was sent while another
    call with the same key was queued or running; ``task_id`` is that call's id (``None`` when
    the key's holder is not a queued task, such as a direct call)."""

    def __init__(self, key: str, task_id: Optional[str], holder: Optional[str]) -> None:
        super().__init__(f"{key!r} is already queued or running as task {task_id} (held by {holder})")
        self.key = key
        self.task_id = task_id
        self.holder = holder


def task_locker(app: Celery) -> Locker:
    """The locker ``SingletonTask`` uses for ``app`` in this process."""
    explicit = app.conf.get("lease_lock_locker")
    if explicit is not None:
        if not isinstance(explicit, Locker):
            raise ValidationError(f"lease_lock_locker must be a lease_lock.Locker, not {type(explicit).__name__}")
        return explicit
    with _holders_mutex:
        holder = _holders.get(app)
        if holder is None:
            holder = _holders[app] = LazyLocker(lambda: _locker_from_conf(app))
    return holder.get()


def broker_lock_url(app: Celery) -> Optional[str]:
    """The lease_lock URL of ``app``'s broker when it is Redis or Redis Sentinel, else ``None``.

    Of a failover list (``;``-separated or a list) the first URL is used. A Sentinel broker
    becomes ``redis+sentinel://`` with the ``master_name`` of ``broker_transport_options``.
    """
    broker = app.conf.get("broker_url")
    if isinstance(broker, (list, tuple)):
        broker = broker[0] if broker else None
    if not isinstance(broker, str) or not broker:
        return None
    scheme = urllib.parse.urlsplit(broker.split(";")[0]).scheme.lower()
    if scheme in ("redis", "rediss"):
        return broker.split(";")[0].strip()
    if scheme != "sentinel":
        return None
    master = (app.conf.get("broker_transport_options") or {}).get("master_name")
    if not master:
        raise ValidationError("a sentinel:// broker_url needs broker_transport_options['master_name']")
    hosts, password, database = [], "", ""
    for one in broker.split(";"):
        parts = urllib.parse.urlsplit(one.strip())
        hosts.append(parts.netloc.rpartition("@")[2])
        if parts.password and not password:
            password = ":" + parts.password + "@"
        database = database or parts.path.strip("/")
    tail = f"/{database}" if database else ""
    return f"redis+sentinel://{password}{','.join(hosts)}/{urllib.parse.quote(master, safe='')}{tail}"


def _conf_url_and_options(app: Celery) -> tuple[str, dict[str, Any]]:
    options = app.conf.get("lease_lock_options") or {}
    if not isinstance(options, dict):
        raise ValidationError(f"lease_lock_options must be a dict, not {type(options).__name__}")
    url = resolve_url(
        app.conf.get("lease_lock_url"), "app.conf.lease_lock_url", lambda: broker_lock_url(app), add=_SETTINGS_TO_ADD
    )
    return url, options


def _locker_from_conf(app: Celery) -> Locker:
    url, options = _conf_url_and_options(app)
    return connect(url, **options)


def check_settings(app: Celery) -> None:
    """Check ``app``'s lease_lock settings without connecting (a worker does this at start-up)."""
    if app.conf.get("lease_lock_locker") is not None:
        task_locker(app)
        return
    url, options = _conf_url_and_options(app)
    check_backend_options(url, options, options_name="app.conf.lease_lock_options")


class CheckSettingsStep(bootsteps.Step):  # type: ignore[misc]  # Celery ships no type hints
    """A worker boot step, added to every app with a ``SingletonTask``: the worker refuses to
    start (with the ``ValidationError``) when the lease_lock settings are missing or wrong."""

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        check_settings(worker.app)


class SingletonTask(Task):  # type: ignore[misc]  # Celery ships no type hints
    """A task base class: at most one run per lock key at a time (``lock_limit`` runs, when
    set), across every worker.

    Options, as class attributes or ``@app.task(...)`` keywords:

    - ``lock_key``: by default the task's name plus its arguments bound to its signature
      (``sync_customer(1)`` and ``sync_customer(2)`` do not block each other; a long key ends
      in a SHA-256 digest of the arguments); a format string over the call's arguments
      (``"report:{0}"``, ``"user:{user_id}"``); or a callable receiving them and returning the key.
    - ``lock_ttl``, ``lock_max_hold``: seconds; the locker's defaults when ``None``.
    - ``lock_limit``: at most this many runs per key at once (default 1), each holding a
      place of a counting key (the lock store must grant counting leases). A run finding every
      place taken is busy, as below. Refused with ``lock_on_enqueue``, whose claim keeps one
      call per key queued or running.
    - ``lock_on_busy``: ``"skip"`` (default) returns ``None`` without running and logs a
      WARNING naming the key and its holder; ``"retry"`` calls ``self.retry(countdown=...)``
      with the shorter of the holder's remaining lease and a back-off that doubles per retry
      from ``lock_retry_backoff`` seconds (Celery's ``max_retries`` applies).
    - ``lock_fail_on_loss``: ``True`` (default) makes a run whose lock was lost fail with
      :class:`~lease_lock.LockLostError`; ``False`` only logs it and keeps the result.
    - ``lock_on_enqueue``: ``True`` takes the lock in ``apply_async``/``delay`` before the
      message is sent (a claim, whose token is the task id); the worker's run adopts that claim
      under a token of its own, once. A call while one with the same key is queued or running
      is not sent and is answered per ``lock_duplicate``: ``"existing"`` (default) the first
      call's ``AsyncResult`` (same id), ``"raise"`` :class:`AlreadyQueued` carrying that id,
      ``"skip"`` ``None``. A delivery that finds its key held by another run (a broker's
      second delivery of the same message included) is a duplicate too and does not run; it
      logs a WARNING. A second delivery of the running message is ignored (Celery's
      ``Ignore``: it stores no state, since its task id is the running call's); a delivery of
      another message fails with :class:`AlreadyQueued` under ``"raise"`` and returns
      ``None`` otherwise. A message that is never run frees its key when
      ``lock_enqueue_ttl`` seconds (default one hour) have passed since it was sent.

    The heartbeat keeps the lease alive for the whole run. A lost lock is always logged on the
    task logger. The lock is taken in one attempt: waiting for it would tie up a worker slot.
    """

    lock_key: ClassVar[Union[str, Callable[..., str], None]] = None
    lock_ttl: ClassVar[Optional[float]] = None
    lock_max_hold: ClassVar[Optional[float]] = None
    lock_limit: ClassVar[int] = 1
    lock_on_busy: ClassVar[str] = "skip"
    lock_retry_backoff: ClassVar[float] = 1.0
    lock_fail_on_loss: ClassVar[bool] = True
    lock_on_enqueue: ClassVar[bool] = False
    lock_duplicate: ClassVar[str] = "existing"
    lock_enqueue_ttl: ClassVar[float] = 3600.0

    @classmethod
    def on_bound(cls, app: Celery) -> None:
        """Add the start-up check of the lease_lock settings to the app's workers."""
        super().on_bound(app)
        app.steps["worker"].add(CheckSettingsStep)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # @app.task(base=SingletonTask, ...) builds a subclass from the keywords: checking here
        # makes a bad option fail when the task is defined, not when it first runs.
        super().__init_subclass__(**kwargs)
        if cls.lock_key is not None and not (isinstance(cls.lock_key, str) or callable(cls.lock_key)):
            raise ValidationError(f"lock_key must be a str or a callable, not {type(cls.lock_key).__name__}")
        if cls.lock_ttl is not None:
            check_ttl(cls.lock_ttl, "lock_ttl")
        if cls.lock_max_hold is not None:
            check_duration(cls.lock_max_hold, "lock_max_hold", allow_inf=True)
        if cls.lock_on_busy not in ON_BUSY:
            raise ValidationError(f"lock_on_busy must be one of {', '.join(ON_BUSY)}, not {cls.lock_on_busy!r}")
        check_ttl(cls.lock_retry_backoff, "lock_retry_backoff")
        check_bool(cls.lock_fail_on_loss, "lock_fail_on_loss")
        check_bool(cls.lock_on_enqueue, "lock_on_enqueue")
        if cls.lock_duplicate not in DUPLICATE:
            raise ValidationError(
                f"lock_duplicate must be one of {', '.join(DUPLICATE)}, not {cls.lock_duplicate!r}"
            )
        check_ttl(cls.lock_enqueue_ttl, "lock_enqueue_ttl")
        check_limit(cls.lock_limit, "lock_limit")
        if cls.lock_on_enqueue:
            check_limit_alone(cls.lock_limit, "lock_limit", "lock_on_enqueue", "drop lock_on_enqueue")

    def lease_lock_key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The key of one call: ``lock_key`` applied to its arguments, or the task's name plus
        its bound arguments."""
        key = type(self).lock_key
        if key is None:
            return call_key(str(self.name), self.run, tuple(args), dict(kwargs))
        if isinstance(key, str):
            return self._format_key(key, args, kwargs)
        made = key(*args, **kwargs)
        if not isinstance(made, str):
            raise ValidationError(f"lock_key must return a str, not {type(made).__name__}")
        return made

    def _format_key(self, key: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        # Arguments are bound to the task's signature, so "{user_id}" finds user_id however the
        # caller passed it, and "{0}" still finds the first positional argument.
        try:
            bound = inspect.signature(self.run).bind(*args, **kwargs)
        except TypeError:
            named = dict(kwargs)
        else:
            bound.apply_defaults()
            named = {**bound.arguments, **kwargs}
        try:
            return key.format(*args, **named)
        except (IndexError, KeyError) as error:
            raise ValidationError(f"lock_key {key!r} names {error} which this call does not pass") from None

    def apply_async(
        self, args: Any = None, kwargs: Any = None, task_id: Optional[str] = None, *rest: Any, **options: Any
    ) -> Any:
        """Send the task; with ``lock_on_enqueue``, only when no call with its key is queued or
        running (see the class's ``lock_duplicate``)."""
        if not self.lock_on_enqueue:
            return super().apply_async(args, kwargs, task_id, *rest, **options)
        task_id = task_id or uuid()
        if task_id == self.request.id and getattr(self.request, "lease_lock_running", False):
            # retry() of the running message: its run still holds the key, so the retry is sent
            # once the run has given the key back and claimed it again for the retry (see
            # __call__). Sent now, its delivery could find the key held by this run and be
            # dropped as a duplicate.
            self.request.lease_lock_resend = (args, kwargs, task_id, rest, options)
            return self.AsyncResult(task_id)
        locker = task_locker(self.app)
        key = self.lease_lock_key(tuple(args or ()), dict(kwargs or {}))
        holder = claim(locker, key, task_id, self.lock_enqueue_ttl)
        if holder is not None:
            return self._duplicate(key, holder)
        return self._send_claimed(locker, key, (args, kwargs, task_id, rest, options))

    def _send_claimed(self, locker: Locker, key: str, message: tuple[Any, ...]) -> Any:
        args, kwargs, task_id, rest, options = message
        try:
            return super().apply_async(args, kwargs, task_id, *rest, **options)
        except BaseException:
            unclaim(locker, key, task_id)  # never sent: nothing will run it
            raise

    def _duplicate(self, key: str, holder: LockState) -> Any:
        first = job_id_of(holder)
        logger.info("%s: %r is already queued or running as %s; not sent", self.name, key, first or holder.owner)
        if self.lock_duplicate == "raise" or (self.lock_duplicate == "existing" and first is None):
            raise AlreadyQueued(key, first, holder.owner)
        if self.lock_duplicate == "skip":
            return None
        return self.AsyncResult(first)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the task under its lock (or skip or retry when the key is busy)."""
        locker = task_locker(self.app)
        key = self.lease_lock_key(args, kwargs)
        options: dict[str, Any] = {} if self.lock_max_hold is None else {"max_hold": self.lock_max_hold}
        if self.lock_limit > 1:
            options["limit"] = self.lock_limit
        claimed = self.lock_on_enqueue and self.request.id is not None and not self.request.called_directly
        if claimed:
            # The run takes over the claim its apply_async took, under a token of its own: a
            # second delivery of this message then finds the key held by a run.
            check_adopts(locker, "lock_on_enqueue")
            lock = adopt(locker, key, self.request.id, self.lock_ttl, **options)
        else:
            lock = locker.try_acquire(key, self.lock_ttl, **options)
        if lock is None:
            return self._busy(locker, key, enqueued=claimed)
        # In a worker the request is already pushed; Task.__call__ would push a bare one over
        # it (losing the id that retry() needs), so it is only used for direct calls.
        body = super().__call__ if self.request.called_directly else self.run
        result = None
        try:
            self.request.lease_lock_running = claimed
            try:
                with lock:
                    result = body(*args, **kwargs)
            finally:
                self.request.lease_lock_running = False
                retry = getattr(self.request, "lease_lock_resend", None)
                self.request.lease_lock_resend = None
                if retry is not None:
                    # The run has given the key back: claim it for the retry, then send it.
                    claim(locker, key, self.request.id, self.lock_enqueue_ttl)
                    self._send_claimed(locker, key, retry)
        except LockLostError as error:
            if error.key != lock.key:
                raise
            logger.error("%s: lost the lock %r (%s) while running", self.name, error.key, error.reason)
            if self.lock_fail_on_loss or not error.completed:
                raise
            return result
        return result

    def _busy(self, locker: Locker, key: str, *, enqueued: bool) -> Any:
        if enqueued:
            return self._duplicate_run(key, run_holder(locker, key))
        state = locker.get(key)
        if self.lock_on_busy == "skip":
            # A worker's task log format starts the line with the task's name and id.
            log_skip("run", key, state, logger)
            return None
        raise self.retry(countdown=self.retry_countdown(state))

    def _duplicate_run(self, key: str, state: LockState) -> Any:
        # A claimed run that finds its key held by another run is a duplicate of it (retrying
        # would only send it again).
        log_skip("run", key, state, logger)
        first = job_id_of(state)
        if first is not None and first == self.request.id:
            # A second delivery of the message being run shares its task id, so any state it
            # stored would be the running call's: a result backend keeps the first SUCCESS it
            # is given, and the run's real result would be dropped. The run answers for both.
            raise Ignore()
        if self.lock_duplicate == "raise":
            raise AlreadyQueued(key, first, state.owner)
        return None

    def retry_countdown(self, state: LockState) -> float:
        """Seconds before a busy run is tried again: the holder's remaining lease (of a counting
        key, the first of its holders' to end), or sooner, a back-off that doubles from
        ``lock_retry_backoff`` with each retry (with jitter), since the heartbeat keeps a running
        holder's lease full."""
        if not state.held:
            return 0.0
        backoff = self.lock_retry_backoff * 2 ** int(self.request.retries or 0)
        backoff *= _JITTER.uniform(0.5, 1.0)  # spreads the retries of many waiters
        ends = first_lease_end(state)
        remaining = max(ends if ends is not None else backoff, 0.0)
        countdown = min(remaining, backoff)
        logger.info("%s: lock %r is held by %s; retrying in %.1fs", self.name, state.key, state.owner, countdown)
        return float(countdown)
