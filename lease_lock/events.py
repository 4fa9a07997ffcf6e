"""Lock events (SPEC 10) and the ``lease_lock`` logger.

Every change in a lock's life is one :class:`LockEvent`, given to the locker's ``on_event`` hook
and written to the ``lease_lock`` logger. The hook runs on whichever thread saw the change first
(the heartbeat thread, or a caller's thread reading a lapsed lease); anything it raises is
dropped (and logged at debug level) so that a broken hook cannot break locking.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Optional

__all__ = ["EVENT_TYPES", "EventHook", "LockEvent", "emit", "logger", "wanted"]

logger = logging.getLogger("lease_lock")
# A library must not print through the last-resort handler; applications configure logging.
logger.addHandler(logging.NullHandler())

#: Every event type, with the level it is logged at.
EVENT_TYPES = {
    "acquired": logging.DEBUG,
    "contended": logging.DEBUG,
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
    (``"held"`` or ``"late"``); ``attempt_failed`` (an attempt of a waiting acquire could not
    reach the store; it keeps trying until its timeout): ``attempt``, ``elapsed``, ``reason``
    (``"unavailable"``), ``error`` (the ``BackendUnavailableError``); ``extended``:
    ``held_for``; ``extend_failed``: ``held_for``, ``error``; ``released``: ``held_for``;
    ``lost``: ``held_for``, ``reason``; ``release_failed``: ``held_for``, ``error``. Fields
    that do not apply are ``None``.
    """

    type: str
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


def wanted(hook: Optional[EventHook], event_type: str) -> bool:
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
