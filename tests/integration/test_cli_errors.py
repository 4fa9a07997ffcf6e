"""The command's exit status for store errors: 69 only for ``BackendUnavailableError``.

Before, every exception that was not lease_lock's own was reported as "backend unavailable"
(69), so a cron wrapper retried setup mistakes and bugs for ever.
"""

from __future__ import annotations

import sqlite3
import urllib.parse
from pathlib import Path
from typing import Any

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


def test_a_database_that_does_not_exist_is_a_usage_error(tmp_path: Path, postgres_server: Any) -> None:
    parts = urllib.parse.urlsplit(str(postgres_server.url))
    netloc = parts.netloc.rpartition("@")[2]
    for user, missing in ((parts.username or "postgres", "nosuchdb"), ("nosuchrole", "")):
        database = missing or parts.path.lstrip("/")
        url = urllib.parse.urlunsplit(("postgresql", f"{user}:s3cret@{netloc}", f"/{database}", "", ""))
        result = Cli(url, tmp_path).run("status", "k")
        # A setting no retry fixes: 2 (as a bad option), never 69 (retried) or 1 (a bug).
        assert result.returncode == 2, result.stderr
        line = one_line_error(result.stderr)
        assert line.startswith(f"lease-lock: the store refused postgresql://{user}:***@{netloc}/{database}: ")
        assert f'"{missing or user}" does not exist' in line and "check the URL" in line
        assert "unexpected" not in line and "s3cret" not in line


def test_a_refused_http_credential_is_a_usage_error(tmp_path: Path, lock_service: Any) -> None:
    cli = Cli(lock_service.url, tmp_path)
    cli.env["LEASE_LOCK_API_KEY"] = "no-such-key"
    for args in (("status", "k"), ("run", "k", "--", "true")):
        result = cli.run(*args)
        # As a refused database login: a setting no retry fixes, so 2, never 1 (a bug) or 69.
        assert result.returncode == 2, result.stderr
        line = one_line_error(result.stderr)
        assert line.startswith("lease-lock: the store refused the credential: ") and "no-such-key" not in line
