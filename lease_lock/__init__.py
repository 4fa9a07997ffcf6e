"""lease_lock: distributed lease locks for synchronous Python."""

from .backends.base import Backend, Capabilities, LockState
from .backends.memory import MemoryBackend
from .errors import (
    AccessDeniedError,
    LeaseLockError,
    LockHeldError,
    LockLostError,
    LockStateError,
    RateLimitedError,
    ReplicationError,
    ValidationError,
)

__version__ = "0.1.0"

__all__ = [
    "AccessDeniedError",
    "Backend",
    "Capabilities",
    "LeaseLockError",
    "LockHeldError",
    "LockLostError",
    "LockState",
    "LockStateError",
    "MemoryBackend",
    "RateLimitedError",
    "ReplicationError",
    "ValidationError",
    "__version__",
]
