"""The SQLite backend: real leases shared by every process and thread of one host.

It needs nothing beyond the standard library's :mod:`sqlite3`, and it is the embedded default of
:func:`lease_lock.connect` (see :func:`default_url`).

How it stays safe with many processes on one file:

- The database runs in WAL mode with a busy timeout, so readers never block writers and a
  writer waits its turn instead of failing at once.
- Every write is one ``BEGIN IMMEDIATE`` transaction: it takes the write lock before it reads,
  so two processes can never both see a key free and both take it. The fencing counter is
  bumped inside the same transaction as the grant. Reads (``is_held``, ``inspect``, ``scan``)
  are single statements, each its own consistent WAL snapshot.

The clock. SQLite has no server, so expiry is judged on one clock that every process of the
host shares: ``CLOCK_BOOTTIME`` (seconds since boot, counting through suspend, unmoved by wall
clock steps) tagged with the kernel's boot id (``/proc/sys/kernel/random/boot_id``). A row
written during an earlier boot reads as expired, because every process that held it died with
that boot. Where the OS lacks either (not Linux), the wall clock is used instead, and a wall
clock step then moves every lease by the same amount. A process in its own Linux time namespace
sees another ``CLOCK_BOOTTIME``; do not share one file across time namespaces.

``expires_at`` in a :class:`~lease_lock.backends.base.LockState` is the wall-clock time now plus
the remaining lease, computed when the row is read; ``expires_in`` is the remaining lease on the
host clock.

Counting keys (``limit`` > 1) keep one row per place in a table of their own, and the key's row
in the leases table stands for all of them: its token is ``*``, which no caller's token can be,
and its lease runs until the last place ends. Exclusive grants therefore find a counting key
held with the same one-row read as any other key, and a database file written before counting
keys existed only gains the new table.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, ClassVar, Optional, Union

from .. import forksafe
from ..errors import BackendUnavailableError, ValidationError
from ..validation import check_duration, parse_duration, redact_url
from .base import Capabilities, ExtendRequest, Holder, LockState, limit_mismatch, parse_url_options
from .service import ServiceStore, check_amount

__all__ = ["DEFAULT_BUSY_TIMEOUT", "HostClock", "SqliteBackend", "default_path", "default_url"]

#: Seconds a write waits for another process's write transaction before SQLite gives up.
DEFAULT_BUSY_TIMEOUT = 10.0

_BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"

# Inputs: none. Creates the four tables if missing; safe to run from several processes at once.
# A file made before counting keys existed gains the places table and nothing else changes, so
# processes running an earlier version keep working on it (and see a counting key as held).
# leases: one row per held (or lapsed, not yet overwritten) key. `boot` and `expires` are the
#   host clock's epoch and reading at which the lease ends. A counting key's row has the token
#   `*` and stands for its places: the largest fence with its owner, and the last place's end.
# fences: the last fence handed out per key; kept when the lease row goes, so fences only rise.
# counters: fixed-window counters of count_in_window.
# places: one row per place of a counting key, valid only while the key's row has the token `*`;
#   `key_limit` is the limit the place was granted with.
_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS lease_lock_leases (
        key TEXT PRIMARY KEY NOT NULL,
        token TEXT NOT NULL,
        owner TEXT NOT NULL,
        fence INTEGER,
        boot TEXT NOT NULL,
        expires REAL NOT NULL
    ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS lease_lock_fences (
        key TEXT PRIMARY KEY NOT NULL,
        fence INTEGER NOT NULL
    ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS lease_lock_counters (
        name TEXT PRIMARY KEY NOT NULL,
        boot TEXT NOT NULL,
        window INTEGER NOT NULL,
        count INTEGER NOT NULL
    ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS lease_lock_places (
        key TEXT NOT NULL,
        token TEXT NOT NULL,
        owner TEXT NOT NULL,
        fence INTEGER NOT NULL,
        boot TEXT NOT NULL,
        expires REAL NOT NULL,
        key_limit INTEGER NOT NULL,
        PRIMARY KEY (key, token)
    ) WITHOUT ROWID""",
)

