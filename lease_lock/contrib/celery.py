"""Celery integration (extra ``celery``): ``SingletonTask`` runs one instance per key at a time.

::

    app = Celery("shop", broker="redis://localhost:6379/0")
    app.conf.lease_lock_url = "redis://localhost:6379/1"

    @app.task(base=SingletonTask, lock_key="report:{0}", lock_on_busy="retry")
    def build_report(day):
        ...

The locker is ``app.conf.lease_lock_locker`` when set (a :class:`~lease_lock.Locker` you
built); otherwise one built from ``app.conf.lease_lock_url`` (default: ``connect()``'s default)
and ``app.conf.lease_lock_options`` (a dict of ``connect()`` options), once per process, so each
prefork child builds its own after the fork, and closed at exit.
"""

from __future__ import annotations

import inspect
import threading
import weakref
from typing import Any, Callable, ClassVar, Optional, Union

from celery import Celery, Task
from celery.utils.log import get_task_logger

from ..connect import connect
from ..errors import LockLostError, ValidationError
from ..locker import Locker
from ..validation import check_bool, check_duration, check_ttl
from ._lazy import LazyLocker

__all__ = ["ON_BUSY", "SingletonTask", "task_locker"]

#: The accepted values of ``lock_on_busy``.
ON_BUSY = ("skip", "retry")

logger = get_task_logger(__name__)

_holders: weakref.WeakKeyDictionary[Celery, LazyLocker] = weakref.WeakKeyDictionary()
_holders_mutex = threading.Lock()


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


def _locker_from_conf(app: Celery) -> Locker:
    options = app.conf.get("lease_lock_options") or {}
    if not isinstance(options, dict):
        raise ValidationError(f"lease_lock_options must be a dict, not {type(options).__name__}")
    return connect(app.conf.get("lease_lock_url"), **options)


class SingletonTask(Task):  # type: ignore[misc]  # Celery ships no type hints
    """A task base class: at most one run per lock key at a time, across every worker.

    Options, as class attributes or ``@app.task(...)`` keywords:

    - ``lock_key``: the task's name by default; a format string over the call's arguments
      (``"report:{0}"``, ``"user:{user_id}"``); or a callable receiving them and returning the key.
    - ``lock_ttl``, ``lock_max_hold``: seconds; the locker's defaults when ``None``.
    - ``lock_on_busy``: ``"skip"`` (default) returns ``None`` without running; ``"retry"``
      calls ``self.retry(countdown=...)`` with the holder's remaining lease (Celery's
      ``max_retries`` applies).
    - ``lock_fail_on_loss``: ``True`` (default) makes a run whose lock was lost fail with
      :class:`~lease_lock.LockLostError`; ``False`` only logs it and keeps the result.

    The heartbeat keeps the lease alive for the whole run. A lost lock is always logged on the
    task logger. The lock is taken in one attempt: waiting for it would tie up a worker slot.
    """

    lock_key: ClassVar[Union[str, Callable[..., str], None]] = None
    lock_ttl: ClassVar[Optional[float]] = None
    lock_max_hold: ClassVar[Optional[float]] = None
    lock_on_busy: ClassVar[str] = "skip"
    lock_fail_on_loss: ClassVar[bool] = True

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
        check_bool(cls.lock_fail_on_loss, "lock_fail_on_loss")

    def lease_lock_key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The key of one call: ``lock_key`` applied to its arguments, or the task's name."""
        key = type(self).lock_key
        if key is None:
            return str(self.name)
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

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the task under its lock (or skip or retry when the key is busy)."""
        locker = task_locker(self.app)
        key = self.lease_lock_key(args, kwargs)
        options = {} if self.lock_max_hold is None else {"max_hold": self.lock_max_hold}
        lock = locker.try_acquire(key, self.lock_ttl, **options)
        if lock is None:
            return self._busy(locker, key)
        # In a worker the request is already pushed; Task.__call__ would push a bare one over
        # it (losing the id that retry() needs), so it is only used for direct calls.
        body = super().__call__ if self.request.called_directly else self.run
        result = None
        try:
            with lock:
                result = body(*args, **kwargs)
        except LockLostError as error:
            if error.key != lock.key:
                raise
            logger.error("%s: lost the lock %r (%s) while running", self.name, error.key, error.reason)
            if self.lock_fail_on_loss or not error.completed:
                raise
            return result
        return result

    def _busy(self, locker: Locker, key: str) -> Any:
        if self.lock_on_busy == "skip":
            logger.info("%s: lock %r is held elsewhere; skipped", self.name, key)
            return None
        remaining = locker.get(key).expires_in
        countdown = max(remaining or 0.0, 0.0)
        logger.info("%s: lock %r is held elsewhere; retrying in %.1fs", self.name, key, countdown)
        raise self.retry(countdown=countdown)
