"""Errors raised by lease_lock.

Every error the library raises derives from :class:`LeaseLockError` and carries a stable
``code`` that does not change between releases, so callers can match on it instead of on
message text. A store that cannot be reached (refused, reset or timed-out connections, a server
shutting down, a database locked past its busy timeout) is reported as
:class:`BackendUnavailableError` whatever the driver, with the driver's own exception as its
``__cause__``. Every other driver error (a programming error, a permission error) reaches the
caller exactly as the driver raised it.

The tree::

    LeaseLockError
    ├── LockHeldError          LOCK_HELD          another holder has the key
    ├── LockLostError          LOCK_LOST          our lease ended before we were done
    ├── LockStateError         LOCK_STATE         the API was used in the wrong order
    ├── ValidationError        LOCK_VALIDATION    bad argument or misconfiguration (a ValueError)
    ├── RateLimitedError       LOCK_RATE_LIMITED  the HTTP lock service asked us to slow down
    ├── ReplicationError       LOCK_REPLICATION   too few Redis replicas acknowledged a write
    ├── AccessDeniedError      LOCK_ACCESS_DENIED the HTTP lock service refused the credential
    └── BackendUnavailableError LOCK_BACKEND_UNAVAILABLE  the store cannot be reached

All errors pickle and unpickle with their attributes, so they survive multiprocessing and
task queues.

One warning: :class:`DroppedLockWarning`, a ``RuntimeWarning`` (shown by Python's default
warning filters), for a held lock that the program dropped.
"""

from __future__ import annotations

from typing import Any, Literal

__all__ = [
    "AccessDeniedError",
    "BackendUnavailableError",
    "DroppedLockWarning",
    "HeldReason",
    "LeaseLockError",
    "LockHeldError",
    "LockLostError",
    "LockStateError",
    "LostReason",
    "RateLimitedError",
    "ReplicationError",
    "ValidationError",
]

#: Why a key could not be acquired: :attr:`LockHeldError.reason` (see :class:`LockHeldError`).
HeldReason = Literal["held", "timeout", "cancelled", "late-acquire"]

#: How a held lease ended: :attr:`LockLostError.reason` and ``Lock.lost_reason`` (see
#: :class:`LockLostError`).
LostReason = Literal[
    "expired", "extend", "extend-failed", "late-extend", "max-hold", "release", "observed", "closed", "forked"
]


class LeaseLockError(Exception):
    """Root of every error lease_lock raises itself.

    ``code`` is stable across releases; ``str(error)`` is meant for people, not for matching.
    """

    code = "LEASE_LOCK"

    def __init__(self, message: str = "", **attributes: Any) -> None:
        super().__init__(message)
        self.message = message
        self._attributes = attributes
        for name, value in attributes.items():
            setattr(self, name, value)

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword attributes are not part of ``args``; rebuild through a helper so that
        # pickling keeps them (the default reduce would call ``cls(message)`` only).
        return (_rebuild, (type(self), self.message, self._attributes, self.__dict__))

    def __str__(self) -> str:
        return self.message


def _rebuild(
    cls: type[LeaseLockError], message: str, attributes: dict[str, Any], state: dict[str, Any]
) -> LeaseLockError:
    error = cls.__new__(cls)
    LeaseLockError.__init__(error, message, **attributes)
    error.__dict__.update(state)
    return error


class LockHeldError(LeaseLockError):
    """The key could not be acquired.

    ``reason`` says why: ``"held"`` (another holder has it), ``"timeout"`` (the time budget
    ran out), ``"cancelled"`` (the cancel event was set) or ``"late-acquire"`` (the last grant
    came back after its local lease had already ended, and was given back).
    """

    code = "LOCK_HELD"
    key: str
    attempts: int
    elapsed: float
    reason: HeldReason

    def __init__(
        self,
        key: str,
        *,
        attempts: int,
        elapsed: float,
        reason: HeldReason = "held",
        holder: str = "is held elsewhere",
    ) -> None:
        # ``holder`` words who has the key, for the message only (a thread waiting for itself
        # is told so).
        super().__init__(
            f"lock {key!r} {holder} ({reason}; {attempts} attempt(s) in {elapsed:.3f}s)",
            key=key,
            attempts=attempts,
            elapsed=elapsed,
            reason=reason,
        )


