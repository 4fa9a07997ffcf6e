"""SQLite as an unavailable store: a writer holding the database past the busy timeout, and a
file that cannot be opened, are ``BackendUnavailableError``; a waiting acquire rides them out."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

import pytest
from lease_lock import BackendUnavailableError, Locker, LockEvent, Retry, connect
from lease_lock.backends.sqlite import SqliteBackend

TOKEN = "a" * 32
DEADLINE = 60.0


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "locks.db"
    # Create the file and its tables first, as a running system would have them.
    SqliteBackend(path).close()
    return path


class Writer:
    """Another connection that holds the write lock of the database until told to stop."""

    def __init__(self, path: Path) -> None:
        self.connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.connection.execute("BEGIN EXCLUSIVE")
        self.stopped = False

    def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            self.connection.execute("COMMIT")
            self.connection.close()


@pytest.fixture
def writer(db: Path) -> Iterator[Writer]:
    holder = Writer(db)
    yield holder
    holder.stop()


def test_a_database_locked_past_the_busy_timeout_is_unavailable(db: Path, writer: Writer) -> None:
    backend = SqliteBackend(db, busy_timeout=0.2)
    with pytest.raises(BackendUnavailableError) as caught:
        backend.acquire("k", TOKEN, 30, "o")
    assert caught.value.backend == "sqlite"
    assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
    assert "locked" in str(caught.value)
    writer.stop()
    # The same backend works once the writer is done: nothing was left half-done.
    assert backend.acquire("k", TOKEN, 30, "o")
    backend.close()


def test_a_file_that_cannot_be_opened_is_unavailable(tmp_path: Path) -> None:
    backend = SqliteBackend(tmp_path / "no-such-directory" / "locks.db")
    with pytest.raises(BackendUnavailableError) as caught:
        backend.inspect("k")
    assert caught.value.backend == "sqlite"
    assert isinstance(caught.value.__cause__, sqlite3.OperationalError)


def test_other_sqlite_errors_pass_through(tmp_path: Path) -> None:
    path = tmp_path / "not-a-database.db"
    path.write_bytes(b"this is not an SQLite file, just text long enough to have a header" * 10)
    backend = SqliteBackend(path)
    with pytest.raises(sqlite3.DatabaseError) as caught:
        backend.acquire("k", TOKEN, 30, "o")
    assert not isinstance(caught.value, BackendUnavailableError)
    backend.close()


def _waiter(locker: Locker, timeout: float, outcome: dict[str, object]) -> threading.Thread:
    def run() -> None:
        try:
            outcome["lock"] = locker.acquire("k", timeout=timeout)
        except Exception as error:  # noqa: BLE001 - handed to the test thread
            outcome["error"] = error

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_waiting_acquire_rides_out_a_locked_database(db: Path, writer: Writer) -> None:
    failed = threading.Event()
    seen: list[LockEvent] = []

    def on_event(event: LockEvent) -> None:
        seen.append(event)
        if event.type == "attempt_failed" and len([e for e in seen if e.type == "attempt_failed"]) >= 2:
            failed.set()

    locker = connect(f"sqlite:///{db}?busy_timeout=0.2", on_event=on_event, retry=Retry(delay=0.1))
    outcome: dict[str, object] = {}
    thread = _waiter(locker, 30.0, outcome)
    assert failed.wait(DEADLINE), "the waiter never reported a failed attempt"
    writer.stop()
    thread.join(DEADLINE)
    assert not thread.is_alive()
    assert "error" not in outcome, outcome
    lock = outcome["lock"]
    assert getattr(lock, "state", None) == "held"
    errors = [event.error for event in seen if event.type == "attempt_failed"]
    assert all(isinstance(error, BackendUnavailableError) for error in errors)
    locker.close()


def test_a_locked_database_past_the_timeout_raises_the_outage(db: Path, writer: Writer) -> None:
    locker = connect(f"sqlite:///{db}?busy_timeout=0.2", retry=Retry(delay=0.1))
    outcome: dict[str, object] = {}
    thread = _waiter(locker, 1.0, outcome)
    thread.join(DEADLINE)
    assert not thread.is_alive()
    error: Optional[object] = outcome.get("error")
    # The last attempt found the database locked: nobody answered that the key is held.
    assert isinstance(error, BackendUnavailableError)
    assert "attempt(s) over" in str(error)
    assert isinstance(error.__cause__, sqlite3.OperationalError)
    locker.close()


def test_try_acquire_on_a_locked_database_raises_at_once(db: Path, writer: Writer) -> None:
    locker = connect(f"sqlite:///{db}?busy_timeout=0.2")
    with pytest.raises(BackendUnavailableError):
        locker.try_acquire("k")
    locker.close()
