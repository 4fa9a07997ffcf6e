"""Crowds: many threads of one process on one Redis key, against a few.

    python -m benchmarks.crowd [--threads 8,64] [--seconds 20] [--rounds 4]
        [--redis-url redis://127.0.0.1:6379/0] [--old PATH] [--json PATH]

Each row is one fresh process with one ``Locker`` (default options, a retry timeout longer than
the run) whose threads all loop ``locker.acquire(key)`` / ``lock.release()`` on one fresh key.
The rows take turns ``--rounds`` times, each turn lasting ``--seconds / --rounds``, and add up
their turns, so that a change in the machine's load weighs on every row alike.

With ``--old PATH`` (the root of another checkout of the project, e.g. a ``git worktree`` of an
older commit at a temporary path), every row runs a second time on the ``lease_lock`` found
there, in the same turns: the code before a change and after it, measured in one run.

Columns, per code and thread count: grants per second by all threads together; the process's
CPU time (user and system, every thread of it, the heartbeat's too) per grant; the fewest grants
of one thread over an equal share (total / threads); and, for the rows of more threads, the rate
and the CPU per grant over those of the fewest threads of the same code. ``overlaps`` counts
grants stamped before the previous holder's release began (must be 0: two holders at once).

A row's process runs this file as a script, so that it imports nothing of the checkout under
test but ``lease_lock``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

__all__ = ["Row", "main"]

ROOT = Path(__file__).resolve().parent.parent
TTL = 30.0
#: Seconds a row's process may take to start, connect and finish beyond its turn.
_SLACK = 120.0
#: The label of the code of this checkout, and of the one ``--old`` names.
NEW = "with crowds"
OLD = "without crowds"


def _loop_threads(url: str, threads: int, seconds: float) -> dict[str, Any]:
    """In a row's process: ``threads`` threads of one Locker loop on one fresh key for
    ``seconds``; what each did and the CPU the process spent meanwhile."""
    import lease_lock
    from lease_lock import Locker, Retry
    from lease_lock.backends.redis import RedisBackend

    key = f"bench:crowd:{uuid.uuid4().hex}"
    locker = Locker(RedisBackend.from_url(url), ttl=TTL, retry=Retry(timeout=seconds + _SLACK), owns_backend=True)
    locker.acquire(key).release()  # connect and warm up before the start
    start = threading.Barrier(threads + 1)
    holds: list[list[tuple[float, float]]] = [[] for _ in range(threads)]
    deadline = [0.0]

    def loop(index: int) -> None:
        mine = holds[index]
        now = time.monotonic
        start.wait()
        while True:
            lock = locker.acquire(key)
            granted = now()
            if granted >= deadline[0]:
                lock.release()
                return
            releasing = now()
            lock.release()
            mine.append((granted, releasing))

    workers = [threading.Thread(target=loop, args=(index,), daemon=True) for index in range(threads)]
    for worker in workers:
        worker.start()
    cpu = time.process_time()
    began = time.monotonic()
    deadline[0] = began + seconds
    start.wait()
    for worker in workers:
        worker.join()
    cpu = time.process_time() - cpu
    locker.close()
    return {"holds": holds, "cpu": cpu, "seconds": seconds, "module": lease_lock.__file__}


def _run_row(root: Path, url: str, threads: int, seconds: float) -> dict[str, Any]:
    """One row's process on the ``lease_lock`` of checkout ``root``; its results."""
    completed = subprocess.run(
        [sys.executable, __file__, "--row", url, str(threads), str(seconds)],
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=seconds + _SLACK,
        check=False,
    )
    if completed.returncode:
        raise RuntimeError(f"the row of {threads} threads on {root} failed:\n{completed.stderr}")
    result: dict[str, Any] = json.loads(completed.stdout)
    # The checkout under test, not whatever the interpreter would find first.
    if not Path(result["module"]).resolve().is_relative_to(root.resolve()):
        raise RuntimeError(f"the row imported lease_lock from {result['module']}, not from {root}")
    return result


