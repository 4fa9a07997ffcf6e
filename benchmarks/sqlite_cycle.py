"""Uncontended acquire+release cycles on SQLite, side by side with the raw sqlite3 floor.

    python -m benchmarks.sqlite_cycle [--dir /tmp] [--seconds 2] [--rounds 5]

Contestants, each on its own database file in ``--dir`` (same WAL and ``synchronous=NORMAL``
settings), interleaved in rounds so that noise hits everyone alike; the figure is the best
round's cycles per second:

- ``raw sqlite3 floor``: what any correct SQLite lock pays: ``BEGIN IMMEDIATE``, read the row,
  write it, ``COMMIT``; then ``BEGIN IMMEDIATE``, token-checked ``DELETE``, ``COMMIT``.
- ``backend acquire/release`` and ``backend fenced``: ``SqliteBackend`` primitives (the fenced
  grant also bumps the per-key fence row in the same transaction).
- ``Locker fenced``: ``locker.acquire(key).release()`` with ``fencing=True``: the whole public
  path (validation, lease clock, heartbeat registration, events).

The file system matters (tmpfs flatters everyone); the script prints where the files live.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import lease_lock
from lease_lock.backends.sqlite import SqliteBackend

__all__: list[str] = []

TOKEN = "b" * 32


def raw_floor(path: Path) -> Callable[[], None]:
    connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA synchronous=NORMAL")
    connection.execute(
        "CREATE TABLE IF NOT EXISTS leases (key TEXT PRIMARY KEY, token TEXT, expires REAL)"
        " WITHOUT ROWID"
    )

    def cycle() -> None:
        now = time.monotonic()
        connection.execute("BEGIN IMMEDIATE")
        connection.execute("SELECT token, expires FROM leases WHERE key = ?", ("k",)).fetchone()
        connection.execute("INSERT OR REPLACE INTO leases VALUES (?, ?, ?)", ("k", TOKEN, now + 30))
        connection.execute("COMMIT")
        connection.execute("BEGIN IMMEDIATE")
        connection.execute("DELETE FROM leases WHERE key = ? AND token = ?", ("k", TOKEN))
        connection.execute("COMMIT")

    return cycle


def backend_cycle(path: Path, fenced: bool) -> Callable[[], None]:
    backend = SqliteBackend(path)
    grant = backend.acquire_fenced if fenced else backend.acquire

    def cycle() -> None:
        grant("k", TOKEN, 30.0, "bench")
        backend.release("k", TOKEN)

    return cycle


def locker_cycle(path: Path) -> Callable[[], None]:
    locker = lease_lock.connect(f"sqlite:///{path}", fencing=True)

    def cycle() -> None:
        locker.acquire("k").release()

    return cycle


def rate(cycle: Callable[[], None], seconds: float) -> float:
    count = 0
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        cycle()
        count += 1
    return count / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=None, help="where the database files go")
    parser.add_argument("--seconds", type=float, default=2.0, help="per contestant per round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="lease-lock-bench-", dir=args.dir))
    contestants = {
        "raw sqlite3 floor": raw_floor(directory / "raw.db"),
        "backend acquire/release": backend_cycle(directory / "backend.db", fenced=False),
        "backend fenced": backend_cycle(directory / "fenced.db", fenced=True),
        "Locker fenced": locker_cycle(directory / "locker.db"),
    }
    best = dict.fromkeys(contestants, 0.0)
    for _ in range(args.rounds):
        for name, cycle in contestants.items():
            best[name] = max(best[name], rate(cycle, args.seconds))
    print(f"SQLite {sqlite3.sqlite_version}, files in {directory} (device {os.stat(directory).st_dev})")
    print(f"best of {args.rounds} rounds x {args.seconds:g}s, acquire+release cycles per second")
    floor = best["raw sqlite3 floor"]
    for name, value in best.items():
        print(f"  {name:<26} {value:>9.0f}/s  {value / floor:5.2f}x floor")


if __name__ == "__main__":
    main()
