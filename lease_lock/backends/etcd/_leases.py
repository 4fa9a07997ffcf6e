"""Spare etcd leases: a lease that no longer holds a key is kept for the next acquisition.

A lock cycle on etcd needs a lease of its own for the key. Granting one and revoking it again
are both replicated writes (each waits for a quorum's disk), while a keep-alive is answered by
the leader alone. So a lease whose key was released, or that a lost race left unused, is not
revoked: it is kept here, and the next acquisition of the same length renews it with one
keep-alive instead of granting a new one. Two replicated writes fewer per cycle, and a refused
attempt costs no revoke.

Why it is safe:

- A lease is kept only at the moment it stops holding a key: the key was deleted or moved to
  another lease by a write whose answer named this lease (a guarded delete or put with
  ``prev_kv``), or the lease was never attached (the lost race). etcd hands each such answer to
  one caller, so one lease is never kept by two processes, and one holds no key while kept.
- An acquisition renews a kept lease *after* its own request time was taken, so the store's
  lease ends no earlier than that time plus the full length: the local lease, judged from the
  request time, never outlives the store's. A kept lease that ran out meanwhile answers the
  keep-alive with no time left and is replaced by a fresh grant.
- A forked child drops the parent's spares (both processes would attach keys to one lease);
  closing the backend revokes them. A process that dies leaves them to run out by themselves,
  as it would any lease.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Callable, Optional

__all__ = ["SPARE_LEASES", "SpareLeases"]

#: The most leases a backend keeps for reuse, all lengths together; beyond it they are revoked.
SPARE_LEASES = 32
#: How many granted leases' lengths are remembered (those of held keys among them); a lease
#: whose length was forgotten is revoked when it comes free, as before there were spares.
_LENGTHS = 4096


class SpareLeases:
    """Unused leases of one backend by their length in seconds; thread-safe.

    The backend tells it the length of every lease it grants (:meth:`granted`), since the
    answer that frees a lease names only its id.
    """

    def __init__(self, limit: int = SPARE_LEASES, clock: Callable[[], float] = time.monotonic) -> None:
        self._limit = limit
        self._clock = clock
        self._mutex = threading.Lock()
        # lease -> its length in seconds, oldest first.
        self._lengths: OrderedDict[str, int] = OrderedDict()
        # length -> (lease, when it was kept), the latest kept last.
        self._spare: dict[int, list[tuple[str, float]]] = {}
        self._count = 0

    def granted(self, lease: str, seconds: int) -> None:
        """``lease`` was just granted for ``seconds``."""
        with self._mutex:
            self._lengths[lease] = seconds
            if len(self._lengths) > _LENGTHS:
                self._lengths.popitem(last=False)

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
                self._lengths.pop(lease, None)
            return None

    def keep(self, lease: str) -> bool:
        """Keep ``lease``, which holds no key, for reuse; ``False`` when its length is unknown
        or the spares are full, and the caller is to revoke it."""
        now = self._clock()
        with self._mutex:
            seconds = self._lengths.get(lease)
            if seconds is None or self._count >= self._limit:
                return False
            self._spare.setdefault(seconds, []).append((lease, now))
            self._count += 1
            return True

    def forget(self, lease: str) -> None:
        """``lease`` was revoked or ran out."""
        with self._mutex:
            self._lengths.pop(lease, None)

    def drain(self) -> list[str]:
        """Every kept lease, emptying the spares (the backend is closing: to revoke them)."""
        with self._mutex:
            leases = [lease for kept in self._spare.values() for lease, _kept_at in kept]
            self._spare = {}
            self._count = 0
            return leases

    def after_fork(self) -> None:
        """In a forked child: forget the parent's spares and lengths, and its mutex, which a
        parent thread may have held at the fork."""
        self._mutex = threading.Lock()
        self._lengths = OrderedDict()
        self._spare = {}
        self._count = 0