#: The token of a counting key's row in the leases table. Callers' tokens are 16 to 128
#: characters, so none is ever equal to it, and every exclusive statement, which matches the
#: caller's token, leaves the row alone.
_PLACES = "*"

# Inputs: key. Result: the lease row (token, owner, fence, boot, expires) or nothing.
_SELECT_LEASE = "SELECT token, owner, fence, boot, expires FROM lease_lock_leases WHERE key = ?"
# Inputs: key, token, owner, fence, boot, expires. Result: the key's row is this lease.
_PUT_LEASE = "INSERT OR REPLACE INTO lease_lock_leases VALUES (?, ?, ?, ?, ?, ?)"
# Inputs: boot, new expires, key, token, boot, now. Result: rowcount 1 when the token's live
# lease was replaced.
_SET_EXPIRY = (
    "UPDATE lease_lock_leases SET boot = ?, expires = ? WHERE key = ? AND token = ?"
    " AND boot = ? AND expires > ?"
)
# Inputs: key, token, boot, now. Result: rowcount 1 when the token's live lease was deleted.
_DELETE_OWN = (
    "DELETE FROM lease_lock_leases WHERE key = ? AND token = ? AND boot = ? AND expires > ?"
)
# Inputs: key, token, boot, now. Result: one row when the token holds a live lease.
_IS_HELD = (
    "SELECT 1 FROM lease_lock_leases WHERE key = ? AND token = ? AND boot = ? AND expires > ?"
)
# The condition under which a place row counts: its key's row still stands for places (an
# earlier version's force release drops that row only).
_PLACES_STAND = f"EXISTS (SELECT 1 FROM lease_lock_leases WHERE key = ?1 AND token = '{_PLACES}')"
# Inputs: key, token, boot, now. Result: rowcount 1 when the token's live place was deleted.
_DELETE_OWN_PLACE = (
    "DELETE FROM lease_lock_places WHERE key = ?1 AND token = ?2 AND boot = ?3 AND expires > ?4"
    f" AND {_PLACES_STAND}"
)
# Inputs: key, token, boot, now, new expires. Result: rowcount 1 when the token's live place
# was extended.
_SET_PLACE_EXPIRY = (
    "UPDATE lease_lock_places SET expires = ?5 WHERE key = ?1 AND token = ?2 AND boot = ?3"
    f" AND expires > ?4 AND {_PLACES_STAND}"
)
# Inputs: key, token, boot, now. Result: one row when the token holds a live place.
_HOLDS_PLACE = (
    "SELECT 1 FROM lease_lock_places WHERE key = ?1 AND token = ?2 AND boot = ?3 AND expires > ?4"
    f" AND {_PLACES_STAND}"
)
# Inputs: key, boot, now. Result: (token, fence, key_limit) of the key's live places.
_LIVE_PLACES = (
    "SELECT token, fence, key_limit FROM lease_lock_places WHERE key = ? AND boot = ? AND expires > ?"
)
# Inputs: key, boot, now. Result: the key's places whose lease ended are gone.
_DROP_LAPSED_PLACES = (
    "DELETE FROM lease_lock_places WHERE key = ? AND NOT (boot = ? AND expires > ?)"
)
# The key's row, and for a counting key each of its live places (NULLs for an exclusive key),
# read in one statement so that the row and its places are one snapshot.
_WITH_PLACES = (
    "SELECT l.key, l.token, l.owner, l.fence, l.boot, l.expires,"
    " p.owner, p.fence, p.expires, p.key_limit FROM lease_lock_leases AS l"
    " LEFT JOIN lease_lock_places AS p"
    f" ON l.token = '{_PLACES}' AND p.key = l.key AND p.boot = ?1 AND p.expires > ?2"
)
# Inputs: boot, now, key. Result: rows of _WITH_PLACES for the key.
_INSPECT = f"{_WITH_PLACES} WHERE l.key = ?3"
# Inputs: boot, now, prefix. Result: rows of _WITH_PLACES for live keys starting with the
# prefix, by key.
_SCAN = (
    f"{_WITH_PLACES} WHERE substr(l.key, 1, length(?3)) = ?3 AND l.boot = ?1 AND l.expires > ?2"
    " ORDER BY l.key"
)


