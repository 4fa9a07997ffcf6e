"""Lock events and the ``lease_lock`` logger.

Every change in a lock's life is one :class:`LockEvent`, given to the locker's ``on_event`` hook
and written to the ``lease_lock`` logger. The hook runs on whichever thread saw the change first
(the heartbeat thread, or a caller's thread reading a lapsed lease); anything it raises is
dropped (and logged at debug level) so that a broken hook cannot break locking.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Callable, Literal, Optional, Union

from .errors import ValidationError

__all__ = ["EVENT_TYPES", "EventHook", "EventType", "LockEvent", "combine", "emit", "logger", "wanted"]

# No NullHandler: in a program that configured no logging, Python's last-resort handler prints
# WARNING and above to stderr, as it does for the standard library's own loggers. A lost lock,
# a skipped job or a store private to one host is something the user must see, and a worker or
# app that configured only its framework's logger (RQ's, Flask's) configured nothing above it.
logger = logging.getLogger("lease_lock")

#: What happened to a lock: :attr:`LockEvent.type` (the keys of :data:`EVENT_TYPES`).
EventType = Literal[
    "acquired", "contended", "timed_out", "attempt_failed", "extended", "extend_failed", "released", "lost",
    "release_failed",
]

#: Every event type, with the level it is logged at.
EVENT_TYPES: dict[EventType, int] = {
    "acquired": logging.DEBUG,
    "contended": logging.DEBUG,
    "timed_out": logging.DEBUG,
    "attempt_failed": logging.DEBUG,
    "extended": logging.DEBUG,
    "extend_failed": logging.WARNING,
    "released": logging.DEBUG,
    "lost": logging.WARNING,
    "release_failed": logging.WARNING,
}


@dataclass(frozen=True)
class LockEvent:
    """One thing that happened to a lock.

    Always set: ``type``, ``key`` (prefix included), ``ttl`` (the latest). By type:
    ``acquired``: ``waited``, ``attempts``; ``contended``: ``attempt``, ``elapsed``, ``reason``
    (``"held"`` or ``"late"``); ``timed_out`` (a wait for the key ran out of time): ``attempts``,
    ``elapsed``; ``attempt_failed`` (an attempt of a waiting acquire could not reach the store;
    it keeps trying until its timeout): ``attempt``, ``elapsed``, ``reason`` (``"unavailable"``),
    ``error`` (the ``BackendUnavailableError``); ``extended``: ``held_for``; ``extend_failed``:
    ``held_for``, ``error``; ``released``: ``held_for``; ``lost``: ``held_for``, ``reason``;
    ``release_failed``: ``held_for``, ``error``. Fields that do not apply are ``None``.
    """

    type: EventType
    key: str
    ttl: float
    waited: Optional[float] = None
    attempts: Optional[int] = None
    attempt: Optional[int] = None
    elapsed: Optional[float] = None
    reason: Optional[str] = None
    held_for: Optional[float] = None
    error: Optional[BaseException] = None

    def describe(self) -> str:
        """A one-line, token-free description for logs."""
        details = [
            f"{name}={value:.3f}" if isinstance(value, float) else f"{name}={value!r}"
            for name in ("waited", "attempts", "attempt", "elapsed", "reason", "held_for", "error")
            if (value := getattr(self, name)) is not None
        ]
        return f"lock {self.key!r} {self.type} (ttl={self.ttl:g}s{', ' if details else ''}{', '.join(details)})"


#: The signature of an ``on_event`` hook.
EventHook = Callable[[LockEvent], None]


def combine(*hooks: Union[EventHook, Iterable[EventHook], None]) -> Optional[EventHook]:
    """One ``on_event`` hook that hands each event to every hook given, in order.

    Arguments may be hooks, iterables of hooks or ``None`` (skipped). A hook that raises does
    not keep the event from the hooks after it (the error is logged at debug level). Returns
    ``None`` when there is no hook at all, and the hook itself when there is exactly one.
    """
    flat: list[EventHook] = []
    for item in hooks:
        if item is None:
            continue
        if callable(item):
            flat.append(item)
            continue
        for hook in item:
            if not callable(hook):
                raise ValidationError(f"on_event hooks must be callable, not {type(hook).__name__}")
            flat.append(hook)
    if not flat:
        return None
    if len(flat) == 1:
        return flat[0]
    chain = tuple(flat)

    def fan_out(event: LockEvent) -> None:
        for hook in chain:
            try:
                hook(event)
            except Exception:
                logger.debug("on_event hook %r raised for %s; dropped", hook, event.type, exc_info=True)

    return fan_out


def wanted(hook: Optional[EventHook], event_type: EventType) -> bool:
    """Whether an event of this type would reach anyone (a hook, or an enabled log level), so
    that the hot path can skip building events nobody receives."""
    return hook is not None or logger.isEnabledFor(EVENT_TYPES[event_type])


def emit(hook: Optional[EventHook], event: LockEvent) -> None:
    """Log ``event`` and hand it to ``hook``; never raises."""
    level = EVENT_TYPES[event.type]
    if logger.isEnabledFor(level):
        logger.log(level, "%s", event.describe())
    if hook is not None:
        try:
            hook(event)
        except Exception:
            logger.debug("on_event hook raised for %s; dropped", event.type, exc_info=True)
