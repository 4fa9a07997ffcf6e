"""Leases in Redis stored the way redis-py's and python-redis-lock's locks store theirs.

The two peer libraries keep a lock as one string key whose value is the holder's token, written
with ``SET NX`` and removed by a compare-and-delete script. :class:`PeerRedisBackend` keeps
exactly that layout, so a process still running the peer library and one running a shim exclude
each other on the same key, and either can release a lock the other took with the same token.

It is a lease_lock :class:`~lease_lock.Backend` so that the shims' locks without an expiry can
be held by the ordinary heartbeat (a :class:`~lease_lock.Locker` on this backend). Its tokens
are the peer token's bytes, hex-encoded behind a fixed prefix (:func:`lease_token`), because
peer tokens may use any bytes while lease_lock tokens are restricted to a safe alphabet; the
value written to Redis is always the peer token itself.

A backend made with ``signal_of`` also announces every release and forced release the way
python-redis-lock does: the signal list of the key is replaced by one element and expires after
``signal_expire_ms``, which wakes one peer process blocked in ``BLPOP`` on it.
"""

from __future__ import annotations

import hashlib
import math
import threading
import weakref
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, ClassVar, Optional

from ..backends.base import Backend, Capabilities, LockState
from ..errors import ValidationError
from ..locker import Locker

__all__ = [
    "LEASE_TOKEN_PREFIX",
    "MAX_PEER_TOKEN_BYTES",
    "PeerRedisBackend",
    "heartbeat_locker",
    "lease_token",
    "peer_token",
]

#: Put before the hex form of a peer token to make a lease_lock token of legal length.
LEASE_TOKEN_PREFIX = "lease-lock-peer:"  # noqa: S105 - a fixed prefix, not a secret
#: The longest peer token a heartbeat-held lease can carry (lease_lock tokens are <= 128 chars).
MAX_PEER_TOKEN_BYTES = (128 - len(LEASE_TOKEN_PREFIX)) // 2

# KEYS[1] key; ARGV[1] token, ARGV[2] lease in ms. Grant a free key, or renew it for its holder.
_ACQUIRE = """
local value = redis.call('get', KEYS[1])
if value == false then
    redis.call('set', KEYS[1], ARGV[1], 'px', ARGV[2])
    return 1
end
if value == ARGV[1] then
    redis.call('pexpire', KEYS[1], ARGV[2])
    return 1
end
return 0
"""

# KEYS[1] key, KEYS[2] signal list (optional); ARGV[1] token, ARGV[2] signal expiry in ms.
_RELEASE = """
if redis.call('get', KEYS[1]) ~= ARGV[1] then
    return 0
end
redis.call('del', KEYS[1])
if KEYS[2] then
    redis.call('del', KEYS[2])
    redis.call('lpush', KEYS[2], 1)
    redis.call('pexpire', KEYS[2], ARGV[2])
end
return 1
"""

# KEYS[1] key, KEYS[2] signal list (optional); ARGV[1] signal expiry in ms.
_FORCE_RELEASE = """
local deleted = redis.call('del', KEYS[1])
if KEYS[2] then
    redis.call('del', KEYS[2])
    redis.call('lpush', KEYS[2], 1)
    redis.call('pexpire', KEYS[2], ARGV[1])
end
return deleted
"""

# KEYS[1] key; ARGV[1] token, ARGV[2] ms, ARGV[3] "1" to add to the remaining time, "0" to
# replace it, "-" to replace it even on a key without expiry. 0 done, 1 not ours, 2 no expiry.
_EXTEND = """
if redis.call('get', KEYS[1]) ~= ARGV[1] then
    return 1
end
local left = redis.call('pttl', KEYS[1])
if left < 0 and ARGV[3] ~= '-' then
    return 2
end
local ms = tonumber(ARGV[2])
if ARGV[3] == '1' then
    ms = ms + left
end
redis.call('pexpire', KEYS[1], ms)
return 0
"""

# KEYS[1] key. The value, its PTTL and the server clock, read atomically.
_INSPECT = """
local now = redis.call('time')
return {redis.call('get', KEYS[1]), redis.call('pttl', KEYS[1]), now[1], now[2]}
"""

# The SHA1 each script is cached under on the server.
_SHA = {
    script: hashlib.sha1(script.encode()).hexdigest()  # noqa: S324 - the name Redis gives a script
    for script in (_ACQUIRE, _RELEASE, _FORCE_RELEASE, _EXTEND, _INSPECT)
}


