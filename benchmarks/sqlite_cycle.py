"""Uncontended acquire+release cycles on SQLite, side by side with the raw sqlite3 floor.

    python -m benchmarks.sqlite_cycle [--dir /tmp] [--seconds 4] [--json PATH]

Contestants, each on its own database file in ``--dir`` (same WAL and ``synchronous=NORMAL``
settings); each alternates with the floor one cycle at a time and is judged on the median
cycle time (see ``measure.py``):

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
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Optional

import lease_lock
from lease_lock.backends.sqlite import SqliteBackend

from benchmarks.measure import add_json_argument, paired, write_json

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


def main(argv: Optional[list[str]] = None) -> None:
    """Measure every contestant against the floor and print the table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--dir", default=None, help="where the database files go")
    parser.add_argument("--seconds", type=float, default=4.0, help="per contestant")
    add_json_argument(parser)
    args = parser.parse_args(argv)
    directory = Path(tempfile.mkdtemp(prefix="lease-lock-bench-", dir=args.dir))
    floor = raw_floor(directory / "raw.db")
    contestants = {
        "backend acquire/release": backend_cycle(directory / "backend.db", fenced=False),
        "backend fenced": backend_cycle(directory / "fenced.db", fenced=True),
        "Locker fenced": locker_cycle(directory / "locker.db"),
    }
    print(f"SQLite {sqlite3.sqlite_version}, files in {directory} (device {os.stat(directory).st_dev})")
    print(f"each contestant alternates with the raw sqlite3 floor one cycle at a time for {args.seconds:g} s;")
    print("rates at the median cycle time of each side")
    print(f"  {'contestant':<26} {'cycles/s':>9} {'floor/s':>9} {'vs floor':>9}")
    cycles = []
    try:
        for name, cycle in contestants.items():
            pairing = paired(floor, cycle, args.seconds)
            print(f"  {name:<26} {pairing.rate:>9,.0f} {pairing.floor_rate:>9,.0f} {pairing.ratio:>8.2f}x")
            row = {"name": name, "rate": pairing.rate, "floor_rate": pairing.floor_rate, "ratio": pairing.ratio}
            cycles.append(row)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    floor_name = "raw sqlite3 (BEGIN IMMEDIATE, read, write, COMMIT; checked DELETE)"
    results = {"sqlite": sqlite3.sqlite_version, "floor": floor_name, "cycles": cycles}
    write_json(args.json, "sqlite_cycle", argv, results)


if __name__ == "__main__":
    main()
