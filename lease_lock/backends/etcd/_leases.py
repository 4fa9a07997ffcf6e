"""Spare etcd leases: a lease a lock is done with is kept for the next attempt of its length.

An acquisition on etcd puts the key on a lease of its own. Granting one and revoking it are
both replicated writes (each waits for a quorum's disk), while a keep-alive is answered by the
leader alone. So the backend keeps the leases its locks are done with, and its next attempt of
the same length renews one with a keep-alive instead of granting a new one: an uncontended cycle
is a keep-alive, the grant transaction and the release's guarded delete (two writes, where a
grant, the transaction and a revoke were three), and a refused attempt costs one transaction and
one keep-alive instead of two more replicated writes.

Two kinds of lease are kept: one an attempt brought and found the key held (it never held a
key), and one a release took its key off with a guarded delete whose answer named that very
lease (only a lease of the backend's own length, not one a waiter brought). Any other way a key
leaves its lease revokes the lease: an expiry ends it anyway; a force release, an adopt, a
hand-over, a re-acquire and a move to another length revoke the lease the key was on in their own
write (its ``prev_kv``), never one read before it; and a release whose answer was lost keeps
nothing, since the key may still be on it. So a lease is shared by two keys never at once, and
a kept lease is one whose holder released its key itself: no process extends that key any more
(an extend that raced the release may still renew it, harmlessly), and a stale read of it finds
the holder's own token, whose lock is over. The heartbeat's serializable reads of other keys
cannot name the lease either: a key is only ever put on a lease of the backend that holds it.

- An acquisition renews a kept lease *after* its own request time was taken, so the store's
  lease ends no earlier than that time plus the full length: the local lease, judged from the
  request time, never outlives the store's. A kept lease that ran out meanwhile answers the
  keep-alive with no time left and is replaced by a fresh grant; one kept a whole length since
  its last renewal is not even tried.
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
    """Leases that hold no key, by their length in seconds; thread-safe."""

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
        """Keep ``lease`` of ``seconds``, which holds no key (see the module's notes), for
        reuse; ``False`` when the spares are full and the caller is to revoke it."""
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