def lease_token(token: bytes) -> str:
    """The lease_lock token that stands for the peer token ``token`` (see :func:`peer_token`)."""
    if not token:
        raise ValidationError("token must not be empty")
    if len(token) > MAX_PEER_TOKEN_BYTES:
        raise ValidationError(
            f"token is {len(token)} bytes; a lock held by the heartbeat (no expiry given) takes "
            f"tokens of at most {MAX_PEER_TOKEN_BYTES} bytes"
        )
    return LEASE_TOKEN_PREFIX + token.hex()


def peer_token(token: str) -> bytes:
    """The bytes stored in Redis for the lease_lock token ``token`` made by :func:`lease_token`."""
    if not token.startswith(LEASE_TOKEN_PREFIX):
        raise ValidationError(f"token must start with {LEASE_TOKEN_PREFIX!r} on this backend")
    try:
        return bytes.fromhex(token[len(LEASE_TOKEN_PREFIX) :])
    except ValueError as error:
        raise ValidationError("token must be hex digits after its prefix on this backend") from error


def _millis(seconds: float) -> int:
    # PX and PEXPIRE take whole milliseconds and refuse 0.
    return max(1, round(seconds * 1000))


class PeerRedisBackend(Backend):
    """Leases whose Redis value is the bare peer token; no fences, no owner label.

    ``client`` is a ``redis.Redis`` (either ``decode_responses`` setting works). ``signal_of``
    maps a key to its wake-up list (python-redis-lock's ``lock-signal:<name>``), or ``None`` for
    no wake-ups; ``signal_expire_ms`` is how long a wake-up waits for a taker.
    """

    capabilities: ClassVar[Capabilities] = Capabilities(
        server_clock=True,
        fencing=False,
        release_notify=False,
        replica_wait=False,
        scan=False,
        batch_extend=False,
        counting=False,
        min_ttl=0.0,
        clock="the Redis server's clock (key expiry)",
        wake="none: waiters pause 0.2 s between attempts",
    )

    def __init__(
        self,
        client: Any,
        *,
        signal_of: Optional[Callable[[str], str]] = None,
        signal_expire_ms: int = 1000,
    ) -> None:
        if not callable(getattr(client, "evalsha", None)):
            raise ValidationError(f"client must be a redis.Redis, not {type(client).__name__}")
        #: The redis-py client the backend talks through.
        self.client = client
        self.signal_of = signal_of
        self.signal_expire_ms = signal_expire_ms

    def _run(self, script: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        # By hash first; after a restart or SCRIPT FLUSH the server has forgotten the script,
        # and EVAL runs (and caches) it again. Not redis-py's register_script: its Script
        # objects keep the client alive, and the heartbeat's backend holds the client weakly.
        from redis.exceptions import NoScriptError

        try:
            return self.client.evalsha(_SHA[script], len(keys), *keys, *args)
        except NoScriptError:
            return self.client.eval(script, len(keys), *keys, *args)

    def _keys(self, key: str) -> list[str]:
        return [key] if self.signal_of is None else [key, self.signal_of(key)]

    # -- the peer protocol, on peer tokens (bytes) ---------------------------------------------

    def create(self, key: str, token: bytes, ttl: Optional[float]) -> bool:
        """``SET key token NX`` with a ``PX`` of ``ttl`` seconds (none if ``None``): the peers'
        own acquisition, which a holder's token cannot renew."""
        return bool(self.client.set(key, token, nx=True, px=None if ttl is None else _millis(ttl)))

    def release_peer(self, key: str, token: bytes) -> bool:
        """Delete ``key`` if ``token`` holds it (and wake one waiter); ``True`` when it did."""
        return bool(self._run(_RELEASE, self._keys(key), [token, self.signal_expire_ms]))

    def force_release_peer(self, key: str) -> bool:
        """Delete ``key`` whoever holds it, and wake one waiter; ``True`` when a key was deleted."""
        return bool(self._run(_FORCE_RELEASE, self._keys(key), [self.signal_expire_ms]))

    def extend_peer(self, key: str, token: bytes, ttl: float, *, add: bool = False, strict: bool = True) -> int:
        """Set (or with ``add``, lengthen) the expiry of ``key`` if ``token`` holds it.

        Returns 0 when done, 1 when ``token`` does not hold the key, 2 when the key has no
        expiry and ``strict`` refuses to give it one.
        """
        mode = "1" if add else ("0" if strict else "-")
        return int(self._run(_EXTEND, [key], [token, _millis(ttl), mode]))

    def value(self, key: str) -> Optional[bytes]:
        """The token stored at ``key`` as bytes, or ``None`` when the key is free."""
        stored = self.client.get(key)
        if stored is None or isinstance(stored, bytes):
            return stored
        return str(stored).encode("utf-8")

    # -- the lease_lock backend primitives (lease tokens) --------------------------------------

    def acquire(self, key: str, token: str, ttl: float, owner: str) -> bool:
        """Grant ``key`` to ``token`` for ``ttl`` seconds, or renew it for its holder."""
        return bool(self._run(_ACQUIRE, [key], [peer_token(token), _millis(ttl)]))

    def acquire_fenced(self, key: str, token: str, ttl: float, owner: str) -> Optional[int]:
        """Not offered: the peer layout has no room for a fence (``capabilities.fencing`` is off)."""
        raise NotImplementedError("the peer-format Redis store keeps no fences")

    def release(self, key: str, token: str) -> bool:
        """Delete ``key`` if ``token`` holds it (and wake one waiter); ``True`` when it did."""
        return self.release_peer(key, peer_token(token))

    def extend(self, key: str, token: str, ttl: float) -> bool:
        """Replace the lease of ``key`` with ``ttl`` seconds from now if ``token`` holds it."""
        return self.extend_peer(key, peer_token(token), ttl, strict=False) == 0

    def is_held(self, key: str, token: str) -> bool:
        """``True`` if ``token`` holds ``key`` (one ``GET``)."""
        return self.value(key) == peer_token(token)

    def inspect(self, key: str) -> LockState:
        """Whether ``key`` is held and for how long; no fence or owner is stored."""
        value, pttl, seconds, micros = self._run(_INSPECT, [key], [])
        if value is None or int(pttl) == -2:
            return LockState.free(key)
        if int(pttl) < 0:
            return LockState(key=key, held=True)
        now = datetime.fromtimestamp(int(seconds), tz=timezone.utc) + timedelta(microseconds=int(micros))
        left = int(pttl) / 1000
        return LockState(key=key, held=True, expires_at=now + timedelta(seconds=left), expires_in=left)

    def force_release(self, key: str) -> bool:
        """Delete ``key`` whoever holds it, and wake one waiter."""
        return self.force_release_peer(key)

    def check_token(self, token: str) -> None:
        """Only tokens made by :func:`lease_token` stand for a peer token."""
        peer_token(token)

    def new_token(self) -> str:
        """A fresh random peer token, in its lease_lock form."""
        return lease_token(super().new_token().encode("ascii"))


_LOCKERS: weakref.WeakKeyDictionary[Any, dict[tuple[Optional[str], int], Locker]] = weakref.WeakKeyDictionary()
_LOCKERS_MUTEX = threading.Lock()


def heartbeat_locker(client: Any, *, signal_prefix: Optional[str] = None, signal_expire_ms: int = 1000) -> Locker:
    """The :class:`~lease_lock.Locker` that keeps the shims' heartbeat locks alive on ``client``.

    One per client and signal setting, so a process has one heartbeat thread per Redis client
    however many shim locks it makes. ``signal_prefix`` turns ``lock:<name>`` keys into
    ``<signal_prefix><name>`` wake-up lists (python-redis-lock's layout).
    """
    settings = (signal_prefix, signal_expire_ms)
    with _LOCKERS_MUTEX:
        per_client = _LOCKERS.setdefault(client, {})
        locker = per_client.get(settings)
        if locker is None or locker.closed:
            signal_of = None
            if signal_prefix is not None:
                prefix = signal_prefix

                def signal_of(key: str) -> str:
                    # python-redis-lock names the list after the lock's name, without "lock:".
                    return prefix + key.split(":", 1)[1]

            # The backend holds the client weakly, so that this cache does not keep it alive; when
            # the client goes, so does its heartbeat thread.
            backend = PeerRedisBackend(
                weakref.proxy(client), signal_of=signal_of, signal_expire_ms=signal_expire_ms
            )
            locker = per_client[settings] = Locker(backend, max_hold=math.inf)
            weakref.finalize(client, locker.close)
        return locker