@dataclass
class Row:
    """What one code's threads did together, over every turn."""

    code: str
    threads: int
    seconds: float = 0.0
    cpu: float = 0.0
    overlaps: int = 0
    counts: Optional[list[int]] = None

    def add(self, result: dict[str, Any]) -> None:
        """Add one turn's result."""
        holds: list[list[tuple[float, float]]] = result["holds"]
        counts = [len(spans) for spans in holds]
        self.counts = counts if self.counts is None else [mine + more for mine, more in zip(self.counts, counts)]
        self.seconds += result["seconds"]
        self.cpu += result["cpu"]
        spans = sorted(span for spans in holds for span in spans)
        self.overlaps += sum(granted < released for (_, released), (granted, _) in zip(spans, spans[1:]))

    @property
    def grants(self) -> int:
        """Grants by all threads together."""
        return sum(self.counts or ())

    @property
    def rate(self) -> float:
        """Grants per second by all threads together."""
        return self.grants / self.seconds if self.seconds else 0.0

    @property
    def cpu_per_grant(self) -> Optional[float]:
        """Seconds of the process's CPU time per grant."""
        return self.cpu / self.grants if self.grants else None

    @property
    def min_share(self) -> float:
        """The fewest grants of one thread as a fraction of an equal share."""
        counts = self.counts or [0]
        share = sum(counts) / len(counts)
        return min(counts) / share if share else 0.0


def _as_json(row: Row, base: Row) -> dict[str, Any]:
    cpu, base_cpu = row.cpu_per_grant, base.cpu_per_grant
    return {
        "code": row.code, "threads": row.threads, "seconds": row.seconds, "grants": row.grants, "rate": row.rate,
        "cpu_per_grant_us": None if cpu is None else cpu * 1e6,
        "min": min(row.counts or [0]), "max": max(row.counts or [0]), "min_share": row.min_share,
        "overlaps": row.overlaps,
        "vs_fewest_rate": row.rate / base.rate if base.rate else None,
        "vs_fewest_cpu": cpu / base_cpu if cpu is not None and base_cpu else None,
        "vs_threads": base.threads,
    }


def _print(rows: list[dict[str, Any]]) -> None:
    print(f"{'code':<16} {'threads':>7} {'grants/s':>9} {'CPU us/grant':>12} {'min/share':>9} "
          f"{'rate vs':>8} {'CPU vs':>7} {'overlaps':>8}")
    for row in rows:
        versus = row["threads"] != row["vs_threads"]
        rate = f"{row['vs_fewest_rate']:.2f}x" if versus else "-"
        cpu = f"{row['vs_fewest_cpu']:.2f}x" if versus else "-"
        print(
            f"{row['code']:<16} {row['threads']:>7} {row['rate']:>9,.0f} {row['cpu_per_grant_us'] or 0:>12,.0f} "
            f"{row['min_share']:>9.2f} {rate:>8} {cpu:>7} {row['overlaps']:>8}"
        )


def main(argv: Optional[list[str]] = None) -> None:
    """Run every row, in turns, and print (and with ``--json`` write) the table."""
    from benchmarks.measure import add_json_argument, machine, write_json

    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", 1)[0])
    parser.add_argument("--threads", default="8,64", help="thread counts, the fewest first")
    parser.add_argument("--seconds", type=float, default=20.0, help="per row, all turns together")
    parser.add_argument("--rounds", type=int, default=4, help="turns the rows take, each for seconds/rounds")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--old", type=Path, help="root of a checkout whose lease_lock runs as the code before")
    add_json_argument(parser)
    args = parser.parse_args(argv)
    counts = [int(word) for word in args.threads.split(",") if word.strip()]
    if not counts or min(counts) < 1 or args.rounds < 1:
        parser.error("--threads needs positive counts and --rounds at least 1")
    codes = [(NEW, ROOT)] + ([(OLD, args.old)] if args.old is not None else [])
    info = machine()
    print(f"{info['cpus']} CPUs, {info['system']}, Python {info['python']}; threads {counts}, "
          f"{args.seconds:g} s per row in {args.rounds} turns")
    rows = {(code, threads): Row(code, threads) for code, _root in codes for threads in counts}
    turn = args.seconds / args.rounds
    for _ in range(args.rounds):
        for threads in counts:
            for code, root in codes:
                rows[code, threads].add(_run_row(root, args.redis_url, threads, turn))
    output = [_as_json(rows[code, threads], rows[code, counts[0]]) for code, _root in codes for threads in counts]
    _print(output)
    write_json(args.json, "crowd", argv, {"rows": output})


def _row(argv: list[str]) -> None:
    url, threads, seconds = argv
    print(json.dumps(_loop_threads(url, int(threads), float(seconds))))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--row"]:
        _row(sys.argv[2:])
    else:
        main()
