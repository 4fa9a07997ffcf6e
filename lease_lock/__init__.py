"""lease_lock: distributed lease locks for synchronous Python.

``lease_lock.connect(url)`` gives a :class:`Locker`; ``with locker.lock(key):`` holds a lease on
``key`` with a heartbeat keeping it alive, a loss signal, and optional fencing tokens. This
module only re-exports the public names. Importing it is cheap and imports no database driver:
the errors and :func:`connect` are loaded at once, every other name on first use.
"""

import importlib as _importlib
import typing as _typing

from .connect import connect
from .errors import (
    AccessDeniedError,
    BackendUnavailableError,
    DroppedLockWarning,
    HeldReason,
    LeaseLockError,
    LockHeldError,
    LockLostError,
    LockStateError,
    LostReason,
    RateLimitedError,
    ReplicationError,
    ValidationError,
)

if _typing.TYPE_CHECKING:
    from .backends import register_scheme
    from .backends.base import Backend, Capabilities, ExtendRequest, Holder, LockState, ReleaseWatcher
    from .backends.memory import MemoryBackend
    from .events import EventType, LockEvent
    from .leadership import Leadership
    from .lock import Lock
    from .locker import Locker
    from .lockset import LockSet
    from .retry import Retry, RetryState, exponential_backoff

__version__ = "0.1.0"

__all__ = [
    "AccessDeniedError",
    "Backend",
    "BackendUnavailableError",
    "Capabilities",
    "DroppedLockWarning",
    "EventType",
    "ExtendRequest",
    "HeldReason",
    "Holder",
    "Leadership",
    "LeaseLockError",
    "Lock",
    "LockEvent",
    "LockHeldError",
    "LockLostError",
    "LockSet",
    "LockState",
    "LockStateError",
    "Locker",
    "LostReason",
    "MemoryBackend",
    "RateLimitedError",
    "ReleaseWatcher",
    "ReplicationError",
    "Retry",
    "RetryState",
    "ValidationError",
    "__version__",
    "connect",
    "exponential_backoff",
    "register_scheme",
]

#: Where each lazily loaded name lives (PEP 562: loaded on first access, then cached here).
_LAZY = {
    "Backend": ".backends.base",
    "Capabilities": ".backends.base",
    "EventType": ".events",
    "ExtendRequest": ".backends.base",
    "Holder": ".backends.base",
    "Leadership": ".leadership",
    "Lock": ".lock",
    "LockEvent": ".events",
    "LockSet": ".lockset",
    "LockState": ".backends.base",
    "Locker": ".locker",
    "MemoryBackend": ".backends.memory",
    "ReleaseWatcher": ".backends.base",
    "Retry": ".retry",
    "RetryState": ".retry",
    "exponential_backoff": ".retry",
    "register_scheme": ".backends",
}


def __getattr__(name: str) -> _typing.Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> "list[str]":
    return sorted(set(globals()) | set(__all__))
