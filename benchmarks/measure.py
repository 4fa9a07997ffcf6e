"""Paired cycle timing shared by the backend benchmarks.

A contestant is judged against its floor by alternating them one cycle at a time, so every
slow stretch of a shared machine (a WAL flush queued behind another process's, a stolen CPU)
falls on both sides alike, and by comparing the medians of the per-cycle times, which a few
huge outliers (a checkpoint, a GC pass) cannot move. The order inside each pair flips every
cycle so that neither side always runs on a connection that has just been warmed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import platform
import shlex
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

__all__ = [
    "Pairing", "add_json_argument", "grant_cycle", "in_turns", "locker_cycle", "machine", "paired",
    "percentile", "spinning", "write_json",
]

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


def grant_cycle(
    grant: Callable[[str, str, float, str], Any], release: Callable[[str, str], Any], token: str, ttl: float,
) -> Callable[[], None]:
    """One cycle of a backend's bare ``grant`` then ``release`` on a key of its own."""
    key = f"bench:backend:{uuid.uuid4().hex[:8]}"

    def cycle() -> None:
        grant(key, token, ttl, "bench")
        release(key, token)

    return cycle


def locker_cycle(locker: Any) -> Callable[[], None]:
    """One cycle of ``locker.acquire(key).release()`` on a key of its own."""
    key = f"bench:locker:{uuid.uuid4().hex[:8]}"

    def cycle() -> None:
        locker.acquire(key).release()

    return cycle


def in_turns(samplers: dict[str, Generator[float, None, None]], samples: int) -> dict[str, list[float]]:
    """``samples`` values of each sampler (a generator giving one measurement per ``next()``),
    one of each in turn, the order turned by one place every round, so that a slow stretch of
    the machine falls on every row alike and no row always follows the same other; closes the
    samplers, whose ``finally`` releases what they hold."""
    names = list(samplers)
    results: dict[str, list[float]] = {name: [] for name in names}
    try:
        for index in range(samples):
            for turn in range(len(names)):
                name = names[(index + turn) % len(names)]
                results[name].append(next(samplers[name]))
    finally:
        for sampler in samplers.values():
            sampler.close()
    return results


def percentile(values: list[float], fraction: float) -> float:
    """The value below which ``fraction`` of ``values`` lie (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def add_json_argument(parser: argparse.ArgumentParser) -> None:
    """Give a benchmark the ``--json PATH`` option (results for ``benchmarks/plot.py``)."""
    parser.add_argument("--json", metavar="PATH", help="also write the results to PATH as JSON")


def machine() -> dict[str, Any]:
    """What the figures were measured on: enough to tell two machines' results apart."""
    return {
        "host": platform.node(),
        "system": f"{platform.system()} {platform.release()}",
        "cpus": os.cpu_count(),
        "processor": platform.machine(),
        "python": platform.python_version(),
    }


def _spin() -> None:
    os.nice(19)
    while True:
        pass


@contextmanager
def spinning(count: int) -> Iterator[None]:
    """Keep ``count`` processes busy at the lowest priority while the block runs.

    On a virtual machine a CPU with nothing to run is halted, and waking it again for the next
    reply costs far more than a context switch: a loop that waits for one round trip after
    another then measures those wake-ups as much as its own work. A process at nice 19 never
    lets a CPU halt but yields it to any other runnable task, so the same loop on busy CPUs
    shows what it costs where the machine is loaded anyway.
    """
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(count)]
    for spinner in spinners:
        spinner.start()
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.join()


def write_json(path: Optional[str], benchmark: str, argv: Optional[Sequence[str]], results: Any) -> None:
    """Write ``results`` with the command, machine and date that produced them; no-op without a path."""
    if not path:
        return
    arguments = list(sys.argv[1:] if argv is None else argv)
    document = {
        "benchmark": benchmark,
        "command": shlex.join(["python", "-m", f"benchmarks.{benchmark}", *arguments]),
        "machine": machine(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "results": results,
    }
    Path(path).write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
