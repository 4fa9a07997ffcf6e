"""Two processes contend for one key; the script checks that their holds never overlapped.

Run it with ``python examples/contend.py``. Each worker takes the lock ``demo:report`` three
times, holds it for a moment and reports the hold with its fencing token. The parent then checks
that no two holds overlapped and that fences rose with every grant. The store is a SQLite file in
a temporary directory; pass a URL as the first argument to use another backend, for example
``python examples/contend.py redis://localhost:6379/0``.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import tempfile
import time
from typing import TYPE_CHECKING

import lease_lock

if TYPE_CHECKING:
    from multiprocessing.queues import Queue
    from multiprocessing.synchronize import Barrier


def worker(name: str, url: str, ready: Barrier, holds: Queue[tuple[str, int, float, float]]) -> None:
    """Take the lock three times and report each hold as (name, fence, start, end)."""
    with lease_lock.connect(url, fencing=True, ttl=5) as locker:
        ready.wait()
        for _ in range(3):
            with locker.lock("demo:report", timeout=30) as lock:
                start = time.time()
                print(f"{time.strftime('%H:%M:%S')} {name} holds demo:report with fence {lock.fence}")
                time.sleep(0.2)
                end = time.time()
            holds.put((name, lock.fence or 0, start, end))
            time.sleep(0.05)  # give the other worker a turn


def main() -> None:
    """Run two workers and check their holds."""
    with tempfile.TemporaryDirectory() as directory:
        url = sys.argv[1] if len(sys.argv) > 1 else f"sqlite:///{os.path.join(directory, 'demo.db')}"
        ready = multiprocessing.Barrier(2)
        holds: Queue[tuple[str, int, float, float]] = multiprocessing.Queue()
        workers = [
            multiprocessing.Process(target=worker, args=(name, url, ready, holds)) for name in ("worker-a", "worker-b")
        ]
        for process in workers:
            process.start()
        records = [holds.get(timeout=120) for _ in range(6)]
        for process in workers:
            process.join()
        if any(process.exitcode != 0 for process in workers):
            sys.exit("a worker failed")
    records.sort(key=lambda record: record[2])
    for earlier, later in zip(records, records[1:]):
        if later[2] < earlier[3]:
            sys.exit(f"overlap: {earlier} and {later}")
        if later[1] <= earlier[1]:
            sys.exit(f"fence did not rise: {earlier} then {later}")
    print("6 holds, none overlapping, fences rising with every grant")


if __name__ == "__main__":
    main()
