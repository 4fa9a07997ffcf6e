"""Validated per-lock options (the ``**opts`` of ``Locker.lock``, ``acquire`` and ``try_acquire``).

Options are checked once, when a lock is created or a decorator is applied, so that a bad
option raises :class:`~lease_lock.errors.ValidationError` before anything reaches the backend.
"""

from __future__ import annotations

import math
import threading
from dataclasses import MISSING, dataclass, field, fields, replace
from datetime import timedelta
from operator import itemgetter
from typing import Any, Callable, Iterable, Mapping, Optional, Union

from .errors import ValidationError
from .events import combine
from .retry import Retry
from .validation import (
    check_bool,
    check_cancel,
    check_duration,
    check_key,
    check_limit,
    check_optional_duration,
    check_owner,
    check_token,
    check_ttl,
    unknown_option_error,
)

__all__ = [
    "LOCKER_OPTIONS",
    "LOCK_OPTIONS",
    "NOT_GIVEN",
    "OPTION_DEFAULTS",
    "LockOptions",
    "Seconds",
    "check_extend_interval",
    "check_locker_options",
    "check_request_id",
    "given_options",
    "lock_options",
]

#: The ``Locker``'s settings that a URL's caller may give (``connect()`` passes these to the
#: ``Locker`` and every other option to the backend; ``owns_backend`` is ``connect()``'s own).
LOCKER_OPTIONS = frozenset(
    {
        "ttl", "max_hold", "retry", "key_prefix", "fencing", "owner", "on_event", "clock", "token_factory", "reentrant",
        "heartbeat_thread", "limit",
    }
)


def check_locker_options(**options: Any) -> dict[str, Any]:
    """Validate ``Locker`` settings (those of :data:`LOCKER_OPTIONS`) without building anything,
    so that a bad one fails before a backend is created: the settings, with ``ttl`` and
    ``max_hold`` in seconds and a list of ``on_event`` hooks combined into one."""
    unknown = set(options) - LOCKER_OPTIONS
    if unknown:
        raise ValidationError(f"unknown Locker option(s): {', '.join(sorted(unknown))}")
    checked = dict(options)
    checked["ttl"] = check_ttl(options.get("ttl", 30.0))
    checked["max_hold"] = check_duration(options.get("max_hold", 3600.0), "max_hold", allow_inf=True)
    retry = options.get("retry")
    if retry is not None and not isinstance(retry, Retry):
        raise ValidationError(f"retry must be a lease_lock.Retry, not {type(retry).__name__}")
    prefix = options.get("key_prefix", "")
    if not isinstance(prefix, str):
        raise ValidationError(f"key_prefix must be a str, not {type(prefix).__name__}")
    if prefix:
        check_key(prefix, "key_prefix")
    checked["limit"] = check_limit(options.get("limit", 1))
    for flag, default in (("fencing", False), ("reentrant", False), ("heartbeat_thread", True)):
        checked[flag] = check_bool(options.get(flag, default), flag)
    if options.get("owner") is not None:
        check_owner(options["owner"])
    if isinstance(options.get("on_event"), (list, tuple)):
        # A list of hooks: each receives every event (see events.combine).
        checked["on_event"] = combine(options["on_event"])
    for name in ("clock", "token_factory"):
        value = options.get(name)
        if value is not None and not callable(value):
            raise ValidationError(f"{name} must be callable")
    if checked.get("on_event") is not None and not callable(checked["on_event"]):
        raise ValidationError("on_event must be callable or a list of callables")
    return checked


#: A duration option's type: seconds, or a ``timedelta``.
Seconds = Union[float, timedelta]


