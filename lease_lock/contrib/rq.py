"""RQ integration: ``enqueue_once`` keeps a job from being queued twice, and ``singleton`` keeps
two runs of a job with the same key from overlapping.

::

    from lease_lock.contrib.rq import enqueue_once, singleton

    job = enqueue_once(queue, sync_customer, 42)      # a duplicate returns the queued Job

    @singleton("reindex:{0}")                          # hypothetical key spelling; see below
    def reindex(shop_id): ...

The lock store is, in this order: the ``locker=`` you pass; the ``LEASE_LOCK_URL`` environment
variable; the Redis connection of the queue (``enqueue_once``) or of the job being run (in the
worker). Each process builds its own locker on first use (with RQ's default worker, in the
work horse forked for each job).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import uuid
from typing import Any, Callable, Optional, TypeVar, Union, cast

from ..backends import LockState
from ..connect import connect
from ..errors import LockHeldError, ValidationError
from ..lock import Lock
from ..locker import Locker
from ..options import LockOptions
from ..validation import check_key, check_ttl
from ._config import ENV_URL, warn_if_one_host
from ._enqueue import (
    adopt,
    call_key,
    check_adopts,
    check_limit_alone,
    claim,
    job_id_of,
    log_skip,
    run_holder,
    unclaim,
)
from ._lazy import LazyLocker

__all__ = ["META_KEY", "enqueue_once", "job_locker", "process_locker", "run_claimed", "singleton", "was_skipped"]

_Function = TypeVar("_Function", bound=Callable[..., Any])

logger = logging.getLogger("lease_lock")

#: The ``job.meta`` entry written when a job was skipped because its key was busy:
#: ``{"skipped": True, "key": ..., "holder": ...}``.
META_KEY = "lease_lock"
#: ``enqueue`` keywords that are RQ's own options, not the job function's (``enqueue_call``'s
#: names, plus ``job_timeout`` which ``enqueue`` renames to ``timeout``).
_RQ_OPTIONS = frozenset({
    "job_timeout", "result_ttl", "ttl", "failure_ttl", "description", "depends_on", "job_id", "at_front", "meta",
    "retry", "repeat", "on_success", "on_failure", "on_stopped", "rate_limit", "pipeline", "unique", "webhooks",
})


def _env_locker() -> Locker:
    url = os.environ.get(ENV_URL)
    if not url:
        raise ValidationError(f"{ENV_URL} is not set")
    warn_if_one_host(url)
    return connect(url)


_holder = LazyLocker(_env_locker)
_by_connection: dict[str, LazyLocker] = {}
_by_connection_mutex = threading.Lock()


def _connection_locker(connection: Any) -> Locker:
    from ..backends.redis import RedisBackend

    # One locker per server and settings, not per client object: RQ makes clients freely, and
    # a locker per object would pile up.
    pool = getattr(connection, "connection_pool", None)
    settings = getattr(pool, "connection_kwargs", None)
    identity = repr(sorted(settings.items(), key=lambda item: item[0])) if settings else f"id:{id(connection)}"
    with _by_connection_mutex:
        holder = _by_connection.get(identity)
        if holder is None:
            holder = _by_connection[identity] = LazyLocker(lambda: Locker(RedisBackend(connection)))
    return holder.get()


def job_locker(connection: Any = None) -> Locker:
    """The locker for jobs on ``connection`` (an RQ queue's or job's Redis client): one built
    from ``LEASE_LOCK_URL`` when that is set, else one on ``connection`` itself."""
    if os.environ.get(ENV_URL):
        return _holder.get()
    if connection is None:
        raise ValidationError(
            f"no lock store configured: pass locker=, set the {ENV_URL} environment variable, or run "
            "the function as an RQ job (its queue's Redis is then used)"
        )
    return _connection_locker(connection)


def process_locker() -> Locker:
    """The locker ``singleton`` uses without ``locker=`` in this process: from ``LEASE_LOCK_URL``,
    else on the Redis connection of the RQ job being run."""
    from rq import get_current_job

    job = get_current_job()
    return job_locker(None if job is None else job.connection)


def _skipped(key: str, state: LockState, name: str) -> None:
    from rq import get_current_job

    job = get_current_job()
    log_skip(f"RQ job {name}[{None if job is None else job.id}]", key, state)
    if job is not None:
        job.meta[META_KEY] = {"skipped": True, "key": key, "holder": state.owner}
        job.save_meta()  # type: ignore[no-untyped-call]  # untyped in RQ


def was_skipped(job: Any) -> bool:
    """``True`` when ``job`` finished without running its body because its key was busy (a
    ``None`` result alone does not tell)."""
    entry = job.get_meta(refresh=True).get(META_KEY) if hasattr(job, "get_meta") else job.meta.get(META_KEY)
    return bool(isinstance(entry, dict) and entry.get("skipped"))


def _take(locker: Locker, key: str, ttl: Optional[float], opts: dict[str, Any]) -> Optional[Lock]:
    if opts.get("blocking") or opts.get("timeout") is not None:
        try:
            return locker.acquire(key, ttl, **opts)
        except LockHeldError:
            return None
    return locker.try_acquire(key, ttl, **{name: value for name, value in opts.items() if name != "blocking"})


def singleton(
    key: Union[str, Callable[..., str], None] = None, *, locker: Optional[Locker] = None, **opts: Any
) -> Callable[[_Function], _Function]:
    """Decorate an RQ job function so that one run per key holds a lease at a time.

    ``key`` is a ``str`` or a callable receiving the job's arguments; by default the function's
    dotted name. ``opts`` are lock options (``ttl``, ``max_hold``, ``timeout``, ...); the lock
    is tried once unless ``blocking`` or ``timeout`` says otherwise. ``limit=N`` lets up to N
    runs per key at once (the lock store must grant counting leases). A busy key returns ``None``
    without running the function, logs a WARNING naming the key and its holder and, in a
    worker, records the skip in ``job.meta["lease_lock"]`` (see :func:`was_skipped`). Options
    are checked here, when the job function is defined.
    """
    ttl = opts.pop("ttl", None)
    if ttl is not None:
        check_ttl(ttl)
    opts.pop("skip", None)
    LockOptions.from_kwargs(opts)
    if key is not None and not callable(key):
        check_key(key)

    def decorator(function: _Function) -> _Function:
        default = f"{function.__module__}.{function.__qualname__}"

        @functools.wraps(function)
        def job(*args: Any, **kwargs: Any) -> Any:
            active = locker if locker is not None else process_locker()
            name = key(*args, **kwargs) if callable(key) else (key or default)
            lock = _take(active, name, ttl, dict(opts))
            if lock is None:
                _skipped(name, active.get(name), default)
                return None
            with lock:
                return function(*args, **kwargs)

        return cast(_Function, job)

    return decorator


def enqueue_once(
    queue: Any,
    func: Union[Callable[..., Any], str],
    *args: Any,
    key: Optional[str] = None,
    enqueue_ttl: float = 3600.0,
    lock_limit: int = 1,
    **kwargs: Any,
) -> Optional[Any]:
    """``queue.enqueue(func, *args, **kwargs)`` unless a job with the same key is queued or
    running; then that job (an ``rq.job.Job``) is returned and nothing is sent.

    The key is ``key``, or by default the function's dotted name plus its arguments bound to its
    signature. It is claimed before the job is sent, with the job id as the claim's token, and
    the worker's run adopts the claim under a token of its own, once (heartbeated while it
    runs, released when it ends): the same job delivered again while it runs is skipped.
    A job never run frees its key after ``enqueue_ttl`` seconds (default one hour). A duplicate
    whose first job can no longer be found returns ``None``. Keywords RQ takes (``job_id``,
    ``job_timeout``, ``meta``, ...) go to RQ; the rest are the function's. The sender and the
    workers must find the same store: the queue's Redis, or one ``LEASE_LOCK_URL`` for all.

    ``lock_limit`` above 1 is refused (``ValidationError``, nothing sent): a claim stands for one
    job queued or running per key. To run at most N at once per key, send the job with
    ``queue.enqueue`` and decorate its function with ``singleton(limit=N)``.
    """
    from rq.exceptions import NoSuchJobError
    from rq.job import Job
    from rq.utils import import_attribute

    check_limit_alone(
        lock_limit, "lock_limit", "enqueue_once",
        f"send the job with queue.enqueue and decorate its function with singleton(limit={lock_limit})",
    )
    options = {name: kwargs.pop(name) for name in list(kwargs) if name in _RQ_OPTIONS}
    function = import_attribute(func) if isinstance(func, str) else func
    name = func if isinstance(func, str) else f"{function.__module__}.{function.__qualname__}"
    lock_key = key if key is not None else call_key(name, function, args, kwargs)
    job_id = options.pop("job_id", None) or uuid.uuid4().hex
    active = job_locker(queue.connection)
    holder = claim(active, lock_key, job_id, enqueue_ttl)
    if holder is not None:
        first = job_id_of(holder)
        if first is not None:
            try:
                return Job.fetch(first, connection=queue.connection)
            except NoSuchJobError:
                logger.info("the job %s holding %r is gone from RQ", first, lock_key)
        log_skip(f"RQ job {name}", lock_key, holder)
        return None
    job_timeout = options.pop("job_timeout", None)
    options.setdefault("description", f"{name} (once per key {lock_key})")
    try:
        return queue.enqueue_call(
            run_claimed, args=(func, lock_key, *args), kwargs=kwargs, job_id=job_id,
            timeout=job_timeout, **options,
        )
    except BaseException:
        unclaim(active, lock_key, job_id)  # never sent: nothing will run it
        raise


def run_claimed(func: Union[Callable[..., Any], str], key: str, *args: Any, **kwargs: Any) -> Any:
    """The job ``enqueue_once`` sends: run ``func`` under the key claimed for this job.

    A run that finds the key held by another job (its claim ran out and another took it) is
    skipped like a busy ``singleton`` run. So is a second delivery of this same job while its
    first delivery runs (the job id pushed onto a queue again), which logs the skip but writes
    no skip into the job's meta: the job itself did run.
    """
    from rq import get_current_job
    from rq.utils import import_attribute

    function = import_attribute(func) if isinstance(func, str) else func
    job = get_current_job()
    if job is None:
        raise ValidationError("run_claimed runs as an RQ job sent by enqueue_once")
    locker = job_locker(job.connection)
    check_adopts(locker, "enqueue_once")
    lock = adopt(locker, key, job.id, None)
    name = func if isinstance(func, str) else f"{function.__module__}.{function.__qualname__}"
    if lock is None:
        state = run_holder(locker, key)
        if job_id_of(state) == job.id:
            log_skip(f"RQ job {name}[{job.id}] (a second delivery)", key, state)
        else:
            _skipped(key, state, name)
        return None
    with lock:
        return function(*args, **kwargs)
