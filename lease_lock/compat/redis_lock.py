"""A drop-in replacement for python-redis-lock (the ``redis_lock`` module).

Change the import and keep the call sites::

    import lease_lock.compat.redis_lock as redis_lock

    with redis_lock.Lock(redis_client, "reports", expire=60, auto_renewal=True):
        ...

The constructor, the methods, :func:`reset_all` and the exception names are python-redis-lock's,
and so is the storage: the lock is the key ``lock:<name>`` holding the lock's ID (a random
24-character base64 string unless ``id`` is given), and every release pushes one element to the
wake-up list ``lock-signal:<name>`` (expiring after ``signal_expire`` milliseconds), on which
waiters block with ``BLPOP``. Processes on python-redis-lock and on this module therefore exclude
each other on the same names, and a waiter of either kind is woken by a release of the other.

Where a lease differs:

- ``expire=None`` never expires in python-redis-lock, so a crashed holder keeps the name for
  ever. Here it is a lease of ``lease_ttl`` seconds (30 by default) renewed by a lease_lock
  heartbeat while held, so a crashed holder's name comes free when the lease runs out. The ID
  must then be at most 56 bytes. Waiters re-check the key at least every ``lease_ttl`` seconds,
  because the end of a crashed holder's lease sends no wake-up.
- ``auto_renewal=True`` is also held by the heartbeat (with ``expire`` as the lease) instead of
  a renewal thread per lock; the heartbeat marks the lock lost when a renewal is refused, and
  :attr:`Lock.lease` exposes that. ``AlreadyStarted`` is kept for ``except`` clauses but is
  never raised.
- :func:`reset_all` walks the ``lock:*`` keys with ``SCAN`` instead of one ``KEYS`` script, so
  it does not block the server, and is not atomic across keys.
"""

from __future__ import annotations

import logging
from base64 import b64encode
from os import urandom
from types import TracebackType
from typing import Any, Optional, Union

from ..errors import LockLostError, LockStateError
from ..lock import Lock as Lease
from ._store import PeerRedisBackend, heartbeat_locker, lease_token

__all__ = [
    "AlreadyAcquired",
    "AlreadyStarted",
    "InvalidTimeout",
    "Lock",
    "NotAcquired",
    "NotExpirable",
    "TimeoutNotUsable",
    "TimeoutTooLarge",
    "reset_all",
]

logger = logging.getLogger(__name__)

_PREFIX = "lock:"
_SIGNAL_PREFIX = "lock-signal:"


class AlreadyAcquired(RuntimeError):
    """``acquire()`` on a lock whose ID already holds the name."""


class NotAcquired(RuntimeError):
    """Release or extension of a lock its ID does not hold (never acquired, expired or reset)."""


class AlreadyStarted(RuntimeError):
    """Kept for ``except`` clauses written for python-redis-lock; never raised here."""


class TimeoutNotUsable(RuntimeError):
    """``acquire(blocking=False, timeout=...)``: a timeout needs a blocking acquire."""


class InvalidTimeout(RuntimeError):
    """A negative ``timeout``."""


class TimeoutTooLarge(RuntimeError):
    """A ``timeout`` longer than ``expire`` on a lock without ``auto_renewal``."""


class NotExpirable(RuntimeError):
    """``extend()`` of a lock that has no expiry to extend."""


def _check_expire(expire: Any) -> Optional[int]:
    if not expire:
        return None
    seconds = int(expire)
    if seconds < 0:
        raise ValueError("A negative expire is not acceptable.")
    return seconds