@dataclass(frozen=True)
class LockOptions:
    """The options of one lock, validated. ``None`` means "the locker's default"."""

    retry: Optional[Retry] = None
    blocking: bool = True
    cancel: Optional[threading.Event] = None
    auto_extend: bool = True
    max_hold: Optional[float] = None
    extend_interval: Optional[float] = None
    token: Optional[str] = field(default=None, repr=False)
    request_id: Optional[str] = None
    #: Join a hold of the same key by the same thread through the same locker (None: the
    #: locker's default).
    reentrant: Optional[bool] = None
    #: How many leases the key admits at once (None: the locker's default; 1: exclusive).
    limit: Optional[int] = None

    @classmethod
    def from_kwargs(cls, options: Mapping[str, Any]) -> LockOptions:
        """Validate keyword options; unknown names and bad values raise ``ValidationError``."""
        unknown = set(options) - LOCK_OPTIONS
        if unknown:
            # Every caller takes ``ttl`` beside these options, so it is one of the known names.
            raise unknown_option_error("", unknown, LOCK_OPTIONS | {"ttl"})
        retry = options.get("retry")
        if retry is not None and not isinstance(retry, Retry):
            raise ValidationError(f"retry must be a lease_lock.Retry, not {type(retry).__name__}")
        timeout = check_optional_duration(options.get("timeout"), "timeout", allow_zero=True, allow_inf=True)
        if timeout is not None:
            retry = (retry or Retry()).merged(Retry(timeout=timeout))
        request_id = check_request_id(options.get("request_id"))
        token = options.get("token")
        reentrant = options.get("reentrant")
        limit = options.get("limit")
        return cls(
            retry=retry,
            blocking=check_bool(options.get("blocking", True), "blocking"),
            cancel=check_cancel(options.get("cancel")),
            auto_extend=check_bool(options.get("auto_extend", True), "auto_extend"),
            max_hold=check_optional_duration(options.get("max_hold"), "max_hold", allow_inf=True),
            extend_interval=check_optional_duration(options.get("extend_interval"), "extend_interval"),
            token=None if token is None else check_token(token),
            request_id=request_id,
            reentrant=None if reentrant is None else check_bool(reentrant, "reentrant"),
            limit=None if limit is None else check_limit(limit),
        )

    def with_attempt_budget(self, blocking: Optional[bool], timeout: Optional[float]) -> LockOptions:
        """These options with ``Lock.acquire(blocking, timeout)``'s explicit arguments applied."""
        updated = self
        if blocking is not None:
            updated = replace(updated, blocking=check_bool(blocking, "blocking"))
        if timeout is not None:
            # threading.Lock.acquire spells "wait for ever" as timeout=-1; accept it too.
            seconds = math.inf if timeout == -1 else check_duration(timeout, "timeout", allow_zero=True, allow_inf=True)
            updated = replace(updated, retry=(updated.retry or Retry()).merged(Retry(timeout=seconds)))
        return updated


#: Each option of ``lock()``, ``acquire()`` and friends with the value that means "not given":
#: the fields of :class:`LockOptions`, and ``timeout``, which is folded into ``retry``.
OPTION_DEFAULTS: Mapping[str, object] = {
    **{option.name: option.default for option in fields(LockOptions) if option.default is not MISSING},
    "timeout": None,
}
#: Every option name ``lock()``, ``acquire()`` and friends accept.
LOCK_OPTIONS = frozenset(OPTION_DEFAULTS)


class _NotGiven:
    """The default of an option whose every value, its usual default included, means something."""

    def __repr__(self) -> str:
        return "NOT_GIVEN"


#: Marks an option the caller left out where ``True`` given explicitly differs from leaving it
#: out (``blocking`` of ``Locker.locked(skip=True)``).
NOT_GIVEN: Any = _NotGiven()


def given_options(names: Iterable[str]) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    """A reader of the options a call gave, among ``names``: given the call's ``locals()``, the
    options that are neither their default nor :data:`NOT_GIVEN`."""
    ordered = tuple(sorted(names))
    defaults = tuple(OPTION_DEFAULTS[name] for name in ordered)
    values_of = itemgetter(*ordered)

    def given(values: Mapping[str, Any]) -> dict[str, Any]:
        return {
            name: value
            for name, value, default in zip(ordered, values_of(values), defaults)
            if value is not default and value is not NOT_GIVEN
        }

    return given


def check_request_id(request_id: object) -> Optional[str]:
    """A caller's request id (``None``, or a non-empty str of at most 128 characters); a backend
    may ask more of it (the HTTP backend wants a UUID)."""
    if request_id is not None and (not isinstance(request_id, str) or not request_id or len(request_id) > 128):
        raise ValidationError("request_id must be a non-empty str of at most 128 characters")
    return request_id


def check_extend_interval(interval: Optional[float], ttl: float) -> None:
    """An explicit heartbeat interval may not exceed half the lease: two chances to extend per TTL."""
    if interval is not None and interval > ttl / 2:
        raise ValidationError(
            f"extend_interval ({interval:g}s) must be at most half the ttl ({ttl:g}s) so that a "
            "failed extension can be retried before the lease runs out"
        )


#: Options built from plain values (bool, number, str, None), by name, type and value: a call
#: site that passes the same options every time (``auto_extend=False``) validates them once.
_BUILT: dict[tuple[tuple[str, type, object], ...], LockOptions] = {}
_BUILT_LIMIT = 256
_PLAIN = (bool, int, float, str, type(None))


def lock_options(options: Mapping[str, Any]) -> LockOptions:
    """``LockOptions.from_kwargs(options)``, remembered for options made of plain values."""
    if not all(type(value) in _PLAIN for value in options.values()):
        return LockOptions.from_kwargs(options)
    # The type is part of the key: ``blocking=1`` must still be refused although ``1 == True``.
    key = tuple(sorted((name, type(value), value) for name, value in options.items()))
    built = _BUILT.get(key)
    if built is None:
        built = LockOptions.from_kwargs(options)
        if len(_BUILT) < _BUILT_LIMIT:
            _BUILT[key] = built
    return built
