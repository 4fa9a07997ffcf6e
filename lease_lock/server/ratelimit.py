"""Per-project request budgets in fixed windows, taken from the store in slices.

Every authenticated request of a project counts, whatever its outcome. The count lives in the
store's shared counters (:class:`~lease_lock.backends.service.ServiceStore`), so every server
process sharing the store enforces one budget.

Asking the store on every request would cost a round trip per request, so a process takes its
budget in *slices*: it adds ``slice`` to the shared counter at once and spends the requests it
got locally until the slice or the window runs out. Only requests the store granted are ever
spent, so all processes together never exceed the limit. The cost is the other direction: a
slice a process took but has not spent is lost to the others, so with ``P`` processes a budget
can be refused up to ``(P - 1) * (slice - 1)`` requests early in a window (a process that
stops loses its unspent rest as well). The slice is ``limit // 64`` (at least 1, at most 64):
exact counting below 128 requests per window, and at most 1/64 of the budget per process.
"""

from __future__ import annotations

import functools
import math
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional

from ..backends.service import ServiceStore

__all__ = ["Budget", "RateLimiter", "slice_of"]

_MAX_SLICE = 64


@dataclass(frozen=True)
class Budget:
    """The answer for one request: allowed or not, and whole seconds left in the window."""

    allowed: bool
    retry_after: int


def slice_of(limit: int) -> int:
    """How many requests of a ``limit``-per-window budget a process takes from the store at once."""
    return max(1, min(_MAX_SLICE, limit // _MAX_SLICE))


class _Share:
    """This process's unspent part of one budget, valid until ``ends`` (monotonic seconds).

    ``spent_out`` records that the store's budget itself ran out in this window, so later
    requests are refused here without asking the store again (its count only grows).
    """

    __slots__ = ("ends", "left", "spent_out")

    def __init__(self, ends: float) -> None:
        self.ends = ends
        self.left = 0
        self.spent_out = False


class RateLimiter:
    """``limit`` requests per project in each fixed window of ``window`` seconds.

    Driver errors of the shared counter propagate (the server answers 503: fail closed).
    ``clock`` is a monotonic clock; it only times how long a slice stays usable, while the
    windows themselves are the store's.
    """

    def __init__(
        self,
        store: ServiceStore,
        *,
        limit: int = 600,
        window: float = 60.0,
        namespace: str = "lease-lock-rate/",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self.window = window
        self.slice = slice_of(limit)
        self._store = store
        self._namespace = namespace
        self._clock = clock
        self._mutex = threading.Lock()
        self._shares: dict[str, _Share] = {}

    def hit(self, project: str) -> Budget:
        """Count one request of ``project`` and say whether it is within the budget."""
        budget = self._spend(project)
        if budget is not None:
            return budget
        count, left = self._store.count_in_window(self._namespace + project, self.window, self.slice)
        # The store counted ``self.slice`` requests ending at ``count``; those at or below the
        # limit are ours to spend.
        granted = max(0, min(self.slice, self.limit - (count - self.slice)))
        ends = self._clock() + left
        with self._mutex:
            share = self._shares.get(project)
            if share is None or share.ends < ends - 0.5 * self.window:
                # No share yet, or one of an earlier window: start this window's. Otherwise
                # another thread took a slice of the same window meanwhile; both add up.
                share = self._shares[project] = _Share(ends)
            share.left += granted
            share.spent_out = share.spent_out or granted < self.slice
            allowed = share.left > 0
            if allowed:
                share.left -= 1
        return self._budget(allowed, left)

    def _spend(self, project: str) -> Optional[Budget]:
        """Spend one request of this process's share; ``None`` when it must ask the store."""
        with self._mutex:
            share = self._shares.get(project)
            if share is None:
                return None
            left = share.ends - self._clock()
            if left <= 0:
                del self._shares[project]
                return None
            if share.left > 0:
                share.left -= 1
                return self._budget(True, left)
            if share.spent_out:
                return self._budget(False, left)
        return None

    @staticmethod
    def _budget(allowed: bool, left: float) -> Budget:
        # ``Retry-After`` is whole seconds; rounding up never invites a client back too early.
        return _budget_of(allowed, max(1, math.ceil(left)))


@functools.lru_cache(maxsize=256)
def _budget_of(allowed: bool, retry_after: int) -> Budget:
    """``Budget(allowed, retry_after)``, shared: every request gets one and none can change, and
    the requests of a second all get the same few."""
    return Budget(allowed, retry_after)
