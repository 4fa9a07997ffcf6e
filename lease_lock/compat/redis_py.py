"""A drop-in replacement for redis-py's ``redis.lock.Lock``.

Use it where the old lock was made::

    from lease_lock.compat.redis_py import Lock

    lock = redis_client.lock("reports", lock_class=Lock, timeout=30)

The signature, the methods and the errors (redis-py's own ``LockError`` and
``LockNotOwnedError``) are redis-py's, and so is the storage: the Redis key is the lock's name
and its value the token, written with ``SET NX``. A process still running redis-py's lock and one
running this class therefore exclude each other on the same name during a rolling upgrade, and
either side's release frees the name for the other.

One difference is deliberate: a lock made with ``timeout=None`` (or ``0``) never expires in
redis-py, so a crashed holder keeps the name until someone deletes it by hand. Here such a lock is
a lease of ``lease_ttl`` seconds (30 by default) that a lease_lock heartbeat keeps renewing while
the lock is held, so ``PTTL`` shows a lease rather than ``-1``, and a crashed holder's name comes
free when its lease runs out. Its token must then be at most 56 bytes. ``extend()`` and
``reacquire()`` still refuse such a lock, as in redis-py, since the heartbeat manages its expiry.
A lock made with a ``timeout`` behaves exactly as redis-py's: it expires after ``timeout``
seconds unless extended.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from types import SimpleNamespace, TracebackType
from typing import Any, Optional, Union

from redis.exceptions import LockError, LockNotOwnedError

from ..lock import Lock as Lease
from ._store import PeerRedisBackend, heartbeat_locker, lease_token

__all__ = ["Lock", "LockError", "LockNotOwnedError"]

logger = logging.getLogger(__name__)

Number = Union[int, float]


def _error(cls: type[LockError], message: str, name: str) -> LockError:
    """``cls(message, lock_name=name)``; redis-py before 5 has no ``lock_name``."""
    try:
        return cls(message, lock_name=name)  # type: ignore[call-arg, unused-ignore]
    except TypeError:
        return cls(message)


class _ThreadLocal(threading.local):
    # Class-level defaults are seen by every thread, not only the one that made the lock.
    token: Optional[bytes] = None
    lease: Optional[Lease] = None


class Lock:
    """A lock on the Redis key ``name`` with redis-py's ``Lock`` interface.

    ``timeout`` is the lock's life in seconds (``None``: held by the heartbeat, see the module
    docstring); ``sleep`` the pause between attempts while another holds the name; ``blocking``
    and ``blocking_timeout`` whether ``acquire()`` waits and for how long at most;
    ``thread_local`` whether the token is kept per thread; ``raise_on_release_error`` whether
    leaving a ``with`` block re-raises a failed release (otherwise it is logged). ``lease_ttl``
    (keyword only, not in redis-py) is the lease the heartbeat renews when ``timeout`` is
    ``None``.
    """

    def __init__(
        self,
        redis: Any,
        name: str,
        timeout: Optional[Number] = None,
        sleep: Number = 0.1,
        blocking: bool = True,
        blocking_timeout: Optional[Number] = None,
        thread_local: bool = True,
        raise_on_release_error: bool = True,
        *,
        lease_ttl: float = 30.0,
    ) -> None:
        self.redis = redis
        self.name = name
        self.timeout = timeout
        self.sleep = sleep
        self.blocking = blocking
        self.blocking_timeout = blocking_timeout
        self.thread_local = bool(thread_local)
        self.raise_on_release_error = raise_on_release_error
        self.lease_ttl = lease_ttl
        self.local: Any = _ThreadLocal() if self.thread_local else SimpleNamespace(token=None, lease=None)
        self._store = PeerRedisBackend(redis)

    @property
    def lease(self) -> Optional[Lease]:
        """The lease_lock lease behind a held ``timeout=None`` lock (this thread's, with
        ``thread_local``), whose ``lost`` event is set if the heartbeat loses it; else ``None``."""
        lease: Optional[Lease] = self.local.lease
        return lease

    def __enter__(self) -> Lock:
        if self.acquire():
            return self
        raise _error(LockError, "Unable to acquire lock within the time specified", self.name)

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc_value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        try:
            self.release()
        except LockError:
            if self.raise_on_release_error:
                raise
            logger.warning("Lock was unlocked or no longer owned when exiting context manager.")

    def acquire(
        self,
        sleep: Optional[Number] = None,
        blocking: Optional[bool] = None,
        blocking_timeout: Optional[Number] = None,
        token: Optional[Union[str, bytes]] = None,
    ) -> bool:
        """Take the name; ``True`` once held, ``False`` when not blocking or out of time.

        ``token`` is the value to store (``str`` or ``bytes``); a fresh UUID by default.
        """
        sleep = self.sleep if sleep is None else sleep
        blocking = self.blocking if blocking is None else blocking
        blocking_timeout = self.blocking_timeout if blocking_timeout is None else blocking_timeout
        value: bytes = uuid.uuid1().hex.encode() if token is None else self.redis.get_encoder().encode(token)
        if not self.timeout:
            lease_token(value)  # a bad token fails before anything is written
        stop_trying_at = None if blocking_timeout is None else time.monotonic() + blocking_timeout
        while True:
            if self.do_acquire(value):
                self.local.token = value
                return True
            if not blocking:
                return False
            next_try_at = time.monotonic() + sleep
            if stop_trying_at is not None and next_try_at > stop_trying_at:
                return False
            time.sleep(sleep)

    def do_acquire(self, token: bytes) -> bool:
        """One attempt: ``SET name token NX`` with the lock's expiry (or the heartbeat's lease)."""
        if self.timeout:
            return self._store.create(self.name, token, self.timeout)
        if not self._store.create(self.name, token, self.lease_ttl):
            return False
        lease = heartbeat_locker(self.redis).lock(self.name, ttl=self.lease_ttl, token=lease_token(token))
        # Same token, so this renews the key just written and starts the heartbeat on it.
        if not lease.acquire(blocking=False):
            # The key changed hands in between, or the grant came back late: give back what
            # may still be ours rather than leave it to run out.
            self._store.release_peer(self.name, token)
            return False
        self.local.lease = lease
        return True

    def locked(self) -> bool:
        """``True`` if anyone holds the name."""
        return self._store.value(self.name) is not None

    def owned(self) -> bool:
        """``True`` if this lock (this thread's token, with ``thread_local``) holds the name."""
        token = self.local.token
        return token is not None and self._store.value(self.name) == token

    def release(self) -> None:
        """Give the name back; ``LockError`` if not acquired, ``LockNotOwnedError`` if lost."""
        expected = self.local.token
        if expected is None:
            raise _error(LockError, "Cannot release a lock that's not owned or is already unlocked.", self.name)
        lease, self.local.lease = self.local.lease, None
        self.local.token = None
        self.do_release(expected, lease)

    def do_release(self, expected_token: bytes, lease: Optional[Lease] = None) -> None:
        """Delete the key if ``expected_token`` holds it (through ``lease`` when there is one)."""
        released = lease.release() if lease is not None else self._store.release_peer(self.name, expected_token)
        if not released:
            raise _error(LockNotOwnedError, "Cannot release a lock that's no longer owned", self.name)

    def extend(self, additional_time: Number, replace_ttl: bool = False) -> bool:
        """Add ``additional_time`` seconds to the lock's remaining life (or, with
        ``replace_ttl``, set it to that); a lock without ``timeout`` cannot be extended."""
        if self.local.token is None:
            raise _error(LockError, "Cannot extend an unlocked lock", self.name)
        if self.timeout is None:
            raise _error(LockError, "Cannot extend a lock with no timeout", self.name)
        return self.do_extend(additional_time, replace_ttl)

    def do_extend(self, additional_time: Number, replace_ttl: bool) -> bool:
        """Run the extension; ``LockNotOwnedError`` when the token no longer holds the key."""
        # timeout=0 passes redis-py's check but leaves a key without expiry, which its script
        # then refuses; here the heartbeat owns that key's expiry, so refuse it the same way.
        if self.lease is not None or self._store.extend_peer(
            self.name, self.local.token, additional_time, add=not replace_ttl
        ):
            raise _error(LockNotOwnedError, "Cannot extend a lock that's no longer owned", self.name)
        return True

    def reacquire(self) -> bool:
        """Reset the lock's remaining life to ``timeout`` seconds."""
        if self.local.token is None:
            raise _error(LockError, "Cannot reacquire an unlocked lock", self.name)
        if self.timeout is None:
            raise _error(LockError, "Cannot reacquire a lock with no timeout", self.name)
        return self.do_reacquire()

    def do_reacquire(self) -> bool:
        """Run the reset; ``LockNotOwnedError`` when the token no longer holds the key."""
        if self.lease is not None or self._store.extend_peer(self.name, self.local.token, self.timeout or 0):
            raise _error(LockNotOwnedError, "Cannot reacquire a lock that's no longer owned", self.name)
        return True
