"""An in-process backend: real leases for threads of one process, and the fastest test double.

Expiry is judged on a monotonic clock (``time.monotonic`` unless one is injected), so a wall
clock step cannot move a lease. The store is private to the backend object: share one
``MemoryBackend`` between several ``Locker`` objects to make them contend.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, ClassVar, Iterator, Optional, Union

from .. import forksafe
from .base import Capabilities, Holder, LockState, ReleaseWatcher, WaitingLine, limit_mismatch, parse_url_options
from .line import AnnouncedLine, Announcements
from .service import ServiceStore, check_amount

__all__ = ["MemoryBackend"]


@dataclass
class _Lease:
    token: str
    expires_at: float
    fence: Optional[int]
    owner: str


@dataclass
class _Places:
    """A counting key: up to ``limit`` leases, each by its token."""

    limit: int
    leases: dict[str, _Lease]
    #: When the first of the leases ends (``inf`` when there are none).
    expires_at: float = 0.0

    def prune(self, now: float) -> None:
        self.leases = {token: lease for token, lease in self.leases.items() if lease.expires_at > now}
        self.expires_at = min((lease.expires_at for lease in self.leases.values()), default=0.0)


class _MemoryWatcher(ReleaseWatcher):
    def __init__(self, backend: MemoryBackend, callback: Callable[[str], None]) -> None:
        self._backend = backend
        self.callback = callback
        self._closed = False

    @property
    def active(self) -> bool:
        return not self._closed

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._backend._drop_watcher(self)


class MemoryBackend(ServiceStore, forksafe.MutexForkGuard):
    """Leases in a dict guarded by one lock; one process only. A counting key (``limit`` > 1)
    keeps its places in one entry of that dict, each under its token.

    ``clear()`` drops every lease but keeps the fence counters, and fences are never below the
    wall clock in microseconds, so they keep rising after ``clear()`` and across processes.
    Release notifications are delivered on the thread that released the key.
    """

    capabilities: ClassVar[Capabilities] = Capabilities(
        server_clock=False,
        fencing=True,
        release_notify=True,
        scan=True,
        batch_extend=True,
        counting=True,
        replica_wait=False,
        min_ttl=0.0,
        clock="this process's monotonic clock",
        wake="releases are announced in this process",
    )

    def __init__(self, *, clock: Optional[Callable[[], float]] = None) -> None:
        self._clock = clock or time.monotonic
        self._mutex = threading.Lock()
        self._leases: dict[str, Union[_Lease, _Places]] = {}
        self._fences: dict[str, int] = {}
        self._watchers: list[_MemoryWatcher] = []
        self._counters: dict[str, tuple[int, int]] = {}
        self._announcements = Announcements(self)
        forksafe.register(self)

    @classmethod
    def from_url(cls, url: str, **options: Any) -> MemoryBackend:
        """``memory://``: a new private store for every call."""
        parse_url_options(url, {}, options, backend="memory")
        return cls()

    def _live(self, key: str, now: float) -> Union[_Lease, _Places, None]:
        lease = self._leases.get(key)
        if lease is not None and lease.expires_at <= now:
            if isinstance(lease, _Places):
                lease.prune(now)
                if lease.leases:
                    return lease
            del self._leases[key]
            return None
        return lease

    def _mine(self, key: str, token: str, now: float) -> Optional[_Lease]:
        """The live lease ``token`` holds on ``key``: the key's own, or its place."""
        lease = self._live(key, now)
        if isinstance(lease, _Places):
            return lease.leases.get(token)
        return lease if lease is not None and lease.token == token else None

    def _grant(
        self, key: str, token: str, ttl: float, owner: str, fenced: bool, replaces: Optional[str] = None
    ) -> Optional[_Lease]:
        with self._mutex:
            now = self._clock()
            lease = self._live(key, now)
            if isinstance(lease, _Places):
                return None  # a counting key's places: held, as for any exclusive grant
            if lease is not None and replaces is not None and lease.token == replaces:
                lease = None  # an adopted claim: the new lease below takes its place
            if lease is not None:
                if lease.token != token:
                    return None
                lease.expires_at = now + ttl
                lease.owner = owner
                if fenced and lease.fence is None:
                    lease.fence = self._next_fence(key)
                return lease
            fence = self._next_fence(key) if fenced else None
            lease = self._leases[key] = _Lease(token, now + ttl, fence, owner)
            return lease

    def _next_fence(self, key: str) -> int:
        # At least the wall clock in microseconds, like the server backends: a new process (a
        # restarted `lease-lock serve --url memory://`, say) must not hand out fences again
        # from 1. Below 2**53 until the year 2255.
        fence = max(self._fences.get(key, 0) + 1, time.time_ns() // 1000)
        self._fences[key] = fence
        return fence

    def acquire(self, key: str, token: str, ttl: float, owner: str) -> bool:
        """Grant or renew ``key`` for ``token``."""
        return self._grant(key, token, ttl, owner, fenced=False) is not None

    def acquire_fenced(self, key: str, token: str, ttl: float, owner: str) -> Optional[int]:
        """Grant or renew ``key`` for ``token`` and return its fence."""
        lease = self._grant(key, token, ttl, owner, fenced=True)
        return None if lease is None else lease.fence

    def adopt(self, key: str, claim_token: str, token: str, ttl: float, owner: str) -> Optional[int]:
        """Replace the claim ``claim_token`` on ``key`` (or a free key) with a new fenced grant."""
        lease = self._grant(key, token, ttl, owner, fenced=True, replaces=claim_token)
        return None if lease is None else lease.fence

    def acquire_counted(self, key: str, token: str, ttl: float, owner: str, limit: int) -> Optional[int]:
        """Grant or renew one of the ``limit`` places of ``key`` for ``token``; its fence."""
        with self._mutex:
            now = self._clock()
            entry = self._live(key, now)
            if entry is None:
                entry = self._leases[key] = _Places(limit, {})
            elif isinstance(entry, _Lease):
                raise limit_mismatch(key, limit, 1)
            elif entry.limit != limit:
                raise limit_mismatch(key, limit, entry.limit)
            lease = entry.leases.get(token)
            if lease is not None:
                lease.expires_at = now + ttl
                lease.owner = owner
            elif len(entry.leases) < limit:
                lease = entry.leases[token] = _Lease(token, now + ttl, self._next_fence(key), owner)
            else:
                return None
            entry.prune(now)
            return lease.fence

    def grant_if_free(self, key: str, token: str, ttl: float, owner: str) -> Union[int, LockState]:
        """Grant a key no lease holds and return its fence, else the key's state; one step."""
        with self._mutex:
            now = self._clock()
            lease = self._live(key, now)
            if lease is not None:
                return self._state(key, lease, now)
            fence = self._next_fence(key)
            self._leases[key] = _Lease(token, now + ttl, fence, owner)
            return fence

    def release(self, key: str, token: str) -> bool:
        """Delete ``key`` if ``token`` holds it."""
        with self._mutex:
            now = self._clock()
            entry = self._live(key, now)
            if isinstance(entry, _Lease):
                if entry.token != token:
                    return False
                del self._leases[key]
            elif entry is None or token not in entry.leases:
                return False
            elif len(entry.leases) > 1:
                del entry.leases[token]
                entry.prune(now)
            else:
                del self._leases[key]
        self._notify(key)
        return True

    def extend(self, key: str, token: str, ttl: float) -> bool:
        """Set ``key``'s lease to ``ttl`` from now if ``token`` holds it."""
        with self._mutex:
            now = self._clock()
            lease = self._mine(key, token, now)
            if lease is None:
                return False
            lease.expires_at = now + ttl
            entry = self._leases[key]
            if isinstance(entry, _Places):
                entry.prune(now)
            return True

    def is_held(self, key: str, token: str) -> bool:
        """``True`` if ``token`` holds a live lease on ``key``."""
        with self._mutex:
            return self._mine(key, token, self._clock()) is not None

    def _state(self, key: str, lease: Union[_Lease, _Places, None], now: float) -> LockState:
        if lease is None:
            return LockState.free(key)
        wall = datetime.now(timezone.utc)
        if isinstance(lease, _Places):
            holders = []
            for place in lease.leases.values():
                left = place.expires_at - now
                holders.append(Holder(place.owner, place.fence, wall + timedelta(seconds=left), left))
            return LockState.counting(key, lease.limit, holders)
        remaining = lease.expires_at - now
        return LockState(
            key=key,
            held=True,
            expires_at=wall + timedelta(seconds=remaining),
            fence=lease.fence,
            owner=lease.owner,
            expires_in=remaining,
        )

    def inspect(self, key: str) -> LockState:
        """The state of ``key``."""
        with self._mutex:
            now = self._clock()
            return self._state(key, self._live(key, now), now)

    def force_release(self, key: str) -> bool:
        """Drop ``key`` whoever holds it."""
        with self._mutex:
            dropped = self._live(key, self._clock()) is not None
            self._leases.pop(key, None)
        if dropped:
            self._notify(key)
        return dropped

    def scan(self, prefix: str) -> Iterator[LockState]:
        """Held keys under ``prefix``, sorted."""
        with self._mutex:
            now = self._clock()
            states = [
                self._state(key, lease, now)
                for key in sorted(self._leases)
                if key.startswith(prefix) and (lease := self._live(key, now)) is not None
            ]
        return iter(states)

    def count_in_window(self, name: str, window: float, amount: int = 1) -> tuple[int, float]:
        """Add ``amount`` to counter ``name`` in the current fixed window of ``window`` seconds."""
        check_amount(amount)
        with self._mutex:
            now = self._clock()
            window_index = int(now // window)
            index, count = self._counters.get(name, (window_index, 0))
            count = count + amount if index == window_index else amount
            self._counters[name] = (window_index, count)
            return count, (window_index + 1) * window - now

    def clear(self) -> None:
        """Drop every lease, keeping the fence counters (as a server that lost its data)."""
        with self._mutex:
            keys = list(self._leases)
            self._leases.clear()
        for key in keys:
            self._notify(key)

    def join_line(
        self, key: str, token: str, ttl: float, owner: str, fenced: bool, clock: Callable[[], float],
        limit: int = 1,
    ) -> Optional[WaitingLine]:
        """A line woken by this backend's release notifications (see
        :class:`~lease_lock.backends.line.AnnouncedLine`)."""
        return AnnouncedLine(self._announcements, self, key, token, ttl, owner, fenced, clock, limit)

    def watch_releases(self, callback: Callable[[str], None]) -> ReleaseWatcher:
        """Call ``callback(key)`` on every release and force release."""
        watcher = _MemoryWatcher(self, callback)
        with self._mutex:
            self._watchers.append(watcher)
        return watcher

    def _drop_watcher(self, watcher: _MemoryWatcher) -> None:
        with self._mutex:
            if watcher in self._watchers:
                self._watchers.remove(watcher)

    def _notify(self, key: str) -> None:
        with self._mutex:
            watchers = list(self._watchers)
        for watcher in watchers:
            watcher.callback(key)