class LockLostError(LeaseLockError):
    """Our lease on ``key`` ended while we still relied on it.

    ``reason`` says how the lease ended: ``"expired"`` (the local lease ran out with no
    extension attempted), ``"extend"`` (the store refused an extension), ``"extend-failed"``
    (extensions kept failing until the lease ran out), ``"late-extend"`` (an extension came back
    after the lease had ended), ``"max-hold"`` (the ``max_hold`` deadline), ``"release"``
    (``release()`` found the key gone or another's), ``"observed"`` (a check found the token no
    longer holds the key), ``"closed"`` (the locker was closed) or ``"forked"`` (this process
    is the child of a fork; the parent holds the lock). ``completed`` is ``True`` when the
    protected block (or decorated function) ran to its end before the loss was noticed; then
    ``result`` holds what it returned. The error that caused the loss, if any, is
    ``__cause__``.
    """

    code = "LOCK_LOST"
    key: str
    reason: LostReason
    completed: bool
    result: Any

    def __init__(self, key: str, reason: LostReason, *, completed: bool = False, result: Any = None) -> None:
        # A loss is only noticed at the next renewal, check or release: a block that ran to its
        # end may have run its last part without the lock.
        state = "; the block ran to its end before the loss was noticed" if completed else " while held"
        super().__init__(
            f"lock {key!r} was lost{state} (reason: {reason})",
            key=key,
            reason=reason,
            completed=completed,
            result=result,
        )


class LockStateError(LeaseLockError):
    """A lock or locker was used in an order the API does not allow.

    Examples: extending a released lock, acquiring a lock object a second time, using a
    closed locker.
    """

    code = "LOCK_STATE"


class ValidationError(LeaseLockError, ValueError):
    """An argument broke a rule, or a backend is misconfigured.

    Raised before anything is written. The message names the argument and the rule.
    """

    code = "LOCK_VALIDATION"


class RateLimitedError(LeaseLockError):
    """The HTTP lock service answered 429; ``retry_after`` is in seconds."""

    code = "LOCK_RATE_LIMITED"
    retry_after: float
    status: int

    def __init__(self, message: str, *, retry_after: float, status: int = 429) -> None:
        super().__init__(message, retry_after=retry_after, status=status)


class ReplicationError(LeaseLockError):
    """Fewer Redis replicas than asked for acknowledged a lock write in time."""

    code = "LOCK_REPLICATION"
    replicas: int
    acknowledged: int

    def __init__(self, message: str, *, replicas: int, acknowledged: int) -> None:
        super().__init__(message, replicas=replicas, acknowledged=acknowledged)


class AccessDeniedError(LeaseLockError):
    """The HTTP lock service refused the credential (401) or its scope (403)."""

    code = "LOCK_ACCESS_DENIED"
    status: int

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message, status=status)


class BackendUnavailableError(LeaseLockError):
    """The store could not be reached, so the outcome of the call is unknown or nothing was done.

    Raised by every backend for connection-level failures: a refused, reset or timed-out
    connection, a server that is shutting down, a database that stayed locked past its busy
    timeout, an HTTP transport failure or a ``503`` that persisted through the documented
    retry. The driver's own exception is ``__cause__``; ``backend`` names the backend (for
    example ``"redis"``) and the message never contains a password or service key.

    Lock operations are idempotent by token, so retrying after this error is safe: a blocking
    acquire keeps trying until its timeout, and the heartbeat keeps extending until the lease
    would end.
    """

    code = "LOCK_BACKEND_UNAVAILABLE"
    backend: str

    def __init__(self, message: str, *, backend: str) -> None:
        super().__init__(message, backend=backend)


class DroppedLockWarning(RuntimeWarning):
    """A held lock was garbage-collected: the program dropped the ``Lock`` it was given.

    ``if locker.try_acquire(key): work()`` drops the returned lock at once, so its lease is
    given back at once and ``work()`` runs without it. A ``RuntimeWarning`` rather than a
    ``ResourceWarning`` because the program's own code lost its protection, not just a
    resource: Python's default filters show it. The message names the key and the call that
    returned the lock.
    """
