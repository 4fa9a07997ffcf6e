"""RQ integration: ``singleton`` keeps two runs of a job with the same key from overlapping.

::

    from lease_lock.contrib.rq import singleton

    @singleton("reindex:{0}")              # hypothetical key spelling; see below
    def reindex(shop_id): ...

``key`` is a ``str`` or a callable receiving the job's arguments (like ``Locker.locked``); by
default the job function's dotted name. A busy key makes the job return ``None`` at once, so
it finishes without running its body. ``@locker.locked(key, skip=True)`` does the same with a
locker of your own; ``singleton`` without ``locker=`` uses one process-wide locker from
:func:`lease_lock.connect` with no URL (``LEASE_LOCK_URL``), built lazily in the process that
runs the job: with RQ's default worker, the work horse forked for each job.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional, TypeVar, Union, cast

from ..connect import connect
from ..locker import Locker
from ..options import LockOptions
from ..validation import check_key, check_ttl
from ._lazy import LazyLocker

__all__ = ["process_locker", "singleton"]

_Function = TypeVar("_Function", bound=Callable[..., Any])

_holder = LazyLocker(connect)


def process_locker() -> Locker:
    """The process-wide locker ``singleton`` uses without ``locker=`` (built now if needed)."""
    return _holder.get()


def singleton(
    key: Union[str, Callable[..., str], None] = None, *, locker: Optional[Locker] = None, **opts: Any
) -> Callable[[_Function], _Function]:
    """Decorate an RQ job function so that one run per key holds a lease at a time.

    ``opts`` are those of ``Locker.locked`` (``ttl``, ``max_hold``, ``timeout``, ...); the lock
    is tried once unless ``blocking`` or ``timeout`` says otherwise, and a busy key returns
    ``None`` without running the function. Options are checked here, when the job function is
    defined.
    """
    ttl = opts.pop("ttl", None)
    if ttl is not None:
        check_ttl(ttl)
    LockOptions.from_kwargs({name: value for name, value in opts.items() if name != "skip"})
    if key is not None and not callable(key):
        check_key(key)

    def decorator(function: _Function) -> _Function:
        name = key if key is not None else f"{function.__module__}.{function.__qualname__}"
        if locker is not None:
            return locker.locked(name, ttl, skip=True, **opts)(function)

        @functools.wraps(function)
        def job(*args: Any, **kwargs: Any) -> Any:
            return _holder.get().locked(name, ttl, skip=True, **opts)(function)(*args, **kwargs)

        return cast(_Function, job)

    return decorator
