"""lease_lock: distributed lease locks for synchronous Python.

``lease_lock.connect(url)`` gives a :class:`Locker`; ``with locker.lock(key):`` holds a lease on
``key`` with a heartbeat keeping it alive, a loss signal, and optional fencing tokens. This
module only re-exports the public names; importing it imports no database driver.
"""

from .backends import register_scheme
from .backends.base import Backend, Capabilities, ExtendRequest, LockState, ReleaseWatcher
from .backends.memory import MemoryBackend
from .connect import connect
from .errors import (
    AccessDeniedError,
    BackendUnavailableError,
    LeaseLockError,
    LockHeldError,
    LockLostError,
    LockStateError,
    RateLimitedError,
    ReplicationError,
    ValidationError,
)
from .events import LockEvent
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
    "ExtendRequest",
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