class HostClock:
    """The one clock all processes of this host agree on, as ``(epoch, seconds)`` readings.

    ``epoch`` names the span in which ``seconds`` are comparable: the boot id with
    ``CLOCK_BOOTTIME``, or ``"wall"`` with the wall-clock fallback. Readings of different epochs
    are never compared; a lease written under another epoch is over.
    """

    def __init__(self) -> None:
        boottime = getattr(time, "CLOCK_BOOTTIME", None)
        boot_id = _read_boot_id()
        if boottime is not None and boot_id is not None:
            self.epoch = f"boot:{boot_id}"
            self._read: Callable[[], float] = lambda: time.clock_gettime(boottime)
            self.description = "CLOCK_BOOTTIME of this host, tagged with its boot id"
        else:  # pragma: no cover - not Linux
            self.epoch = "wall"
            self._read = time.time
            self.description = "the wall clock of this host"

    def __call__(self) -> float:
        """Seconds on this host's clock, comparable within :attr:`epoch`."""
        return self._read()


def _read_boot_id() -> Optional[str]:
    try:
        with open(_BOOT_ID_FILE, encoding="ascii") as handle:
            text = handle.read().strip()
    except OSError:
        return None
    return text or None


def default_path() -> Path:
    """The embedded default database file of this user (not created by this call).

    ``$XDG_STATE_HOME/lease-lock/locks.db`` when ``XDG_STATE_HOME`` is an absolute path (the
    XDG rule: a relative value is ignored), else ``~/.local/state/lease-lock/locks.db``.
    """
    state_home = os.environ.get("XDG_STATE_HOME", "")
    base = Path(state_home) if os.path.isabs(state_home) else Path.home() / ".local" / "state"
    return base / "lease-lock" / "locks.db"


def default_url() -> str:
    """The ``sqlite:`` URL of :func:`default_path`, creating its directory (mode 0700) if needed.

    This is what :func:`lease_lock.connect` uses when given no URL and no ``LEASE_LOCK_URL``. The
    database file itself is created by the first connection.
    """
    path = default_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    return "sqlite:///" + urllib.parse.quote(str(path))


#: Fragments of ``sqlite3.OperationalError`` messages that mean "the store cannot be reached":
#: another connection kept the database locked past the busy timeout, or the file cannot be
#: opened at all. Anything else (a malformed schema, a full disk) is not an outage.
_UNAVAILABLE_MESSAGES = ("database is locked", "database table is locked", "unable to open database file")


@contextlib.contextmanager
def _unavailable_on_outage() -> Iterator[None]:
    """Raise ``BackendUnavailableError`` from the ``sqlite3`` errors that mean an outage."""
    try:
        yield
    except sqlite3.OperationalError as error:
        text = str(error)
        if any(fragment in text for fragment in _UNAVAILABLE_MESSAGES):
            raise BackendUnavailableError(f"sqlite database unavailable: {text}", backend="sqlite") from error
        raise


def _parse_busy_timeout(text: str) -> float:
    return parse_duration(text, "busy_timeout")