class Lock:
    """A lock on ``lock:<name>`` with python-redis-lock's interface.

    ``expire`` is the lock's life in whole seconds (``None``: held by the heartbeat);
    ``id`` the value stored (``str``, or ``bytes`` taken as ASCII, else base64-encoded);
    ``auto_renewal`` keeps renewing ``expire`` while held; ``strict`` requires a
    ``redis.StrictRedis`` client; ``signal_expire`` is how long (ms) a wake-up waits for a
    waiter; ``blocking`` is what ``with`` passes to ``acquire()``. ``lease_ttl`` (keyword
    only, not in python-redis-lock) is the lease renewed when ``expire`` is ``None``.
    """

    def __init__(
        self,
        redis_client: Any,
        name: str,
        expire: Optional[Union[int, float, str]] = None,
        id: Optional[Union[str, bytes]] = None,
        auto_renewal: bool = False,
        strict: bool = True,
        signal_expire: int = 1000,
        blocking: bool = True,
        *,
        lease_ttl: float = 30.0,
    ) -> None:
        if strict:
            from redis import StrictRedis

            if not isinstance(redis_client, StrictRedis):
                raise ValueError(
                    "redis_client must be instance of StrictRedis. Use strict=False if you know what you're doing."
                )
        if auto_renewal and expire is None:
            raise ValueError("Expire may not be None when auto_renewal is set")
        self._client = redis_client
        self._expire = _check_expire(expire)
        self._auto_renewal = auto_renewal
        self._signal_expire = signal_expire
        if id is None:
            self._id = b64encode(urandom(18)).decode("ascii")
        elif isinstance(id, bytes):
            try:
                self._id = id.decode("ascii")
            except UnicodeDecodeError:
                self._id = b64encode(id).decode("ascii")
        elif isinstance(id, str):
            self._id = id
        else:
            raise TypeError(f"Incorrect type for `id`. Must be bytes/str not {type(id)}.")
        self._name = _PREFIX + name
        self._signal = _SIGNAL_PREFIX + name
        self.blocking = blocking
        self.lease_ttl = lease_ttl
        self._lease: Optional[Lease] = None
        self._store_instance: Optional[PeerRedisBackend] = None

    @property
    def _store(self) -> PeerRedisBackend:
        # Built on first use: python-redis-lock lets a Lock be made on any object with
        # strict=False, and only touches the client when the lock is used.
        if self._store_instance is None:
            signal = self._signal  # not self: a cycle would keep a dropped lock (and its lease) alive
            self._store_instance = PeerRedisBackend(
                self._client, signal_of=lambda _key: signal, signal_expire_ms=self._signal_expire
            )
        return self._store_instance

    @property
    def id(self) -> str:
        """The value this lock stores in ``lock:<name>`` while it holds it."""
        return self._id

    @property
    def lease(self) -> Optional[Lease]:
        """The lease_lock lease behind a held heartbeat lock (``expire=None`` or
        ``auto_renewal``), whose ``lost`` event is set if the heartbeat loses it; else ``None``."""
        return self._lease

    @property
    def _held_by_heartbeat(self) -> bool:
        return self._expire is None or self._auto_renewal

    def get_owner_id(self) -> Optional[str]:
        """The ID stored in ``lock:<name>`` (whoever holds it), or ``None`` when free."""
        owner = self._store.value(self._name)
        return None if owner is None else owner.decode("ascii", "replace")

    def acquire(self, blocking: bool = True, timeout: Optional[Union[int, float, str]] = None) -> bool:
        """Take the name; ``False`` when not blocking and held, or when ``timeout`` passes.

        A blocked call waits on the wake-up list, so a release by any process (on this module or
        on python-redis-lock) wakes one waiter at once; ``timeout`` (whole seconds) bounds each
        wait, as in python-redis-lock.
        """
        if self._id == self.get_owner_id():
            raise AlreadyAcquired("Already acquired from this Lock instance.")
        if not blocking and timeout is not None:
            raise TimeoutNotUsable("Timeout cannot be used if blocking=False")
        seconds: Optional[int] = None
        if timeout:
            seconds = int(timeout)
            if seconds < 0:
                raise InvalidTimeout(f"Timeout ({seconds}) cannot be less than or equal to 0")
            if self._expire and not self._auto_renewal and seconds > self._expire:
                raise TimeoutTooLarge(f"Timeout ({seconds}) cannot be greater than expire ({self._expire})")
        if self._held_by_heartbeat:
            lease_token(self._id.encode("utf-8"))  # a bad ID fails before anything is written
        # python-redis-lock waits for ever on a lock without expiry; a crashed heartbeat holder's
        # lease ends without a wake-up, so such a wait re-checks the key once per lease.
        wait: float = seconds or self._expire or self.lease_ttl
        timed_out = False
        while not self._try_acquire():
            if timed_out or not blocking:
                return False
            woken = self._client.blpop([self._signal], wait)
            timed_out = not woken and bool(seconds)
        return True

    def _try_acquire(self) -> bool:
        value = self._id.encode("utf-8")
        if not self._held_by_heartbeat:
            return self._store.create(self._name, value, self._expire)
        ttl = float(self._expire) if self._auto_renewal and self._expire else self.lease_ttl
        if not self._store.create(self._name, value, ttl):
            return False
        locker = heartbeat_locker(self._client, signal_prefix=_SIGNAL_PREFIX, signal_expire_ms=self._signal_expire)
        lease = locker.lock(self._name, ttl=ttl, token=lease_token(value))
        # Same token, so this renews the key just written and starts the heartbeat on it.
        if not lease.acquire(blocking=False):
            # The key changed hands in between, or the grant came back late: give back what
            # may still be ours rather than leave it to run out.
            self._store.release_peer(self._name, value)
            return False
        self._lease = lease
        return True

    def extend(self, expire: Optional[Union[int, float, str]] = None) -> None:
        """Set the lock's remaining life to ``expire`` seconds (default: the constructor's).

        ``NotAcquired`` when this ID does not hold the name, ``NotExpirable`` when the lock has
        no expiry (made with ``expire=None``), ``TypeError`` when no ``expire`` is known.
        """
        seconds = _check_expire(expire)
        if seconds is None:
            if self._expire is None:
                raise TypeError(
                    "To extend a lock 'expire' must be provided as an argument to extend() method "
                    "or at initialization time."
                )
            seconds = self._expire
        lease = self._lease
        if lease is not None and self._expire is None:
            raise NotExpirable(f"Lock {self._name} has no assigned expiration time")
        if lease is not None and lease.state == "held":
            # Through the lease, so that the heartbeat renews to the new length from now on.
            try:
                lease.extend(float(seconds))
            except (LockLostError, LockStateError) as error:
                raise NotAcquired(f"Lock {self._name} is not acquired or it already expired.") from error
            return
        answer = self._store.extend_peer(self._name, self._id.encode("utf-8"), float(seconds))
        if answer == 1:
            raise NotAcquired(f"Lock {self._name} is not acquired or it already expired.")
        if answer == 2:
            raise NotExpirable(f"Lock {self._name} has no assigned expiration time")

    def release(self) -> None:
        """Give the name back and wake one waiter; ``NotAcquired`` if this ID does not hold it.

        Any lock with the same name and ID may release it, as in python-redis-lock.
        """
        lease, self._lease = self._lease, None
        if lease is not None and lease.state in ("held", "lost"):
            released = lease.release()
        else:
            released = self._store.release_peer(self._name, self._id.encode("utf-8"))
        if not released:
            raise NotAcquired(f"Lock({self._name}) is not acquired or it already expired.")

    def reset(self) -> None:
        """Delete the lock whoever holds it and wake one waiter. Use with care."""
        self._store.force_release_peer(self._name)

    def locked(self) -> bool:
        """``True`` if anyone holds the name (whatever its ID)."""
        return bool(self._client.exists(self._name) == 1)

    def __enter__(self) -> Lock:
        if not self.acquire(blocking=self.blocking):
            raise NotAcquired(f"Lock({self._name}) is not acquired or it already expired.")
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]] = None,
        exc_value: Optional[BaseException] = None,
        traceback: Optional[TracebackType] = None,
    ) -> None:
        self.release()


def reset_all(redis_client: Any) -> None:
    """Delete every ``lock:*`` key and wake one waiter of each. Use with care (after a crash)."""
    store = PeerRedisBackend(redis_client, signal_of=lambda key: _SIGNAL_PREFIX + key[len(_PREFIX) :])
    for key in list(redis_client.scan_iter(match=_PREFIX + "*", count=1000)):
        name = key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
        store.force_release_peer(name)
