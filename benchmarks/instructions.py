"""The core's own instructions per lock cycle, counted by valgrind rather than timed.

    python -m benchmarks.instructions [--cycles 2000] [--valgrind valgrind] [--json PATH]

Wall time on a shared machine swings by tens of percent between runs; the number of machine
instructions a cycle executes barely moves. Each row runs a fresh ``python`` under
``valgrind --tool=callgrind`` that does ``N`` cycles to warm up, then ``N`` cycles, then ``3N``
cycles, on one key of a ``MemoryBackend``; callgrind dumps its count at the start of each
counted stretch (the stretches are marked by a call of ``os.getpgrp()``, which nothing else in
the process makes). The difference of the two stretches is ``2N`` cycles with the cost of the
loop and the markers cancelled out:

- *bare*: the memory backend's ``acquire`` and ``release`` called directly with one token (the
  calls a default ``Locker`` makes for a lock, nothing else);
- *Locker*: ``with locker.lock(key): pass`` on a default ``Locker``;
- *core*: Locker minus bare, what the library adds around the backend's calls:
  ``((Locker(3N) - Locker(N)) - (bare(3N) - bare(N))) / 2N``;
- *the rules alone*: ``with floor.lock(key): pass`` on the lock of ``benchmarks.floor_lock``,
  which does only the steps no correct lock can skip, and its share beyond bare: the floor
  under the core's count;
- *single locks* and *acquire_many*: ten keys held one after the other with ``with
  locker.lock(key)``, and held together with ``with locker.acquire_many(keys)`` (which also
  renews the first nine leases once the tenth is granted, in one ``extend_many``).

The counts include the heartbeat thread's share, as a real program pays it. Hash randomisation
is fixed (``PYTHONHASHSEED=0``) and ``site`` is not imported, so every run builds the same
interpreter state.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from lease_lock import Locker, MemoryBackend

from .floor_lock import floor_cycle
from .measure import add_json_argument, write_json
from .overhead import bare, locker_with

__all__ = ["Counts", "count", "count_rows", "main"]

ROOT = Path(__file__).resolve().parent.parent
#: The cycles of each row, as built by benchmarks.overhead.
ROWS: dict[str, Callable[[], Callable[[], None]]] = {
    "bare": lambda: bare(MemoryBackend()),
    "locker": lambda: locker_with(Locker(MemoryBackend())),
    "floor": lambda: floor_cycle(MemoryBackend()),
    "single": lambda: single_locks(Locker(MemoryBackend())),
    "many": lambda: many_at_once(Locker(MemoryBackend())),
}
#: How many keys the set rows hold.
SET_SIZE = 10
_SET_KEYS = [f"bench-{index}" for index in range(SET_SIZE)]


def single_locks(locker: Locker) -> Callable[[], None]:
    """``with locker.lock(key)`` on each of :data:`SET_SIZE` keys, one after the other."""

    def cycle() -> None:
        for key in _SET_KEYS:
            with locker.lock(key):
                pass

    return cycle


def many_at_once(locker: Locker) -> Callable[[], None]:
    """``with locker.acquire_many(keys)`` on :data:`SET_SIZE` keys."""

    def cycle() -> None:
        with locker.acquire_many(_SET_KEYS):
            pass

    return cycle
_TOTAL = re.compile(r"^(?:summary|totals):\s+(\d+)", re.MULTILINE)
#: A C function the process calls only to mark where a counted stretch starts.
_MARKER = "getpgrp"
# This module, as the runner of its own rows.
_RUNNER = "benchmarks.instructions"


class Counts(dict[str, dict[int, int]]):
    """Instructions counted for each row (``"bare"``, ``"locker"``) and cycle count."""

    def per_cycle(self, row: str, cycles: int) -> float:
        """A row's instructions per cycle between ``cycles`` and ``3 * cycles`` cycles."""
        return (self[row][3 * cycles] - self[row][cycles]) / (2 * cycles)

    def core(self, cycles: int, row: str = "locker") -> float:
        """A row's instructions per cycle beyond the bare backend calls (the Locker's: the core)."""
        return self.per_cycle(row, cycles) - self.per_cycle("bare", cycles)


def run_cycles(row: str, cycles: int) -> None:
    """Build one row's cycle and run it ``cycles`` times to warm up, then ``cycles`` and
    ``3 * cycles`` times after a marker each, and mark the end (the process valgrind counts)."""
    cycle = ROWS[row]()
    for stretch in (cycles, cycles, 3 * cycles):
        for _ in range(stretch):
            cycle()
        os.getpgrp()


