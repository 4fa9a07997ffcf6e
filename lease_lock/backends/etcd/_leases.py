"""Spare etcd leases: a lease that lost a race is kept for the next attempt of its length.

An acquisition on etcd brings a lease of its own for the key. Granting one and revoking it are
both replicated writes (each waits for a quorum's disk), while a keep-alive is answered by the
leader alone. An attempt that finds the key held attached its lease to nothing, so instead of
revoking it, the backend keeps it here, and its next attempt of the same length (a waiter's
retry, or the take after a release woke it) renews it with one keep-alive instead of granting
a new one: a refused attempt costs one transaction and one keep-alive instead of two more
replicated writes, and a hand-off one commit fewer.

Only a lease that *never* held a key is kept, and never one that may have: a write on it whose
answer was lost may have put a key on it, which the next lock's keep-alives would then keep
held (such a lease is revoked, or left to run out). A lease whose key was released, or moved to
another lease by a re-acquire, is revoked as before: the heartbeat reads a key's lease with a
serializable read, which a lagging member may answer from before the release, and only a dead
lease makes such a stale read fail instead of extending a lease that no longer holds the key.

- An acquisition renews a kept lease *after* its own request time was taken, so the store's
  lease ends no earlier than that time plus the full length: the local lease, judged from the
  request time, never outlives the store's. A kept lease that ran out meanwhile answers the
  keep-alive with no time left and is replaced by a fresh grant.
- A forked child drops the parent's spares (both processes would attach keys to one lease);
  closing the backend revokes them. A process that dies leaves them to run out by themselves.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Optional

__all__ = ["SPARE_LEASES", "SpareLeases"]

#: The most leases a backend keeps for reuse, all lengths together; beyond it they are revoked.
SPARE_LEASES = 32


class SpareLeases:
    """Leases that never held a key, by their length in seconds; thread-safe."""

    def __init__(self, limit: int = SPARE_LEASES, clock: Callable[[], float] = time.monotonic) -> None:
        self._limit = limit
        self._clock = clock
        self._mutex = threading.Lock()
        # length -> (lease, when it was kept), the latest kept last.
        self._spare: dict[int, list[tuple[str, float]]] = {}
        self._count = 0

    def take(self, seconds: int) -> Optional[str]:
        """A kept lease of ``seconds`` that may still be alive, removed from the spares, or
        ``None``. One kept for a whole length already has run out (its last renewal came
        before it was kept), unless a leader change restarted it: it is left to run out."""
        now = self._clock()
        with self._mutex:
            spare = self._spare.get(seconds)
            while spare:
                lease, kept_at = spare.pop()
                self._count -= 1
                if now - kept_at < seconds:
                    return lease
            return None

    def keep(self, seconds: int, lease: str) -> bool:
        """Keep ``lease`` of ``seconds``, which never held a key, for reuse; ``False`` when the
        spares are full and the caller is to revoke it."""
        now = self._clock()
        with self._mutex:
            if self._count >= self._limit:
                return False
            self._spare.setdefault(seconds, []).append((lease, now))
            self._count += 1
            return True

    def drain(self) -> list[str]:
        """Every kept lease, emptying the spares (the backend is closing: to revoke them)."""
        with self._mutex:
            leases = [lease for kept in self._spare.values() for lease, _kept_at in kept]
            self._spare = {}
            self._count = 0
            return leases

    def after_fork(self) -> None:
        """In a forked child: forget the parent's spares and its mutex, which a parent thread
        may have held at the fork."""
        self._mutex = threading.Lock()
        self._spare = {}
        self._count = 0
