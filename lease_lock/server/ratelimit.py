"""Per-project request budgets in fixed windows.

Every authenticated request of a project counts, whatever its outcome. The count lives in the
store's shared counters (:class:`~lease_lock.backends.service.ServiceStore`), so every server
process sharing the store enforces one budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..backends.service import ServiceStore

__all__ = ["Budget", "RateLimiter"]


@dataclass(frozen=True)
class Budget:
    """The answer for one request: allowed or not, and whole seconds left in the window."""

    allowed: bool
    retry_after: int


class RateLimiter:
    """``limit`` requests per project in each fixed window of ``window`` seconds.

    Driver errors of the shared counter propagate (the server answers 503: fail closed).
    """

    def __init__(
        self,
        store: ServiceStore,
        *,
        limit: int = 600,
        window: float = 60.0,
        namespace: str = "lease-lock-rate/",
    ) -> None:
        self.limit = limit
        self.window = window
        self._store = store
        self._namespace = namespace

    def hit(self, project: str) -> Budget:
        """Count one request of ``project`` and say whether it is within the budget."""
        count, left = self._store.count_in_window(self._namespace + project, self.window)
        # ``Retry-After`` is whole seconds; rounding up never invites a client back too early.
        return Budget(count <= self.limit, max(1, math.ceil(left)))
