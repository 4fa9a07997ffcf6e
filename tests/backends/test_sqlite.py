"""The SQLite backend: the contract suite, its URL and default-file rules, its host clock, and
real processes sharing one file."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from lease_lock import Locker
from lease_lock.backends import backend_from_url
from lease_lock.backends.base import ExtendRequest
from lease_lock.backends.sqlite import HostClock, SqliteBackend, default_path, default_url
from lease_lock.errors import BackendUnavailableError, ValidationError
from lease_lock.testing import BackendContract, ServiceStoreContract, wait_until

TOKEN_A = "a" * 32
TOKEN_B = "b" * 32


class TestSqliteBackend(BackendContract, ServiceStoreContract):
    @pytest.fixture
    def backend(self, tmp_path: Path) -> Iterator[SqliteBackend]:
        backend = SqliteBackend(tmp_path / "locks.db")
        yield backend
        backend.close()


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "locks.db"


# -- URLs and the default file ---------------------------------------------------------------


def test_url_with_four_slashes_is_absolute(db: Path) -> None:
    backend = backend_from_url(f"sqlite:///{db}")
    assert isinstance(backend, SqliteBackend)
    assert backend.path == str(db)
    backend.close()


def test_url_with_three_slashes_is_relative_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    backend = backend_from_url("sqlite:///sub%20dir.db?busy_timeout=2s")
    assert isinstance(backend, SqliteBackend)
    assert backend.path == str(tmp_path / "sub dir.db")
    assert backend.busy_timeout == 2.0
    assert backend.acquire("k", TOKEN_A, 30, "o")
    assert (tmp_path / "sub dir.db").exists()
    backend.close()


def test_keyword_option_overrides_the_query(db: Path) -> None:
    backend = backend_from_url(f"sqlite:///{db}?busy_timeout=2", busy_timeout=5.0)
    assert isinstance(backend, SqliteBackend)
    assert backend.busy_timeout == 5.0


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("sqlite://", "names no file"),
        ("sqlite:///", "names no file"),
        ("sqlite:///:memory:", "names no file"),
        ("sqlite://host/x.db", "names a host"),
        ("sqlite:///x.db?journal=wal", "unknown sqlite URL option 'journal'"),
        ("sqlite:///x.db?busy_timeout=soon", "busy_timeout must look like"),
        ("sqlite:///x.db?busy_timeout=0", "busy_timeout must be > 0"),
    ],
)
def test_bad_urls_are_validation_errors(url: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        backend_from_url(url)


def test_bad_constructor_arguments() -> None:
    with pytest.raises(ValidationError, match="path must be a str"):
        SqliteBackend(42)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="path must name a database file"):
        SqliteBackend(":memory:")
    with pytest.raises(ValidationError, match="busy_timeout must be"):
        SqliteBackend("x.db", busy_timeout=-1)


def test_default_path_follows_xdg_state_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert default_path() == tmp_path / "state" / "lease-lock" / "locks.db"
    # The XDG rule: a relative value is ignored.
    monkeypatch.setenv("XDG_STATE_HOME", "relative/state")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_path() == tmp_path / "home" / ".local" / "state" / "lease-lock" / "locks.db"
    monkeypatch.delenv("XDG_STATE_HOME")
    assert default_path() == tmp_path / "home" / ".local" / "state" / "lease-lock" / "locks.db"


def test_default_url_creates_the_directory_and_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "my state"))
    url = default_url()
    directory = tmp_path / "my state" / "lease-lock"
    assert directory.is_dir()
    assert (directory.stat().st_mode & 0o777) == 0o700
    backend = backend_from_url(url)
    assert isinstance(backend, SqliteBackend)
    assert backend.path == str(directory / "locks.db")
    assert backend.acquire("k", TOKEN_A, 30, "o")
    assert (directory / "locks.db").exists()
    backend.close()


# -- storage behaviour -----------------------------------------------------------------------


def test_database_runs_in_wal_mode(db: Path) -> None:
    backend = SqliteBackend(db)
    assert backend.acquire("k", TOKEN_A, 30, "o")
    with contextlib.closing(sqlite3.connect(db)) as raw, raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    backend.close()


def test_two_backends_on_one_file_contend(db: Path) -> None:
    first, second = SqliteBackend(db), SqliteBackend(db)
    assert first.acquire_fenced("k", TOKEN_A, 30, "first") is not None
    assert second.acquire_fenced("k", TOKEN_B, 30, "second") is None
    assert second.inspect("k").owner == "first"
    assert first.release("k", TOKEN_A)
    assert second.acquire("k", TOKEN_B, 30, "second")
    first.close()
    second.close()


def test_rows_from_an_earlier_boot_read_expired(db: Path) -> None:
    backend = SqliteBackend(db)
    fence = backend.acquire_fenced("k", TOKEN_A, 3600, "o")
    assert fence is not None
    # Pretend the lease was written before a reboot: same reading, another boot id.
    with contextlib.closing(sqlite3.connect(db)) as raw, raw:
        raw.execute("UPDATE lease_lock_leases SET boot = 'boot:an-earlier-boot'")
    assert not backend.inspect("k").held
    assert not backend.is_held("k", TOKEN_A)
    assert backend.extend("k", TOKEN_A, 30) is False
    assert list(backend.scan("")) == []
    assert backend.force_release("k") is False
    later = backend.acquire_fenced("k", TOKEN_B, 30, "o")
    assert later is not None
    assert later > fence
    backend.close()


def test_host_clock_is_boottime_tagged_with_the_boot_id() -> None:
    clock = HostClock()
    with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
        assert clock.epoch == f"boot:{handle.read().strip()}"
    first = clock()
    assert clock() >= first


def test_fences_keep_rising_when_the_file_is_lost(db: Path) -> None:
    backend = SqliteBackend(db)
    fences = []
    for _ in range(3):
        fence = backend.acquire_fenced("k", TOKEN_A, 30, "o")
        assert fence is not None
        assert backend.release("k", TOKEN_A)
        fences.append(fence)
    backend.close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    fresh = SqliteBackend(db)
    after = fresh.acquire_fenced("k", TOKEN_B, 30, "o")
    assert after is not None
    assert after > max(fences)
    assert after < 2**53
    fresh.close()


def test_unfenced_holder_gets_a_fence_on_fenced_reacquire(db: Path) -> None:
    backend = SqliteBackend(db)
    assert backend.acquire("k", TOKEN_A, 30, "o")
    assert backend.inspect("k").fence is None
    fence = backend.acquire_fenced("k", TOKEN_A, 30, "o")
    assert fence is not None
    assert backend.inspect("k").fence == fence
    backend.close()


def test_extend_many_uses_one_transaction(db: Path) -> None:
    backend = SqliteBackend(db)
    for key in ("a", "b"):
        assert backend.acquire(key, TOKEN_A, 30, "o")
    statements: list[str] = []
    connection = backend._current()
    connection.set_trace_callback(statements.append)
    requests = [ExtendRequest("a", TOKEN_A, 60), ExtendRequest("b", TOKEN_B, 60)]
    requests.append(ExtendRequest("b", TOKEN_A, 60))
    assert backend.extend_many(requests) == [True, False, True]
    connection.set_trace_callback(None)
    boundaries = [s for s in statements if s in ("BEGIN IMMEDIATE", "COMMIT")]
    assert boundaries == ["BEGIN IMMEDIATE", "COMMIT"]
    backend.close()


def test_busy_database_raises_backend_unavailable_from_the_driver_error(db: Path) -> None:
    backend = SqliteBackend(db, busy_timeout=0.2)
    assert backend.acquire("k", TOKEN_A, 30, "o")
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(BackendUnavailableError, match="locked") as caught:
            backend.acquire("k", TOKEN_B, 30, "o")
        assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
        # Reads do not wait for the writer in WAL mode.
        assert backend.is_held("k", TOKEN_A)
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    # The failed transaction left nothing open behind it.
    assert backend.release("k", TOKEN_A)
    backend.close()


def test_count_in_window_is_shared_by_connections(db: Path) -> None:
    first, second = SqliteBackend(db), SqliteBackend(db)
    # A day-long window almost never rolls over between the calls; if it does, the second
    # count starts afresh and has more time left than the first.
    count1, left1 = first.count_in_window("api", 86400)
    count2, left2 = second.count_in_window("api", 86400)
    assert count2 == (count1 + 1 if left2 <= left1 else 1)
    assert 0 < left2 <= 86400
    assert 0 < left1 <= 86400
    assert first.count_in_window("other", 86400)[0] == 1
    first.close()
    second.close()


# The tables as the version before counting keys created them.
PREVIOUS_SCHEMA = (
    "CREATE TABLE lease_lock_leases (key TEXT PRIMARY KEY NOT NULL, token TEXT NOT NULL,"
    " owner TEXT NOT NULL, fence INTEGER, boot TEXT NOT NULL, expires REAL NOT NULL) WITHOUT ROWID",
    "CREATE TABLE lease_lock_fences (key TEXT PRIMARY KEY NOT NULL, fence INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE TABLE lease_lock_counters (name TEXT PRIMARY KEY NOT NULL, boot TEXT NOT NULL,"
    " window INTEGER NOT NULL, count INTEGER NOT NULL) WITHOUT ROWID",
)


def test_a_file_of_the_previous_version_keeps_its_leases_and_gains_counting_keys(db: Path) -> None:
    clock = HostClock()
    with contextlib.closing(sqlite3.connect(db)) as raw, raw:
        raw.execute("PRAGMA journal_mode=WAL")
        for statement in PREVIOUS_SCHEMA:
            raw.execute(statement)
        raw.execute("INSERT INTO lease_lock_fences VALUES ('old', 7)")
        lease = (TOKEN_A, clock.epoch, clock() + 60)
        raw.execute("INSERT INTO lease_lock_leases VALUES ('old', ?, 'before', 7, ?, ?)", lease)
    backend = SqliteBackend(db)
    assert backend.is_held("old", TOKEN_A) and backend.inspect("old").fence == 7
    assert backend.acquire_fenced("old", TOKEN_B, 30, "o") is None
    assert backend.extend("old", TOKEN_A, 30) and backend.release("old", TOKEN_A)
    fences = [backend.acquire_counted("new", token, 30, "o", 2) or 0 for token in (TOKEN_A, TOKEN_B)]
    assert all(fences) and backend.inspect("new").limit == 2
    with contextlib.closing(sqlite3.connect(db)) as raw, raw:
        # The previous version's tables kept their shape: its grant, six values, still fits,
        # and the read it grants by finds the counting key held by a token no caller has.
        raw.execute("INSERT OR REPLACE INTO lease_lock_leases VALUES ('other', ?, 'o', NULL, ?, ?)", lease)
        token, _, _, boot, expires = raw.execute(
            "SELECT token, owner, fence, boot, expires FROM lease_lock_leases WHERE key = 'new'"
        ).fetchone()
        assert token not in (TOKEN_A, TOKEN_B) and boot == clock.epoch and expires > clock()
        # Its force release drops the key's row only; the places left behind count no more.
        raw.execute("DELETE FROM lease_lock_leases WHERE key = 'new'")
    assert not backend.is_held("new", TOKEN_A) and not backend.inspect("new").held
    assert backend.extend("new", TOKEN_A, 30) is False and backend.release("new", TOKEN_B) is False
    later = backend.acquire_counted("new", "c" * 32, 30, "o", 3)
    assert later is not None and later > max(fences)
    assert len(backend.inspect("new").holders) == 1
    assert backend.is_held("other", TOKEN_A)
    backend.close()


def test_exclusive_grants_find_a_counting_key_held_until_its_last_place_ends(db: Path) -> None:
    backend = SqliteBackend(db)
    counted = [backend.acquire_counted("k", token, ttl, "o", 2) or 0 for token, ttl in ((TOKEN_A, 0.2), (TOKEN_B, 0.6))]
    assert all(counted)
    assert backend.acquire("k", TOKEN_A, 30, "o") is False
    assert backend.adopt("k", TOKEN_A, "c" * 32, 30, "o") is None
    assert wait_until(lambda: not backend.is_held("k", TOKEN_A), 10)
    assert backend.acquire_fenced("k", "c" * 32, 30, "o") is None  # one place still lives
    assert wait_until(lambda: not backend.inspect("k").held, 10)
    fence = backend.acquire_fenced("k", "c" * 32, 30, "o")
    assert fence is not None and fence > max(counted)
    # The lapsed places went with the grant that took the key over.
    with contextlib.closing(sqlite3.connect(db)) as raw, raw:
        assert raw.execute("SELECT count(*) FROM lease_lock_places").fetchone()[0] == 0
    backend.close()


def test_close_then_reuse_reopens(db: Path) -> None:
    backend = SqliteBackend(db)
    assert backend.acquire("k", TOKEN_A, 30, "o")
    backend.close()
    backend.close()
    assert backend.is_held("k", TOKEN_A)
    backend.close()


# -- real processes --------------------------------------------------------------------------


def _fork_child(backend: SqliteBackend, queue: multiprocessing.Queue[object]) -> None:
    # The inherited connection must not be used; a fresh one is opened on first use.
    queue.put((backend.is_held("parent", TOKEN_A), backend.acquire("child", TOKEN_B, 30, "c")))


def test_forked_child_opens_its_own_connection(db: Path) -> None:
    backend = SqliteBackend(db)
    assert backend.acquire("parent", TOKEN_A, 30, "p")
    context = multiprocessing.get_context("fork")
    queue: multiprocessing.Queue[object] = context.Queue()
    child = context.Process(target=_fork_child, args=(backend, queue))
    child.start()
    assert queue.get(timeout=60) == (True, True)
    child.join(60)
    assert child.exitcode == 0
    # The parent's connection still works after the child exited.
    assert backend.is_held("child", TOKEN_B)
    assert backend.release("parent", TOKEN_A)
    backend.close()


ROUNDS = 100
WORKERS = 4


def _contend(path: str, marker: str, worker: int) -> list[tuple[int, float, float]]:
    """Take the key ROUNDS times; return (fence, held-from, held-until) per grant.

    While holding, the worker creates ``marker`` exclusively: a second holder at the same time
    would find it there. Times are CLOCK_MONOTONIC, which every process of the host shares.
    """
    backend = SqliteBackend(path)
    token = f"worker-{worker}-".ljust(32, "x")
    grants = []
    try:
        for _ in range(ROUNDS):
            while (fence := backend.acquire_fenced("shared", token, 30, token[:8])) is None:
                time.sleep(0.001)
            held_from = time.monotonic()
            descriptor = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            os.close(descriptor)
            os.unlink(marker)
            held_until = time.monotonic()
            assert backend.release("shared", token)
            grants.append((fence, held_from, held_until))
    finally:
        backend.close()
    return grants


def test_four_processes_share_one_key_without_overlap(tmp_path: Path) -> None:
    path = str(tmp_path / "locks.db")
    SqliteBackend(path).close()  # create the schema once, outside the race
    context = multiprocessing.get_context("spawn")
    with context.Pool(WORKERS) as pool:
        results = pool.starmap(
            _contend,
            [(path, str(tmp_path / "held.marker"), worker) for worker in range(WORKERS)],
        )
    grants = sorted(grant for worker_grants in results for grant in worker_grants)
    assert len(grants) == WORKERS * ROUNDS
    fences = [fence for fence, _, _ in grants]
    assert len(set(fences)) == len(fences)
    # Sorted by fence, the holding intervals must follow each other: fences rise in grant order
    # and no two holders overlapped.
    for (_, _, earlier_until), (_, later_from, _) in zip(grants, grants[1:]):
        assert earlier_until <= later_from


def _open_fresh_file_and_acquire(path: str, worker: int, start: float) -> bool:
    """Wait for the common start time, then open the (not yet created) file and take a key."""
    while time.time() < start:
        time.sleep(0.001)
    backend = SqliteBackend(path)
    try:
        return backend.acquire(f"worker:{worker}", f"token-{worker}".ljust(32, "x"), 30, "race")
    finally:
        backend.close()


def test_processes_racing_to_create_the_file_all_succeed(tmp_path: Path) -> None:
    # Regression: switching a brand-new file to WAL raised "database is locked" in one of two
    # processes that opened it at the same moment (seen in examples/contend.py).
    racers = 8
    context = multiprocessing.get_context("spawn")
    with context.Pool(racers) as pool:
        for round_number in range(3):
            path = str(tmp_path / f"fresh-{round_number}.db")
            start = time.time() + 1.0  # after every spawned interpreter is ready
            jobs = [(path, worker, start) for worker in range(racers)]
            assert pool.starmap(_open_fresh_file_and_acquire, jobs) == [True] * racers


def test_url_without_the_slashes_is_refused() -> None:
    with pytest.raises(ValidationError, match="must start with sqlite:///"):
        backend_from_url("sqlite:x.db")


HOLDERS_LIMIT = 2
COUNTED_ROUNDS = 10


def _hold_a_place(path: str, start: float) -> list[tuple[int, float, float]]:
    """Take a place of the limit-2 key COUNTED_ROUNDS times through a Locker; (fence, entered,
    left) per grant, on CLOCK_MONOTONIC, which every process of the host shares. The times are
    read inside the holding, so they can only understate how many held at once."""
    while time.time() < start:
        time.sleep(0.001)
    backend = SqliteBackend(path)
    grants = []
    try:
        with Locker(backend, limit=HOLDERS_LIMIT) as locker:
            for _ in range(COUNTED_ROUNDS):
                lock = locker.acquire("counted", timeout=60)
                entered = time.monotonic()
                time.sleep(0.02)
                left = time.monotonic()
                assert lock.fence is not None
                grants.append((lock.fence, entered, left))
                lock.release()
    finally:
        backend.close()
    return grants


def test_four_processes_hold_a_limit_2_key_at_most_two_at_once(tmp_path: Path) -> None:
    path = str(tmp_path / "locks.db")
    SqliteBackend(path).close()
    context = multiprocessing.get_context("spawn")
    with context.Pool(WORKERS) as pool:
        start = time.time() + 1.0  # after every spawned interpreter is ready
        results = pool.starmap(_hold_a_place, [(path, start)] * WORKERS)
    grants = [grant for worker_grants in results for grant in worker_grants]
    assert len(grants) == WORKERS * COUNTED_ROUNDS
    assert len({fence for fence, _, _ in grants}) == len(grants)
    # Sweep the holdings in time order (a leaving before an entering at the same instant).
    changes = sorted([(entered, 1) for _, entered, _ in grants] + [(left, -1) for _, _, left in grants])
    holding = most = 0
    for _, change in changes:
        holding += change
        most = max(most, holding)
    assert most == HOLDERS_LIMIT
