"""The command's exit status for store errors: 69 only for ``BackendUnavailableError``.

Before, every exception that was not lease_lock's own was reported as "backend unavailable"
(69), so a cron wrapper retried setup mistakes and bugs for ever.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from .test_cli import Cli, one_line_error


def test_a_database_locked_past_the_busy_timeout_exits_69(tmp_path: Path) -> None:
    db = tmp_path / "locks.db"
    cli = Cli(f"sqlite:///{db}?busy_timeout=0.2", tmp_path)
    assert cli.run("status", "k").returncode == 0  # creates the file and its tables
    writer = sqlite3.connect(db, isolation_level=None)
    writer.execute("BEGIN EXCLUSIVE")
    try:
        result = cli.run("run", "k", "--", "true")
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    assert result.returncode == 69, result.stderr
    line = one_line_error(result.stderr)
    assert line.startswith("lease-lock: backend unavailable: sqlite database unavailable")
    assert "locked" in line


def test_a_file_that_is_not_a_database_is_not_an_outage(tmp_path: Path) -> None:
    db = tmp_path / "locks.db"
    db.write_bytes(b"not an SQLite database, only text long enough to fill a header" * 10)
    cli = Cli(f"sqlite:///{db}", tmp_path)
    result = cli.run("status", "k")
    assert result.returncode == 1, result.stderr
    line = one_line_error(result.stderr)
    assert "DatabaseError" in line
    assert "unavailable" not in line
