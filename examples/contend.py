"""Two processes contend for one key; the output shows they never hold it at the same time.

Run it with ``python examples/contend.py``. Each worker takes the lock ``demo:report`` three
times, holds it for a moment, and prints what it did with the fencing token it was given.
The store is a SQLite file in a temporary directory (pass a URL as the first argument to use
another backend, e.g. ``redis://localhost:6379/0``).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import tempfile
import time

import lease_lock


def worker(name: str, url: str, ready: "multiprocessing.synchronize.Barrier") -> None:
    locker = lease_lock.connect(url, fencing=True, ttl=5)
    ready.wait()
    for round_number in range(3):
        with locker.lock("demo:report", timeout=30) as lock:
            print(f"{time.strftime('%H:%M:%S')} {name} holds demo:report (fence {lock.fence}, round {round_number + 1})")
            time.sleep(0.2)
            print(f"{time.strftime('%H:%M:%S')} {name} releases demo:report")
    locker.close()


def main() -> None:
    with tempfile.TemporaryDirectory() as directory:
        url = sys.argv[1] if len(sys.argv) > 1 else f"sqlite:///{os.path.join(directory, 'demo.db')}"
        ready = multiprocessing.Barrier(2)
        workers = [multiprocessing.Process(target=worker, args=(name, url, ready)) for name in ("worker-a", "worker-b")]
        for process in workers:
            process.start()
        for process in workers:
            process.join()
        failed = [process.exitcode for process in workers if process.exitcode != 0]
        if failed:
            sys.exit(f"a worker failed with exit status {failed}")
        print("both workers finished; each hold above was exclusive and fences only rose")


if __name__ == "__main__":
    main()
