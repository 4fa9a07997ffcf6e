"""One process holding many auto-extended locks: one heartbeat thread, every lease kept alive.

    python -m benchmarks.heartbeat_scale [--sizes 100 1000 10000] [--ttl 1.5] [--seconds 10]

For each size, one ``Locker`` on a ``MemoryBackend`` acquires that many locks with a short
lease (``--ttl``, so the heartbeat extends every ``ttl / 3``) and holds them for ``--seconds``.
Reported per size: threads of the process while holding, resident memory added per lock, CPU
used while holding (share of one core), extensions per second, locks lost (on the Lock and on
the store), and how many ``extend_many`` batches the heartbeat sent (with the mean batch size)
versus single ``extend`` calls.
"""

from __future__ import annotations

import argparse
import gc
import os
import threading
import time
from collections.abc import Sequence

from lease_lock import Lock, Locker, LockEvent, MemoryBackend
from lease_lock.backends.base import ExtendRequest

from benchmarks.measure import add_json_argument, write_json

__all__ = ["main"]


class CountingBackend(MemoryBackend):
    """A memory backend that counts the heartbeat's batched and single extensions."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[int] = []
        self.singles = 0
        self._in_batch = threading.local()

    def extend_many(self, requests: Sequence[ExtendRequest]) -> list[bool]:
        """Count the batch, then extend each lease."""
        self.batches.append(len(requests))
        self._in_batch.active = True
        try:
            return super().extend_many(requests)
        finally:
            self._in_batch.active = False

    def extend(self, key: str, token: str, ttl: float) -> bool:
        """Count a single extension (not one made inside a batch), then extend."""
        if not getattr(self._in_batch, "active", False):
            self.singles += 1
        return super().extend(key, token, ttl)


def rss_bytes() -> int:
    """Resident memory of this process now (Linux ``/proc``)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def os_threads() -> int:
    """Threads of this process as the kernel counts them."""
    return len(os.listdir("/proc/self/task"))


def run(size: int, ttl: float, seconds: float) -> dict[str, float]:
    """Hold ``size`` locks for ``seconds``; returns the measurements of one row."""
    gc.collect()
    backend = CountingBackend()
    extended = 0
    lost = 0
    counter = threading.Lock()

    def on_event(event: LockEvent) -> None:
        nonlocal extended, lost
        if event.type == "extended":
            with counter:
                extended += 1
        elif event.type == "lost":
            with counter:
                lost += 1

    locker = Locker(backend, ttl=ttl, on_event=on_event)
    rss_before = rss_bytes()
    threads_before = os_threads()
    locks: list[Lock] = [locker.acquire(f"bench:{index}") for index in range(size)]
    rss_held = rss_bytes()
    extended_at_start = extended
    cpu_start = time.process_time()
    wall_start = time.monotonic()
    threads_held = os_threads()
    time.sleep(seconds)  # a benchmark, not a test: real time is what is measured
    wall = time.monotonic() - wall_start
    cpu = time.process_time() - cpu_start
    extensions = extended - extended_at_start
    lost_on_lock = sum(1 for lock in locks if lock.state != "held")
    lost_on_store = sum(1 for lock in locks if not backend.is_held(lock.key, lock.token))
    batches = list(backend.batches)
    singles = backend.singles
    for lock in locks:
        lock.release()
    locker.close()
    return {
        "locks": size,
        "threads": threads_held,
        "extra_threads": threads_held - threads_before,
        "rss_per_lock": (rss_held - rss_before) / size,
        "cpu": cpu / wall,
        "ext_per_s": extensions / wall,
        "lost": max(lost, lost_on_lock, lost_on_store),
        "batches": len(batches),
        "mean_batch": sum(batches) / len(batches) if batches else 0.0,
        "singles": singles,
    }


def main(argv: Sequence[str] | None = None) -> None:
    """Run every size and print one table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--ttl", type=float, default=1.5)
    parser.add_argument("--seconds", type=float, default=10.0)
    add_json_argument(parser)
    args = parser.parse_args(argv)
    rows = []
    print(f"MemoryBackend, ttl={args.ttl:g}s (heartbeat every {args.ttl / 3:g}s), held {args.seconds:g}s per row")
    header = (
        f"{'locks':>7} {'threads':>7} {'hb thr':>6} {'RSS/lock':>9} {'CPU':>6} {'ext/s':>9} "
        f"{'lost':>5} {'batches':>8} {'mean batch':>10} {'singles':>7}"
    )
    print(header)
    print("-" * len(header))
    for size in args.sizes:
        row = run(size, args.ttl, args.seconds)
        rows.append(row)
        print(
            f"{row['locks']:>7} {row['threads']:>7} {row['extra_threads']:>6} "
            f"{row['rss_per_lock'] / 1024:>7.2f}KB {row['cpu']:>6.1%} {row['ext_per_s']:>9.0f} "
            f"{row['lost']:>5} {row['batches']:>8} {row['mean_batch']:>10.1f} {row['singles']:>7}"
        )
    print("threads: the process while holding; hb thr: threads the locker added (the heartbeat).")
    write_json(args.json, "heartbeat_scale", argv, {"ttl": args.ttl, "seconds": args.seconds, "rows": rows})


if __name__ == "__main__":
    main()
