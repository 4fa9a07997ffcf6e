"""Paired cycle timing shared by the backend benchmarks.

A contestant is judged against its floor by alternating them one cycle at a time, so every
slow stretch of a shared machine (a WAL flush queued behind another process's, a stolen CPU)
falls on both sides alike, and by comparing the medians of the per-cycle times, which a few
huge outliers (a checkpoint, a GC pass) cannot move. The order inside each pair flips every
cycle so that neither side always runs on a connection that has just been warmed.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Pairing", "paired", "percentile"]

_WARM_UP_CYCLES = 100


@dataclass(frozen=True)
class Pairing:
    """Median seconds per cycle of a contestant and of the floor it ran alternately with."""

    contestant: float
    floor: float
    cycles: int

    @property
    def rate(self) -> float:
        """The contestant's cycles per second at its median cycle time."""
        return 1.0 / self.contestant

    @property
    def floor_rate(self) -> float:
        """The floor's cycles per second at its median cycle time."""
        return 1.0 / self.floor

    @property
    def ratio(self) -> float:
        """Contestant speed as a fraction of the floor's (1.0 = as fast as the floor)."""
        return self.floor / self.contestant


def paired(floor: Callable[[], None], contestant: Callable[[], None], seconds: float) -> Pairing:
    """Run ``floor`` and ``contestant`` alternately for ``seconds`` and compare their medians."""
    for _ in range(_WARM_UP_CYCLES):
        floor()
        contestant()
    clock = time.perf_counter
    floor_times: list[float] = []
    contestant_times: list[float] = []
    deadline = clock() + seconds
    while clock() < deadline:
        for first, second, first_times, second_times in (
            (floor, contestant, floor_times, contestant_times),
            (contestant, floor, contestant_times, floor_times),
        ):
            started = clock()
            first()
            middle = clock()
            second()
            first_times.append(middle - started)
            second_times.append(clock() - middle)
    return Pairing(
        contestant=statistics.median(contestant_times),
        floor=statistics.median(floor_times),
        cycles=len(contestant_times),
    )


def percentile(values: list[float], fraction: float) -> float:
    """The value below which ``fraction`` of ``values`` lie (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]