def count(
    row: str, cycles: int, valgrind: str = "valgrind", runner: str = _RUNNER, *extra: str
) -> dict[int, int]:
    """The instructions of ``cycles`` and of ``3 * cycles`` cycles of ``row`` in one fresh
    interpreter under callgrind, by cycle count.

    ``runner`` is the module whose ``--run ROW --cycles N`` (with ``extra`` arguments) runs the
    cycles as :func:`run_cycles` does; a runner other than this module's own gets ``site``, for
    the drivers it imports.
    """
    with tempfile.TemporaryDirectory(prefix="lease-lock-callgrind-") as directory:
        out = Path(directory) / "callgrind.out"
        command = [
            valgrind, "--tool=callgrind", "--quiet", f"--callgrind-out-file={out}",
            f"--dump-before={_MARKER}",
            sys.executable, *(["-S"] if runner == _RUNNER else []), "-m", runner, "--run", row,
            "--cycles", str(cycles), *extra,
        ]
        environment = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(ROOT)}
        completed = subprocess.run(
            command, cwd=ROOT, env=environment, capture_output=True, text=True, check=False
        )
        if completed.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{completed.stderr}")
        # Part 1 ends at the first marker (start-up and warm-up), part 2 holds N cycles, part 3
        # 3N cycles; the unnumbered file is the rest, up to the exit.
        parts = sorted(Path(directory).glob("callgrind.out.*"), key=lambda path: int(path.suffix[1:]))
        if len(parts) != 3:
            raise RuntimeError(f"expected 3 dumps at {_MARKER}(), found {len(parts)}: something else called it")
        totals = []
        for part in parts[1:]:
            match = _TOTAL.search(part.read_text(encoding="utf-8"))
            if match is None:
                raise RuntimeError(f"no instruction total in {part}")
            totals.append(int(match.group(1)))
        return {cycles: totals[0], 3 * cycles: totals[1]}


def count_rows(
    rows: Sequence[str], cycles: int, valgrind: str = "valgrind", runner: str = _RUNNER, *extra: str
) -> Counts:
    """:func:`count` for each of ``rows``, each in its own interpreter, several at once: a
    count does not depend on what else the machine runs, and callgrind is slow."""
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        futures = {row: pool.submit(count, row, cycles, valgrind, runner, *extra) for row in rows}
        return Counts({row: future.result() for row, future in futures.items()})


def measure(cycles: int, valgrind: str = "valgrind") -> Counts:
    """Count every row at ``cycles`` and ``3 * cycles`` cycles."""
    return count_rows(list(ROWS), cycles, valgrind)


def main(argv: Sequence[str] | None = None) -> None:
    """Count the rows and print instructions per cycle."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=2000, help="N: rows run N and 3N cycles")
    parser.add_argument("--valgrind", default="valgrind", help="the valgrind executable")
    parser.add_argument("--run", choices=sorted(ROWS), help=argparse.SUPPRESS)
    add_json_argument(parser)
    args = parser.parse_args(argv)
    if args.cycles < 1:
        parser.error("--cycles must be at least 1")
    if args.run is not None:
        run_cycles(args.run, args.cycles)
        return
    if shutil.which(args.valgrind) is None:
        parser.error(f"{args.valgrind} not found: install valgrind (apt-get install valgrind)")
    counts = measure(args.cycles, args.valgrind)
    n = args.cycles
    print(f"MemoryBackend, valgrind callgrind, {n} and {3 * n} cycles, instructions per cycle")
    header = f"{'cycle':<44} {'instructions':>12}"
    print(header)
    print("-" * len(header))
    single, many = counts.per_cycle("single", n), counts.per_cycle("many", n)
    rows = [
        ("bare backend acquire + release", counts.per_cycle("bare", n)),
        ("with locker.lock(key): pass", counts.per_cycle("locker", n)),
        ("core (Locker minus bare)", counts.core(n)),
        ("the lease rules alone (floor lock)", counts.per_cycle("floor", n)),
        ("their share (floor lock minus bare)", counts.core(n, "floor")),
        (f"{SET_SIZE} single locks, one after the other", single),
        (f"acquire_many of {SET_SIZE} keys", many),
    ]
    for name, instructions in rows:
        print(f"{name:<44} {instructions:>12,.0f}")
    print(f"{'acquire_many / single locks':<44} {many / single:>12.2f}")
    rows_json = [{"name": name, "instructions": instructions} for name, instructions in rows]
    write_json(args.json, "instructions", argv, {"cycles": n, "rows": rows_json})


if __name__ == "__main__":
    main()