def _path_from_url(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.netloc:
        raise ValidationError(
            f"sqlite URL {redact_url(url)!r} names a host; use sqlite:///relative.db or sqlite:////abs.db"
        )
    # SQLAlchemy's rule: after "sqlite://" comes "/" and then the path, so "sqlite:///x.db" is
    # relative and "sqlite:////x.db" absolute.
    if parts.path and not parts.path.startswith("/"):
        raise ValidationError(
            f"sqlite URL {redact_url(url)!r} must start with sqlite:/// (relative) or sqlite://// (absolute)"
        )
    path = urllib.parse.unquote(parts.path[1:])
    if not path or path == ":memory:":
        raise ValidationError(
            f"sqlite URL {redact_url(url)!r} names no file; an in-memory database is private to one "
            "connection (use memory:// for one process)"
        )
    return path


class SqliteBackend(ServiceStore, forksafe.MutexForkGuard):
    """Leases in a SQLite file, shared by every process and thread of one host.

    ``path`` is the database file (created if missing; its directory must exist). A relative
    path is resolved against the working directory once, here. ``busy_timeout`` is how long one
    operation waits for another process's write before giving up.

    A database still locked past the busy timeout, or a file that cannot be opened (missing
    directory, no permission), raises :class:`~lease_lock.errors.BackendUnavailableError` with
    the ``sqlite3`` error as ``__cause__``; every other SQLite error passes through untouched.

    One connection per process, guarded by a lock, serves every thread; a child made by
    ``os.fork()`` opens its own on first use and never touches the parent's.
    """

    capabilities: ClassVar[Capabilities] = Capabilities(
        server_clock=False,
        fencing=True,
        release_notify=False,
        scan=True,
        batch_extend=True,
        counting=True,
        replica_wait=False,
        min_ttl=0.0,
        clock="CLOCK_BOOTTIME of the host with its boot id (the wall clock where unavailable)",
        wake="none: waiters pause 0.2 s between attempts",
    )
    url_options: ClassVar[Mapping[str, Callable[[str], Any]]] = {
        "busy_timeout": _parse_busy_timeout,
    }

    def __init__(
        self, path: Union[str, os.PathLike[str]], *, busy_timeout: float = DEFAULT_BUSY_TIMEOUT
    ) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise ValidationError(f"path must be a str or os.PathLike, not {type(path).__name__}")
        text = os.fspath(path)
        if not text or text == ":memory:":
            raise ValidationError("path must name a database file (':memory:' is not shared)")
        self.path = os.path.abspath(text)
        self.busy_timeout = check_duration(busy_timeout, "busy_timeout")
        self._clock = HostClock()
        self._mutex = threading.Lock()
        self._connection: Optional[sqlite3.Connection] = None
        self._pid = 0
        # Connections inherited through fork: closing one in the child could checkpoint or
        # delete the WAL under the parent, so they are kept open and never used again.
        self._inherited: list[sqlite3.Connection] = []
        forksafe.register(self)

    # Every call into SQLite happens under self._mutex, which MutexForkGuard holds across a
    # fork: a child forked mid-call would otherwise inherit SQLite's own mutexes locked (one hung
    # in its first connect). The child's next call sets the parent's connection aside and opens
    # its own.

    @classmethod
    def from_url(cls, url: str, **options: Any) -> SqliteBackend:
        """``sqlite:///relative.db`` or ``sqlite:////absolute.db``; option ``busy_timeout``."""
        path = _path_from_url(url)
        parsed = parse_url_options(url, cls.url_options, options, backend="sqlite")
        return cls(path, **parsed)

    def __repr__(self) -> str:
        return f"SqliteBackend({self.path!r})"

    # -- connection and transactions -----------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        connection = sqlite3.connect(
            self.path,
            timeout=self.busy_timeout,
            isolation_level=None,  # transactions are begun explicitly below
            check_same_thread=False,  # guarded by self._mutex instead
        )
        try:
            self._enable_wal(connection)
            # NORMAL in WAL mode cannot corrupt the file; it may lose the last commits on power
            # loss, when every holder died anyway (the boot id changes). Fences stay above the
            # lost ones because they never fall below the wall clock (see _next_fence).
            connection.execute("PRAGMA synchronous=NORMAL")
            connection.execute("BEGIN IMMEDIATE")
            for statement in _SCHEMA:
                connection.execute(statement)
            connection.execute("COMMIT")
        except BaseException:
            connection.close()
            raise
        return connection

    def _enable_wal(self, connection: sqlite3.Connection) -> None:
        # Switching a new file to WAL needs an exclusive lock, and SQLite answers "database is
        # locked" at once instead of calling the busy handler when another process is doing the
        # same switch. Retry within the busy timeout; once the file is in WAL mode this is a
        # read of the current mode and never conflicts.
        give_up = time.monotonic() + self.busy_timeout
        while True:
            try:
                connection.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as error:
                if "locked" not in str(error) or time.monotonic() >= give_up:
                    raise
                time.sleep(0.01)

    def _current(self) -> sqlite3.Connection:
        pid = os.getpid()
        if self._connection is not None and self._pid != pid:
            self._inherited.append(self._connection)
            self._connection = None
        if self._connection is None:
            self._connection = self._connect()
            self._pid = pid
        return self._connection

    @contextlib.contextmanager
    def _write(self) -> Iterator[tuple[sqlite3.Connection, float]]:
        """One ``BEGIN IMMEDIATE`` transaction; yields the connection and the clock reading.

        The clock is read after the write lock is taken, so time spent waiting for another
        process cannot make ``now`` stale.
        """
        with self._mutex, _unavailable_on_outage():
            connection = self._current()
            connection.execute("BEGIN IMMEDIATE")
            try:
                yield connection, self._clock()
                connection.execute("COMMIT")
            except BaseException:
                # A failed COMMIT leaves the transaction open; the next BEGIN would fail.
                if connection.in_transaction:
                    connection.execute("ROLLBACK")
                raise

    @contextlib.contextmanager
    def _read(self) -> Iterator[tuple[sqlite3.Connection, float]]:
        with self._mutex, _unavailable_on_outage():
            yield self._current(), self._clock()

    def _live(self, row: Optional[tuple[Any, ...]], now: float) -> bool:
        """Whether a row of ``_SELECT_LEASE`` is a lease still running on this epoch."""
        return row is not None and row[3] == self._clock.epoch and row[4] > now

    # -- primitives ----------------------------------------------------------------------------

    def _grant(
        self, key: str, token: str, ttl: float, owner: str, fenced: bool, replaces: Optional[str] = None
    ) -> tuple[bool, Optional[int]]:
        with self._write() as (connection, now):
            row = connection.execute(_SELECT_LEASE, (key,)).fetchone()
            # An adopted claim (``replaces``) is overwritten below by a new lease and fence.
            if self._live(row, now) and (replaces is None or row[0] != replaces):
                if row[0] != token:
                    return False, None
                fence: Optional[int] = row[2]
            else:
                if row is not None and row[0] == _PLACES:
                    # Every place of the counting key has lapsed with the row: drop them.
                    connection.execute("DELETE FROM lease_lock_places WHERE key = ?", (key,))
                fence = None
            if fenced and fence is None:
                fence = self._next_fence(connection, key)
            connection.execute(
                _PUT_LEASE, (key, token, owner, fence, self._clock.epoch, now + ttl)
            )
            return True, fence

    @staticmethod
    def _next_fence(connection: sqlite3.Connection, key: str) -> int:
        row = connection.execute(
            "SELECT fence FROM lease_lock_fences WHERE key = ?", (key,)
        ).fetchone()
        # Never below the wall clock in microseconds (below 2**53 until the year 2255). No
        # transaction takes less than a microsecond, so the counter never runs ahead of the
        # clock, and if the file is deleted or loses its last commits, new fences still exceed
        # the old ones unless the wall clock stepped back.
        fence = max((row[0] if row else 0) + 1, time.time_ns() // 1000)
        connection.execute("INSERT OR REPLACE INTO lease_lock_fences VALUES (?, ?)", (key, fence))
        return fence

    def acquire(self, key: str, token: str, ttl: float, owner: str) -> bool:
        """Grant or renew ``key`` for ``token`` in one write transaction."""
        return self._grant(key, token, ttl, owner, fenced=False)[0]

    def acquire_fenced(self, key: str, token: str, ttl: float, owner: str) -> Optional[int]:
        """Grant or renew ``key`` for ``token``; return its fence (bumped in the same write)."""
        granted, fence = self._grant(key, token, ttl, owner, fenced=True)
        return fence if granted else None

    def adopt(self, key: str, claim_token: str, token: str, ttl: float, owner: str) -> Optional[int]:
        """Replace the claim ``claim_token`` on ``key`` (or a free key) with a new fenced grant,
        in one write transaction."""
        granted, fence = self._grant(key, token, ttl, owner, fenced=True, replaces=claim_token)
        return fence if granted else None

    def acquire_counted(self, key: str, token: str, ttl: float, owner: str, limit: int) -> Optional[int]:
        """Grant or renew one of the ``limit`` places of ``key`` for ``token`` in one write
        transaction; its fence, drawn from the key's fence row."""
        epoch = self._clock.epoch
        with self._write() as (connection, now):
            row = connection.execute(_SELECT_LEASE, (key,)).fetchone()
            if self._live(row, now):
                if row[0] != _PLACES:
                    raise limit_mismatch(key, limit, 1)
                places = connection.execute(_LIVE_PLACES, (key, epoch, now)).fetchall()
            else:
                # Places left by a lapsed key, or by a force release of an earlier version
                # (which drops the key's row only), must not count again.
                connection.execute("DELETE FROM lease_lock_places WHERE key = ?", (key,))
                places = []
            if places and places[0][2] != limit:
                raise limit_mismatch(key, limit, places[0][2])
            fence = next((place_fence for holder, place_fence, _ in places if holder == token), None)
            if fence is not None:
                connection.execute(
                    "UPDATE lease_lock_places SET owner = ?, expires = ? WHERE key = ? AND token = ?",
                    (owner, now + ttl, key, token),
                )
            elif len(places) < limit:
                fence = self._next_fence(connection, key)
                connection.execute(
                    "INSERT INTO lease_lock_places VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (key, token, owner, fence, epoch, now + ttl, limit),
                )
            else:
                return None
            self._settle(connection, key, now)
            return fence

    def _settle(self, connection: sqlite3.Connection, key: str, now: float) -> None:
        """Drop the lapsed places of a counting key and make its row stand for the rest: the
        latest grant's fence and owner, and the end of the last lease. No place left: no row."""
        epoch = self._clock.epoch
        connection.execute(_DROP_LAPSED_PLACES, (key, epoch, now))
        places = connection.execute(
            "SELECT owner, fence, expires FROM lease_lock_places WHERE key = ?", (key,)
        ).fetchall()
        if not places:
            connection.execute("DELETE FROM lease_lock_leases WHERE key = ?", (key,))
            return
        owner, fence, _ = max(places, key=lambda place: place[1])
        expires = max(place[2] for place in places)
        connection.execute(_PUT_LEASE, (key, _PLACES, owner, fence, epoch, expires))

    def release(self, key: str, token: str) -> bool:
        """Delete ``key``, or ``token``'s place of it, if ``token`` holds a live lease on it."""
        epoch = self._clock.epoch
        with self._write() as (connection, now):
            if connection.execute(_DELETE_OWN, (key, token, epoch, now)).rowcount == 1:
                return True
            if connection.execute(_DELETE_OWN_PLACE, (key, token, epoch, now)).rowcount != 1:
                return False
            self._settle(connection, key, now)
            return True

    def extend(self, key: str, token: str, ttl: float) -> bool:
        """Set ``key``'s lease to ``ttl`` from now if ``token`` holds it."""
        return self.extend_many([ExtendRequest(key, token, ttl)])[0]

    def extend_many(self, requests: Sequence[ExtendRequest]) -> list[bool]:
        """Extend several leases (keys or places) in one write transaction; one answer per
        request, in order."""
        if not requests:
            return []
        epoch = self._clock.epoch
        with self._write() as (connection, now):
            return [self._extend_one(connection, item, epoch, now) for item in requests]

    def _extend_one(self, connection: sqlite3.Connection, item: ExtendRequest, epoch: str, now: float) -> bool:
        expires = now + item.ttl
        if connection.execute(_SET_EXPIRY, (epoch, expires, item.key, item.token, epoch, now)).rowcount == 1:
            return True
        if connection.execute(_SET_PLACE_EXPIRY, (item.key, item.token, epoch, now, expires)).rowcount != 1:
            return False
        self._settle(connection, item.key, now)
        return True

    def is_held(self, key: str, token: str) -> bool:
        """``True`` if ``token`` holds a live lease on ``key``, or a live place of it."""
        arguments = (key, token, self._clock.epoch)
        with self._read() as (connection, now):
            row = connection.execute(_IS_HELD, (*arguments, now)).fetchone()
            if row is None:
                row = connection.execute(_HOLDS_PLACE, (*arguments, now)).fetchone()
        return row is not None

    def _state(
        self, key: str, owner: str, fence: Optional[int], expires: float, now: float
    ) -> LockState:
        remaining = expires - now
        return LockState(
            key=key,
            held=True,
            expires_at=datetime.now(timezone.utc) + timedelta(seconds=remaining),
            fence=fence,
            owner=owner,
            expires_in=remaining,
        )

    def _key_state(self, rows: Sequence[tuple[Any, ...]], now: float) -> LockState:
        """The state of one key from its rows of ``_WITH_PLACES``."""
        key, token, owner, fence, boot, expires = rows[0][:6]
        if boot != self._clock.epoch or expires <= now:
            return LockState.free(key)
        if token != _PLACES:
            return self._state(key, owner, fence, expires, now)
        wall = datetime.now(timezone.utc)
        holders = [
            Holder(place_owner, place_fence, wall + timedelta(seconds=place_end - now), place_end - now)
            for *_, place_owner, place_fence, place_end, _ in rows
            if place_fence is not None
        ]
        return LockState.counting(key, rows[0][9] or 1, holders)

    def inspect(self, key: str) -> LockState:
        """The state of ``key`` (each place of a counting key), read in one snapshot;
        ``expires_in`` is measured on the host clock."""
        with self._read() as (connection, now):
            rows = connection.execute(_INSPECT, (self._clock.epoch, now, key)).fetchall()
        return self._key_state(rows, now) if rows else LockState.free(key)

    def force_release(self, key: str) -> bool:
        """Delete ``key`` and every place of it, whoever holds them; ``True`` when a live lease
        was dropped."""
        with self._write() as (connection, now):
            row = connection.execute(_SELECT_LEASE, (key,)).fetchone()
            connection.execute("DELETE FROM lease_lock_leases WHERE key = ?", (key,))
            if row is not None and row[0] == _PLACES:
                connection.execute("DELETE FROM lease_lock_places WHERE key = ?", (key,))
            return self._live(row, now)

    def scan(self, prefix: str) -> Iterator[LockState]:
        """Held keys starting with ``prefix``, sorted by key, a counting key once (read in one
        snapshot)."""
        with self._read() as (connection, now):
            rows = connection.execute(_SCAN, (self._clock.epoch, now, prefix)).fetchall()
        states = (self._key_state(list(group), now) for _, group in itertools.groupby(rows, lambda row: row[0]))
        return iter([state for state in states if state.held])

    def count_in_window(self, name: str, window: float, amount: int = 1) -> tuple[int, float]:
        """Add ``amount`` to counter ``name`` in the current fixed window on the host clock.

        A new boot starts every counter afresh.
        """
        check_amount(amount)
        epoch = self._clock.epoch
        with self._write() as (connection, now):
            index = math.floor(now / window)
            row = connection.execute(
                "SELECT boot, window, count FROM lease_lock_counters WHERE name = ?", (name,)
            ).fetchone()
            same = row is not None and row[0] == epoch and row[1] == index
            count = row[2] + amount if same else amount
            connection.execute(
                "INSERT OR REPLACE INTO lease_lock_counters VALUES (?, ?, ?, ?)",
                (name, epoch, index, count),
            )
            return count, (index + 1) * window - now

    def close(self) -> None:
        """Close this process's connection; a later call opens a new one."""
        with self._mutex:
            connection, self._connection = self._connection, None
            if connection is not None and self._pid == os.getpid():
                connection.close()
