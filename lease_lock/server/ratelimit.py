"""Per-project request budgets in fixed windows.

Every authenticated request of a project counts, whatever its outcome. When the store keeps
shared counters (``capabilities.counters``: memory, SQLite, Redis, PostgreSQL) the count lives
in the store, so every server process sharing it enforces one budget; otherwise each process
keeps its own count and a project can spend the budget once per process.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Callable

from ..backends.base import Backend

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
        backend: Backend,
        *,
        limit: int = 600,
        window: float = 60.0,
        namespace: str = "lease-lock-rate/",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.limit = limit
        self.window = window
        self.shared = backend.capabilities.counters
        self._backend = backend
        self._namespace = namespace
        self._clock = clock
        self._mutex = threading.Lock()
        self._local: dict[str, tuple[int, int]] = {}

    def hit(self, project: str) -> Budget:
        """Count one request of ``project`` and say whether it is within the budget."""
        if self.shared:
            count, left = self._backend.count_in_window(self._namespace + project, self.window)
        else:
            count, left = self._count_locally(project)
        # ``Retry-After`` is whole seconds; rounding up never invites a client back too early.
        return Budget(count <= self.limit, max(1, math.ceil(left)))

    def _count_locally(self, project: str) -> tuple[int, float]:
        with self._mutex:
            now = self._clock()
            index = int(now // self.window)
            seen, count = self._local.get(project, (index, 0))
            count = count + 1 if seen == index else 1
            self._local[project] = (index, count)
            return count, (index + 1) * self.window - now
