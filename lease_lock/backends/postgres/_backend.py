"""The PostgreSQL backend: one row per held key, judged on the server's ``clock_timestamp()``."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import re
import secrets
import threading
import time
import urllib.parse
from datetime import timezone
from typing import Any, Callable, ClassVar, ContextManager, Iterator, NamedTuple, Optional, Sequence, Union

import psycopg2
import psycopg2.errors
import psycopg2.extensions

from ...errors import ValidationError
from ...validation import check_bool
from ..base import (
    CALL_MARGIN,
    CallBudget,
    Capabilities,
    ExtendRequest,
    Holder,
    LockState,
    ReleaseWatcher,
    WaitingLine,
    limit_mismatch,
    parse_bool,
    parse_url_options,
)
from ..handoff import HandoffWatcher
from ..line import BURST, FRESH_SHARE, AnnouncedLine, Announcements, Joined, LineSlots, claim_for
from ..service import ServiceStore, check_amount
from ._connections import ConnectionSource, LazyPool, arm_bound, check_dsn, end_bound
from ._errors import is_connect_failure, is_connection_failure, unavailable
from ._line import ListeningConnections, PostgresWaitingLine
from ._sql import Names, ddl, resolve_names
from ._watch import PostgresHandoffWatcher, PostgresReleaseWatcher

__all__ = ["PostgresBackend"]

#: The first-use checks read tuples, whatever ``cursor_factory`` the caller's connection has.
_PLAIN_CURSOR = psycopg2.extensions.cursor
_IDLE = psycopg2.extensions.TRANSACTION_STATUS_IDLE

_LOCK_COLUMNS = ("key", "token", "expires_at", "fence", "owner")
_LOCK_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE")
_COUNTER_COLUMNS = ("name", "window_index", "count")
_COUNTER_PRIVILEGES = ("SELECT", "INSERT", "UPDATE")
_QUEUE_COLUMNS = ("key", "token", "owner", "claim", "fenced", "channel", "ticket", "joined", "fresh_until")

_log = logging.getLogger("lease_lock")
#: How many keys a backend remembers as having had somebody in line (see _hand_on_in_line).
_QUEUED_KEYS = 4096

# Inputs: the table's regclass text, the columns that must be unique together, the
# privileges needed. Result: one row (exists, column names, has a usable unique index on the
# columns, the privileges the current role lacks). The index must be usable by ON CONFLICT:
# unique, valid, not deferrable, not partial, on those columns and no others.
_TABLE_CHECK = """
WITH target AS (SELECT to_regclass(%(table)s) AS oid)
SELECT
  target.oid IS NOT NULL,
  ARRAY(SELECT attname::text FROM pg_attribute
        WHERE attrelid = target.oid AND attnum > 0 AND NOT attisdropped),
  EXISTS (SELECT 1 FROM pg_index AS i
          WHERE i.indrelid = target.oid AND i.indisunique AND i.indisvalid AND i.indimmediate
            AND i.indnkeyatts = cardinality(%(unique)s::text[]) AND i.indpred IS NULL
            AND i.indexprs IS NULL
            AND ARRAY(SELECT a.attname::text FROM generate_series(0, i.indnkeyatts - 1) AS k(n)
                      JOIN pg_attribute AS a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[k.n]
                      ORDER BY 1)
                = ARRAY(SELECT unnest(%(unique)s::text[]) ORDER BY 1)),
  ARRAY(SELECT privilege FROM unnest(%(privileges)s::text[]) AS privilege
        WHERE target.oid IS NOT NULL AND NOT has_table_privilege(target.oid, privilege))
FROM target
"""

# Inputs: the sequence's regclass text. Result: (is a sequence, current role may nextval).
_SEQUENCE_CHECK = """
WITH target AS (SELECT to_regclass(%(sequence)s) AS oid)
SELECT
  COALESCE((SELECT relkind = 'S' FROM pg_class WHERE oid = target.oid), false),
  target.oid IS NOT NULL AND has_sequence_privilege(target.oid, 'USAGE')
FROM target
"""


def _parse_positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError("must be at least 1")
    return value


#: libpq parameters a URL-built pool gets unless its URL sets them (seconds / milliseconds).
DEFAULT_LIBPQ_TIMEOUTS = (("connect_timeout", "5"), ("tcp_user_timeout", "5000"))


class PostgresBackend(ServiceStore):
    """Leases in a PostgreSQL table, shared by every process that can reach the database.

    ``conn_or_pool`` is a psycopg2 connection or a ``psycopg2.pool`` pool. Statements run in
    autocommit mode: the backend switches a borrowed connection to autocommit for each
    statement and restores the caller's setting afterwards, and refuses a connection that is
    inside a transaction (``ValidationError``), because a lock taken inside a transaction would
    vanish with its rollback. With a single connection, threads take turns on it; with a pool,
    up to ``maxconn`` statements run at once. The statements of the lock cycle, the heartbeat
    and the reads are server-side prepared statements (``lease_lock_...``), made on each
    session by its first such call and made again if the session drops them (``DISCARD
    ALL``); an unqualified table is the one the session's ``search_path`` named then.

    A connection found broken (a restart, a failover, a killed session) is closed and never
    lent again, and the statement is tried again on a fresh connection of the pool: every
    statement may be repeated safely (see :meth:`release` for how a repeated release reads
    its answer). When the server cannot be reached, or the fresh connection fails too,
    :class:`~lease_lock.errors.BackendUnavailableError` is raised from the driver's error;
    errors of the statement itself (permissions, a cancelled query, ...) pass through as
    psycopg2 raised them. A single connection cannot be replaced. A pool built by
    :meth:`from_url` is safe across ``fork()``: the child closes its copies of the parent's
    connections without touching the parent's sessions and opens its own.

    The table (default ``lease_lock``; ``schema.table`` or ``schema=`` to qualify it) holds one
    row per key: ``key`` (stored as given, prefix included), ``token``, ``expires_at``,
    ``fence`` and ``owner``; a counting key (``limit`` > 1) has its row there too, with the
    token ``#<limit>``, and one row per holder in ``<table>_place`` (see the docs). A fence is
    the largest of the server clock in microseconds, the next value of the sequence
    ``<table>_fence`` and the key's previous fence plus one, taken in the grant's own
    statement, so fences keep rising when the sequence is restarted or dropped (a dropped one
    is recreated by the next grant). A role with UPDATE on the sequence also moves it up to
    each clock-based fence, so fences keep rising even if the server clock is later stepped
    back. Counters live in
    ``<table>_count``; releases are announced on the NOTIFY channel ``<table>_freed`` with the
    key as payload. With ``create_table=True`` the first write creates what is missing; with
    ``False`` it only checks, and a failed check is repeated on the next call. Reads
    (``inspect``, ``is_held``, ``scan``) never create anything: on a missing table they raise
    ``ValidationError`` saying so.
    ``synchronous_commit=False`` commits each write without waiting for its WAL flush (see the
    docs for what a server crash then loses). ``direct_handoff=True`` makes a release hand the
    key straight to the oldest thread waiting in line (the table ``<table>_queue``): a faster and
    fairer hand-off of a contended key, for a gate taken by every release, which costs an
    uncontended cycle 8 to 14% of its rate where it was measured. ``pool`` and ``connection`` are what the backend
    uses (one of them is ``None``); ``names`` has the quoted names of every object.
    """

    capabilities: ClassVar[Capabilities] = Capabilities(
        server_clock=True,
        fencing=True,
        release_notify=True,
        scan=True,
        batch_extend=True,
        counting=True,
        replica_wait=False,
        min_ttl=0.0,
        clock="the PostgreSQL server's clock_timestamp()",
        wake="LISTEN/NOTIFY wake-one; a direct line in the store with direct_handoff=True",
    )
    url_options: ClassVar[dict[str, Callable[[str], Any]]] = {
        "table": str,
        "schema": str,
        "create_table": parse_bool,
        "synchronous_commit": parse_bool,
        "direct_handoff": parse_bool,
        "max_connections": _parse_positive_int,
    }

    def __init__(
        self,
        conn_or_pool: Any,
        *,
        table: str = "lease_lock",
        create_table: bool = True,
        schema: Optional[str] = None,
        synchronous_commit: bool = True,
        direct_handoff: bool = False,
    ) -> None:
        self.names: Names = resolve_names(table, schema)
        self.create_table = check_bool(create_table, "create_table")
        #: Whether a release hands the key straight to the oldest waiter in line (see
        #: join_line); off, waiters are woken through LISTEN/NOTIFY and take the key themselves.
        self.direct_handoff = check_bool(direct_handoff, "direct_handoff")
        check_bool(synchronous_commit, "synchronous_commit")
        self._source = ConnectionSource(conn_or_pool)
        self.pool: Any = self._source.pool
        self.connection: Any = self._source.connection
        self._owns_pool = False
        self._listen_dsn: Optional[str] = None
        self._tables_ready = False
        self._table_seen = False
        self._counters_ready = False
        #: What keeps ``<table>_place`` from being used (``None``: not checked yet; empty: it
        #: can be): counting keys need it, and a table made by an older release's DDL lacks it.
        self._place_problems: Optional[list[str]] = None
        self._watchers: list[PostgresReleaseWatcher] = []
        #: Whether the line of waiters can be used (``None``: not checked yet; see
        #: _line_usable), the threads waiting in it and their listening connections.
        self._lines_ok: Optional[bool] = None
        #: Keys whose latest release here found somebody in line (see _hand_on_in_line).
        self._queued: set[str] = set()
        self._line_slots = LineSlots()
        #: The shared watcher of the waiters beyond the line (see join_line).
        self._announcements = Announcements(self)
        #: The end of the call budget each thread is in (see call_budget).
        self._budget = CallBudget(CALL_MARGIN)
        #: How many call_budget blocks are open, on every thread: while none is, a statement
        #: has no budget and skips reading the thread-local deadline, a costly read between
        #: two commits.
        self._budgets_open = 0
        self._budgets_lock = threading.Lock()
        self._listening = ListeningConnections(
            self._listen_parameters, lambda: self._listen_dsn, self.names.label, self._budget
        )
        self._sql = _statements(self.names, "" if synchronous_commit else _ASYNC_COMMIT)

    @classmethod
    def from_url(cls, url: str, **options: Any) -> PostgresBackend:
        """``postgresql://user:password@host:port/dbname?table=...``: a pool this backend owns.

        The query string may carry this backend's options (``table``, ``schema``,
        ``create_table``, ``synchronous_commit``, ``direct_handoff``, ``max_connections``,
        default 10) next to libpq's own parameters (``sslmode``, ``application_name``, ...), which go to libpq.
        """
        parts = urllib.parse.urlsplit(url)
        pairs = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
        ours = [(name, value) for name, value in pairs if name in cls.url_options]
        libpq = [(name, value) for name, value in pairs if name not in cls.url_options]
        # libpq waits for ever on a dead network by default, and the heartbeat makes its calls
        # on its own thread: bound both the connect and unacknowledged writes unless the URL
        # says otherwise.
        given = {name for name, _ in libpq}
        libpq += [(name, value) for name, value in DEFAULT_LIBPQ_TIMEOUTS if name not in given]
        settings = parse_url_options(
            "?" + urllib.parse.urlencode(ours), cls.url_options, options, backend="postgresql"
        )
        # Rebuilt by hand: urlunsplit() drops the "//" of a URL without a host part
        # ("postgresql:///db?host=/run/postgresql"), which libpq then rejects.
        dsn = url.split("?", 1)[0].split("#", 1)[0]
        if libpq:
            dsn += "?" + urllib.parse.urlencode(libpq)
        max_connections = settings.pop("max_connections", 10)
        if isinstance(max_connections, bool) or not isinstance(max_connections, int) or max_connections < 1:
            raise ValidationError("max_connections must be an int of at least 1")
        # Every argument is checked before the first connection is opened.
        resolve_names(settings.get("table", "lease_lock"), settings.get("schema"))
        for flag in ("create_table", "synchronous_commit", "direct_handoff"):
            if flag in settings:
                check_bool(settings[flag], flag)
        check_dsn(dsn)
        try:
            parts.port  # noqa: B018 -- libpq parses ports only when connecting
        except ValueError as exc:
            raise ValidationError(f"invalid PostgreSQL DSN: {exc}") from exc
        pool = LazyPool(max_connections, dsn)
        # Connect once now: an unreachable server (BackendUnavailableError) or a refused login
        # (the driver's own error) fails here rather than on the first lock.
        try:
            pool.putconn(pool.getconn())
        except psycopg2.Error as exc:
            if is_connect_failure(exc):
                label = settings.get("table", "lease_lock")
                raise unavailable(exc, dsn, str(label)) from exc
            raise
        try:
            backend = cls(pool, **settings)
        except BaseException:
            pool.closeall()
            raise
        backend._owns_pool = True
        backend._listen_dsn = dsn
        return backend

    # -- plumbing ------------------------------------------------------------------------------

    def _run(
        self,
        statement: _Statement,
        parameters: dict[str, Any],
        *,
        counters: bool = False,
        write: bool = True,
        within: Optional[float] = None,
    ) -> tuple[int, list[Any], bool]:
        """Run one statement on a borrowed connection and return its cursor's results.

        Returns ``(rowcount, rows, retried)``; rows are fetched only when the statement returns
        any. ``retried`` is ``True`` when an earlier try broke after the statement may have
        reached the server, so its outcome is unknown (every statement here may be repeated:
        a grant by the same token keeps its fence, an extension sets the same deadline, a
        release or read finds the truth; only a release must read its answer in that light).

        A connection found broken is closed and never lent again, and the statement is tried
        on a fresh one (see :attr:`ConnectionSource.attempts`); when that fails too, or no
        connection can be opened, :class:`~lease_lock.errors.BackendUnavailableError` is
        raised from the driver's error. A missing table or fence sequence is checked again
        (and, for a write with ``create_table``, created) once before the error is reported.

        A prepared statement is prepared in the same query as its first run on each session
        (a fresh connection, or one whose session reported it missing: that EXECUTE ran
        nothing, so it is simply tried again).

        ``within`` bounds the statement's wait for its answer to that many seconds (tries on
        a fresh connection included): a statement still unanswered then is cut off (see
        :func:`._connections.arm_bound`) and ``BackendUnavailableError`` is raised, its
        outcome unknown. Inside :meth:`call_budget` the budget bounds it too, and a connection
        opened for it. Without either, a server that has gone silent is waited for as long as
        the connection's own settings allow.
        """
        # The usual statement, decided inline: the caller's single connection, idle in
        # autocommit, its tables checked and the statement prepared on its session, no bound.
        # Between two commits every step costs several times its hot-loop price, and this path
        # takes none of the general one's (borrowing, bounds, the first-use checks), which
        # handles everything else, and also the tries after a failure here.
        lone = self._source.lone
        tries = None
        if (
            lone is not None
            and within is None
            and ((self._tables_ready and (not counters or self._counters_ready)) or (not write and self._table_seen))
            and (not self._budgets_open or self._budget.deadline is None)
        ):
            lock, conn, cursor = lone
            lock.acquire()
            try:
                if (
                    not conn.closed
                    and conn.autocommit
                    and conn.get_transaction_status() == _IDLE
                    and (not statement.name or statement.name in cursor.prepared)
                ):
                    cursor.execute(statement.sql, parameters)
                    return cursor.rowcount, cursor.fetchall() if cursor.description is not None else [], False
            except psycopg2.Error as exc:
                tries = _Tries()
                if not self._try_again(exc, conn, False, tries):
                    raise
            finally:
                lock.release()
        return self._run_tries(statement, parameters, counters, write, within, tries or _Tries())

    def _run_tries(
        self,
        statement: _Statement,
        parameters: dict[str, Any],
        counters: bool,
        write: bool,
        within: Optional[float],
        tries: _Tries,
    ) -> tuple[int, list[Any], bool]:
        """:meth:`_run` on any connection, after the ``tries`` made so far."""
        until = self._budget.deadline if within is None else self._until(within)
        source = self._source
        while True:
            try:
                conn, switched = source.take(until)
            except psycopg2.Error as exc:
                if is_connect_failure(exc):
                    raise unavailable(exc, self._listen_dsn, self.names.label) from exc
                raise
            bound = None
            cut = False
            try:
                try:
                    if until is not None:
                        bound = arm_bound(conn, max(until - time.monotonic(), 0.0))
                    if not self._tables_ready or (counters and not self._counters_ready):
                        self._ensure_ready(conn, counters=counters, write=write)
                    kept = source.cursors.get(conn)
                    cursor = kept if kept is not None else source.cursor(conn)
                    if statement.name and statement.name not in cursor.prepared:
                        cursor.execute(statement.prepare_then_sql, parameters)
                        cursor.prepared.add(statement.name)
                    else:
                        cursor.execute(statement.sql, parameters)
                    rows = cursor.fetchall() if cursor.description is not None else []
                finally:
                    cut = bound is not None and end_bound(bound)
                if cut:
                    source.discard(conn)  # answered just in time, but its socket is shut
                return cursor.rowcount, rows, tries.retried
            except psycopg2.Error as exc:
                if not self._try_again(exc, conn, cut, tries):
                    raise
            finally:
                source.give_back(conn, switched)

    def _try_again(self, exc: psycopg2.Error, conn: Any, cut: bool, tries: _Tries) -> bool:
        """Whether a statement whose try on ``conn`` raised ``exc`` is to be tried again (after
        ``tries``, which this updates); ``False``: the caller raises ``exc`` as it is. Raises
        ``BackendUnavailableError`` from ``exc`` when the server is out of reach (see :meth:`_run`)."""
        if isinstance(exc, psycopg2.errors.InvalidSqlStatementName):
            # The session lost what it had prepared (DISCARD ALL or DEALLOCATE by the
            # connection's owner, or a pooler that moved the connection to another server
            # session). Nothing ran: the next try prepares again, in the same query.
            if tries.reprepared:
                return False
            tries.reprepared = True
            self._source.cursors[conn].prepared.clear()
            return True
        if isinstance(exc, psycopg2.errors.UndefinedTable):
            # Dropped under a running backend (the table, or only its fence sequence):
            # forget what was checked and look again once, which recreates it for a write
            # with create_table=True and otherwise names what is missing.
            if tries.rechecked:
                return False
            tries.rechecked = True
            self._tables_ready = self._table_seen = self._counters_ready = False
            return True
        if not isinstance(exc, (psycopg2.OperationalError, psycopg2.InterfaceError)):
            return False
        if not (cut or is_connection_failure(exc, conn)):
            return False
        self._source.discard(conn)
        tries.failures += 1
        if cut or tries.failures >= self._source.attempts:
            raise unavailable(exc, self._listen_dsn, self.names.label) from exc
        tries.retried = True
        return True

    def _until(self, within: float) -> float:
        """When a statement given ``within`` seconds must be answered by, inside the thread's
        call budget."""
        until = time.monotonic() + within
        budget = self._budget.deadline
        return until if budget is None else min(until, budget)

    def call_budget(self, seconds: float) -> ContextManager[None]:
        """Bound the statements this thread runs inside the block (see
        :meth:`Backend.call_budget`): one still unanswered
        :data:`~lease_lock.backends.base.CALL_MARGIN` past the budget is cut off (its
        connection is shut down and closed) and raises ``BackendUnavailableError``, and a
        connection opened for one waits for the server no longer than the budget allows
        (libpq's least ``connect_timeout``, 2 s, at the least).
        A connection of a caller's own pool is opened as that pool says."""
        return self._counted(self._budget.block(seconds))

    @contextlib.contextmanager
    def _counted(self, block: ContextManager[None]) -> Iterator[None]:
        """``block``, counted in :attr:`_budgets_open` while it is open."""
        with self._budgets_lock:
            self._budgets_open += 1
        try:
            with block:
                yield
        finally:
            with self._budgets_lock:
                self._budgets_open -= 1

    def _ensure_ready(self, conn: Any, *, counters: bool, write: bool = True) -> None:
        # Called by _run only while something is left to check.
        if not write:
            # Reading never writes: a read checks that the lock table exists and can be read,
            # and creates nothing (a mistyped table name must say so, not read as "free").
            if self._table_seen:
                return
            with self._source.ready_lock, conn.cursor(cursor_factory=_PLAIN_CURSOR) as cursor:
                problems = _table_problems(
                    cursor, self.names.table, ("key",), _LOCK_COLUMNS, ("SELECT",)
                )
                places = self._places_usable(cursor, ("SELECT",))
            if problems == [f"table {self.names.table} does not exist"]:
                raise ValidationError(
                    f"PostgreSQL lock table {self.names.label!r}: table {self.names.table} does "
                    "not exist (reading never creates it); check the table= and schema= "
                    "options, or take a lock first, which creates it with create_table=true"
                )
            _raise_problems(self.names, problems)
            self._place_problems = places
            self._table_seen = True
            return
        with self._source.ready_lock, conn.cursor(cursor_factory=_PLAIN_CURSOR) as cursor:
            if self.create_table and not self._tables_ready:
                # One implicit transaction under an advisory lock: processes starting together
                # would otherwise race on CREATE ... IF NOT EXISTS and fail on the catalog.
                statements = [f"SELECT pg_advisory_xact_lock({self.names.gate}, 0)"]
                cursor.execute(";\n".join(statements + _ddl_for(self.names)))
            if not self._tables_ready:
                problems = _table_problems(
                    cursor, self.names.table, ("key",), _LOCK_COLUMNS, _LOCK_PRIVILEGES
                ) + _sequence_problems(cursor, self.names)
                _raise_problems(self.names, problems)
                self._lines_ok = self._line_usable(cursor)
                self._place_problems = self._places_usable(cursor, _LOCK_PRIVILEGES)
                self._tables_ready = True
            if counters and not self._counters_ready:
                problems = _table_problems(
                    cursor, self.names.counters, ("name",), _COUNTER_COLUMNS, _COUNTER_PRIVILEGES
                )
                _raise_problems(self.names, problems)
                self._counters_ready = True

    def _line_usable(self, cursor: Any) -> bool:
        """Whether the line of waiters can be used: only with ``direct_handoff``; then a lock
        table made by an older release's DDL, without ``<table>_queue``, keeps working with the
        hand-off through the watcher, and says once (at info level) what the direct hand-off
        lacks."""
        if not self.direct_handoff:
            return False
        problems = _table_problems(cursor, self.names.queue, ("key", "token"), _QUEUE_COLUMNS, _LOCK_PRIVILEGES)
        if problems and self._lines_ok is not False:
            _log.info(
                "PostgreSQL lock table %r: no direct hand-off to waiters in line (%s); waiters are "
                "woken through LISTEN/NOTIFY instead. Run lease_lock.backends.postgres.ddl() again "
                "and grant the role SELECT, INSERT, UPDATE, DELETE on %s to turn it on",
                self.names.label, "; ".join(problems), self.names.queue,
            )
        return not problems

    def _places_usable(self, cursor: Any, privileges: Sequence[str]) -> list[str]:
        """What keeps the places of counting keys from being used with ``privileges`` (nothing
        when they can be): a lock table made by an older release's DDL, without
        ``<table>_place``, keeps serving exclusive keys, and only a counting grant says what it
        lacks."""
        return _table_problems(cursor, self.names.places, ("key", "token"), _LOCK_COLUMNS, privileges)

    def _check_ready(self) -> None:
        """Run the first-write checks (and creation) now, so that the statement chosen next
        knows whether the line can be used."""
        self._run(_statement("", "", "SELECT 1"), {})

    # -- primitives ----------------------------------------------------------------------------

    def acquire(self, key: str, token: str, ttl: float, owner: str) -> bool:
        """Grant ``key`` to ``token`` for ``ttl`` seconds if free, expired or already ours."""
        count, _, _ = self._run(
            self._sql["acquire"], {"key": key, "token": token, "ttl": float(ttl), "owner": owner}
        )
        return bool(count)

    def acquire_fenced(self, key: str, token: str, ttl: float, owner: str) -> Optional[int]:
        """Like :meth:`acquire` and return the grant's fence (``None`` on contention)."""
        # One literal rather than a shared helper's dict and an update: between two commits
        # every extra step costs several times its hot-loop price.
        parameters = {
            "key": key, "token": token, "ttl": float(ttl), "owner": owner,
            "gate": self.names.gate, "slot": _key_slot(key),
        }
        _, rows, _ = self._run(self._sql["acquire_fenced"], parameters)
        return int(rows[0][0]) if rows else None

    def adopt(self, key: str, claim_token: str, token: str, ttl: float, owner: str) -> Optional[int]:
        """Replace the claim ``claim_token`` on ``key`` (or a free key) with a new fenced grant,
        in one statement (under the key's advisory lock, like every fenced grant)."""
        parameters = {
            "key": key, "token": token, "ttl": float(ttl), "owner": owner,
            "gate": self.names.gate, "slot": _key_slot(key), "claim": claim_token,
        }
        _, rows, _ = self._run(self._sql["adopt"], parameters)
        return int(rows[0][0]) if rows else None

    def acquire_counted(self, key: str, token: str, ttl: float, owner: str, limit: int) -> Optional[int]:
        """Grant or renew one of the ``limit`` places of ``key`` for ``token`` and return its
        fence (``None`` when every place is taken), in one transaction under the key's
        advisory lock (see :meth:`Backend.acquire_counted` and the docs' layout of counting
        keys)."""
        if self._place_problems != []:
            # Not checked yet, or found unusable: look (again, creating what is missing with
            # create_table), so that a table upgraded since is used.
            self._tables_ready = self._table_seen = False
            self._check_ready()
            if self._place_problems:
                _raise_problems(self.names, self._place_problems)
        parameters = {
            "key": key, "token": token, "ttl": float(ttl), "owner": owner, "limit": limit,
            "marker": _marker(limit), "gate": self.names.gate, "slot": _key_slot(key),
        }
        _, rows, _ = self._run(self._sql["acquire_counted"], parameters)
        fence, held = rows[0]
        if held is not None:
            raise limit_mismatch(key, limit, int(held))
        return None if fence is None else int(fence)

    def release(self, key: str, token: str) -> bool:
        """Give ``key`` up if ``token`` holds it: hand it to the oldest fresh waiter in the key's
        line (see :meth:`join_line`), or else delete it and announce the release to listeners.

        When a first try broke with its outcome unknown and the retry no longer finds the
        token on the key, the answer is ``True`` (released): the first try may well have
        deleted the row (and a waiter may already hold the key again), and nothing left in the
        table can tell that from a loss. Reporting a loss there would be wrong whenever the
        first try did commit, which is the usual case when a reply is lost on its way back.
        The answer can hide a loss only when the lease ran out or was force-released during
        that one failing call.
        """
        parameters = {"key": key, "token": token, "channel": self.names.channel}
        if self.direct_handoff:
            if not self._tables_ready:
                self._check_ready()
            rows, retried = self._hand_on("release", parameters)
        else:
            # Without direct_handoff the line is never used: the plain release, one call less.
            _, rows, retried = self._run(self._sql["release"], parameters)
        if not rows and self._place_problems == []:
            # Not the key's holder: perhaps a holder of one of its places.
            _, rows, again = self._run(
                self._sql["release_place"],
                {**parameters, "gate": self.names.gate, "slot": _key_slot(key)},
            )
            retried = retried or again
        if not rows:
            return retried
        return bool(rows[0][0])

    def extend(self, key: str, token: str, ttl: float) -> bool:
        """Set ``key``'s lease to ``ttl`` seconds from now if ``token`` holds a live lease."""
        count, _, _ = self._run(self._sql["extend"], {"key": key, "token": token, "ttl": ttl})
        if count or self._place_problems != []:
            return bool(count)
        return self._extend_places([ExtendRequest(key, token, ttl)]) == {(key, token)}

    def extend_many(self, requests: Sequence[ExtendRequest]) -> list[bool]:
        """Extend every request's lease in one statement; one answer per request, in order."""
        if not requests:
            return []
        _, rows, _ = self._run(
            self._sql["extend_many"],
            {
                "keys": [item.key for item in requests],
                "tokens": [item.token for item in requests],
                "ttls": [float(item.ttl) for item in requests],
            },
        )
        extended = {(key, token) for key, token in rows}
        if len(extended) < len(requests) and self._place_problems == []:
            extended |= self._extend_places([item for item in requests if (item.key, item.token) not in extended])
        return [(item.key, item.token) in extended for item in requests]

    def _extend_places(self, requests: Sequence[ExtendRequest]) -> set[tuple[str, str]]:
        """Extend the places the requests name, in one transaction under the advisory locks of
        their keys (taken in one order, so two batches never wait for each other); the
        ``(key, token)`` of each place extended."""
        _, rows, _ = self._run(
            self._sql["extend_places"],
            {
                "gate": self.names.gate,
                "slots": sorted({_key_slot(item.key) for item in requests}),
                "keys": [item.key for item in requests],
                "tokens": [item.token for item in requests],
                "ttls": [float(item.ttl) for item in requests],
            },
        )
        return {(key, token) for key, token in rows}

    def is_held(self, key: str, token: str) -> bool:
        """``True`` if ``token`` holds a live lease on ``key``."""
        _, rows, _ = self._run(self._sql["is_held"], {"key": key, "token": token}, write=False)
        if not rows and self._place_problems == []:
            _, rows, _ = self._run(self._sql["is_held_place"], {"key": key, "token": token}, write=False)
        return bool(rows)

    def inspect(self, key: str) -> LockState:
        """The state of ``key``; ``expires_in`` is measured on the server."""
        _, rows, _ = self._run(self._sql["inspect"], {"key": key}, write=False)
        return self._states(rows, write=False)[0] if rows else LockState.free(key)

    def grant_if_free(self, key: str, token: str, ttl: float, owner: str) -> Union[int, LockState]:
        """Read, then grant a free key: two statements, the read creating the table as a grant
        would (with ``create_table``), so a fresh database serves its first acquisition."""
        _, rows, _ = self._run(self._sql["inspect"], {"key": key}, write=True)
        state = self._states(rows, write=True)[0] if rows else LockState.free(key)
        if state.held:
            return state
        fence = self.acquire_fenced(key, token, ttl, owner)
        return fence if fence is not None else self.inspect(key)

    def force_release(self, key: str) -> bool:
        """Take ``key`` from whoever holds it (handing it to the oldest fresh waiter in line, as
        :meth:`release` does); ``True`` when the lease taken was live."""
        if self.direct_handoff and not self._tables_ready:
            self._check_ready()
        rows, _ = self._hand_on("force_release", {"key": key, "channel": self.names.channel})
        return bool(rows) and bool(rows[0][0])

    def _hand_on(self, kind: str, parameters: dict[str, Any]) -> tuple[list[Any], bool]:
        """Run the release ``kind`` (``release`` or ``force_release``): the one that hands the
        key to the next waiter in line when the line can be used, else the plain one. Returns
        its rows and whether its outcome was unknown at a first try (see :meth:`_run`)."""
        if self._lines_ok:
            key = parameters["key"]
            handing = dict(parameters, gate=self.names.gate, slot=_key_slot(key), burst=BURST)
            try:
                return self._hand_on_in_line(kind, key, handing)
            except psycopg2.errors.UndefinedTable:
                # The line was dropped under a backend that may not create it again: the
                # recheck turned the line off, and the plain release still works.
                if self._lines_ok:
                    raise
        _, rows, retried = self._run(self._sql[kind], parameters)
        return rows, retried

    def _hand_on_in_line(self, kind: str, key: str, parameters: dict[str, Any]) -> tuple[list[Any], bool]:
        """:meth:`_hand_on` with the line. A release of a key nobody waited in line for at its
        previous release here first sends the lean ``release_unqueued``, which costs little
        more than the plain release and does nothing when it finds a place in line; only then
        is the statement that hands the key on sent (one round trip more, once per busy spell
        of the key). Keys found with a waiter go straight to that statement until a release
        finds their line empty again."""
        queued = self._queued
        retried = False
        if kind == "release" and key not in queued:
            _, rows, retried = self._run(self._sql["release_unqueued"], parameters)
            if not rows or not rows[0][2]:
                return rows, retried
            if len(queued) >= _QUEUED_KEYS:
                queued.clear()  # a bound, not a cache policy: forgetting costs one round trip
            queued.add(key)
        _, rows, again = self._run(self._sql[kind + "_handing"], parameters)
        if kind == "release" and rows and not rows[0][2]:
            # Nobody is in line (not merely kept out by a burst): the lean statement serves the
            # next release.
            queued.discard(key)
        return rows, retried or again

    def scan(self, prefix: str) -> Iterator[LockState]:
        """Live leases whose key starts with ``prefix``, in key order."""
        _, rows, _ = self._run(self._sql["scan"], {"prefix": prefix}, write=False)
        return iter([state for state in self._states(rows, write=False) if state.held])

    def _states(self, rows: Sequence[Sequence[Any]], *, write: bool) -> list[LockState]:
        """The states of the rows ``inspect`` or ``scan`` read, in their order: a counting key's
        row (its last column true) becomes the state of its live places, read by one more
        statement for all of them (a key whose places are gone by then is free)."""
        counted = [row[0] for row in rows if row[5]]
        if not counted:
            return [_state(row) for row in rows]
        _, read, _ = self._run(self._sql["holders"], {"keys": counted}, write=write)
        limits: dict[str, int] = {}
        holders: dict[str, list[Holder]] = {key: [] for key in counted}
        exclusive: dict[str, LockState] = {}
        for key, limit, expires_at, fence, owner, expires_in in read:
            if limit == 1:  # no longer a counting key: held by an exclusive grant since
                exclusive[key] = _state((key, expires_at, fence, owner, expires_in))
                continue
            limits[key] = limit
            holders[key].append(
                Holder(owner, int(fence), expires_at.astimezone(timezone.utc), float(expires_in))
            )
        return [
            _state(row) if not row[5] else exclusive.get(row[0])
            or LockState.counting(row[0], limits.get(row[0], 1), holders[row[0]])
            for row in rows
        ]

    def sweep_expired(self) -> int:
        """Delete the rows of leases that ran out and return how many there were.

        Expired rows never block a grant; sweeping only keeps the table small. Places in
        line gone stale (their waiter died or left without saying so) are deleted too, and not
        counted.
        """
        count, _, _ = self._run(self._sql["sweep_line" if self._lines_ok else "sweep"], {})
        if self._place_problems == []:
            self._run(self._sql["sweep_places"], {})
        return int(count)

    def count_in_window(self, name: str, window: float, amount: int = 1) -> tuple[int, float]:
        """Add ``amount`` to ``name`` in the current ``window``-second window (server clock)."""
        check_amount(amount)
        _, rows, _ = self._run(
            self._sql["count"], {"name": name, "window": float(window), "amount": amount}, counters=True
        )
        count, remaining = rows[0]
        return int(count), max(0.0, float(remaining))

    def _listen_parameters(self, within: Optional[float] = None) -> dict[str, str]:
        """How a watcher or a waiter in line opens its own connection; ``within`` bounds the
        statement this runs (see :meth:`_run`)."""
        # The table must exist before anyone waits on it; this also fails fast on a bad setup.
        self._run(_statement("", "", "SELECT 1"), {}, within=within)
        if self._listen_dsn is not None:
            return {"dsn": self._listen_dsn}
        try:
            return dict(self._source.parameters())
        except (psycopg2.OperationalError, psycopg2.InterfaceError) as exc:
            raise unavailable(exc, None, self.names.label) from exc

    def watch_releases(self, callback: Callable[[str], None]) -> ReleaseWatcher:
        """Listen for releases on a dedicated connection; ``callback(key)`` runs on its thread."""
        watcher = PostgresReleaseWatcher(self._listen_parameters(), self.names.channel, callback)
        self._watchers.append(watcher)
        return watcher

    @property
    def handoff_ready(self) -> bool:
        """Always: see :meth:`watch_handoffs`."""
        return True

    def watch_handoffs(self, callback: Callable[[str], bool]) -> HandoffWatcher:
        """Wake one waiting process per release (see :mod:`lease_lock.backends.handoff`).

        Listens like :meth:`watch_releases`; of the processes waiting for a key, only the one
        holding the key's turn (a session advisory lock of the listening connection) reacts.
        """
        parameters = self._listen_parameters()
        watcher = PostgresHandoffWatcher(
            parameters, self.names.channel, callback, self.names.label,
            self._lease_left, self.names.turns_channel, self.names.woken_channel,
        )
        self._watchers.append(watcher)
        return watcher

    def _lease_left(self, key: str) -> float:
        """Seconds until ``key`` may be had, ``0.0`` when it is free or a counting key with a
        place free: a process that starts listening for the key reads it, so that a release
        it could not hear yet (a place's included) is not missed."""
        state = self.inspect(key)
        if len(state.holders) < state.limit:
            return 0.0
        return min(holder.expires_in or 0.0 for holder in state.holders)

    def join_line(
        self, key: str, token: str, ttl: float, owner: str, fenced: bool, clock: Callable[[], float],
        limit: int = 1,
    ) -> Optional[WaitingLine]:
        """A waiting line for ``key`` (see :meth:`Backend.join_line`).

        A direct line where it can be had (see :mod:`._line`): a release hands the key straight
        to the oldest fresh waiter in ``<table>_queue``, which is blocked on a listening
        connection of its own. At most :data:`~lease_lock.backends.line.LINE_WAITERS` threads
        of one backend wait this way at once, and none before the first write checked the
        tables, when the line's table cannot be used (see :meth:`_line_usable`), or once the
        backend is closed. Other waiters, and every waiter for a place of a counting key
        (``limit`` > 1), are woken by the backend's shared wake-one watcher (see
        :class:`~lease_lock.backends.line.AnnouncedLine`).
        """
        if limit > 1 or not self._lines_ok or self._listening.closed or not self._line_slots.take():
            return AnnouncedLine(self._announcements, self, key, token, ttl, owner, fenced, clock, limit)
        claim = claim_for(ttl)
        gate, slot = self.names.gate, _key_slot(key)
        joining = {
            "key": key, "token": token, "ttl": float(ttl), "owner": owner, "gate": gate, "slot": slot,
            "claim_window": claim, "fenced": fenced, "fresh_for": claim * FRESH_SHARE, "listen": "", "ticket": "",
        }
        statement = self._sql["join_fenced" if fenced else "join"]
        leaving = {
            "key": key, "token": token, "channel": self.names.channel, "gate": gate, "slot": slot, "burst": BURST,
        }

        def join(listen: str, ticket: str, within: float) -> Joined:
            joining["listen"], joining["ticket"] = listen, ticket
            _, rows, _ = self._run(statement, joining, within=within)
            granted, fence, burst_left = rows[0]
            if not granted:
                return Joined(None, None if burst_left is None else float(burst_left))
            return Joined(0 if fence is None else int(fence))

        def leave(conn: Optional[Any], within: float) -> None:
            # On the waiter's own listening connection when it has one: leaving must work when
            # the pool cannot lend one (closed with its Locker while the thread was in line, or
            # every connection busy), or the place would linger, fresh, and be handed the key.
            if conn is None:
                self._run(self._sql["leave_line"], leaving, within=within)
                return
            bound = arm_bound(conn, within)
            try:
                with conn.cursor() as cursor:
                    cursor.execute(self._sql["leave_line"].sql, leaving)
            finally:
                end_bound(bound)

        line = PostgresWaitingLine(
            join=join, leave=leave, connections=self._listening, dsn=self._listen_dsn, label=self.names.label,
            ttl=ttl, claim=claim, clock=clock, slots=self._line_slots,
        )
        line.watch_lease(lambda: self.inspect(key).expires_in)
        return line

    def close(self) -> None:
        """Stop the watchers this backend started, close the listening connections of its
        line, and close the pool it opened itself."""
        self._announcements.close()
        self._listening.close()
        watchers, self._watchers = self._watchers, []
        for watcher in watchers:
            watcher.close()
        if self._owns_pool and not self.pool.closed:
            self.pool.closeall()

    def __repr__(self) -> str:
        source = "pool" if self.pool is not None else "connection"
        return f"<PostgresBackend table={self.names.label!r} via {source}>"


def _ddl_for(names: Names) -> list[str]:
    """The DDL of already-resolved names (the backend creates with plain logged tables)."""
    schema, _, table = names.label.rpartition(".")
    return ddl(table, schema=schema or None)


@functools.lru_cache(maxsize=4096)
def _key_slot(key: str) -> int:
    """The second half of a key's advisory lock: a stable 32-bit signed hash of the key.

    Cached: a process takes the same keys again and again, and a fresh BLAKE2 hash costs
    about 8 us of CPU between two commits, where a cache hit costs about 1 us.
    """
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=4).digest()
    return int.from_bytes(digest, "big", signed=True)


def _marker(limit: int) -> str:
    """The token of a counting key's own row: ``#`` and the key's limit. No caller's token
    starts with ``#``, so every exclusive grant finds such a row held."""
    return f"#{limit}"


def _state(row: Sequence[Any]) -> LockState:
    key, expires_at, fence, owner, expires_in = row[:5]
    return LockState(
        key=key,
        held=True,
        expires_at=expires_at.astimezone(timezone.utc),
        fence=None if fence is None else int(fence),
        owner=owner,
        expires_in=float(expires_in),
    )


def _table_problems(
    cursor: Any, table: str, unique: Sequence[str], columns: Sequence[str], privileges: Sequence[str]
) -> list[str]:
    cursor.execute(
        _TABLE_CHECK, {"table": table, "unique": list(unique), "privileges": list(privileges)}
    )
    exists, present, indexed, missing_privileges = cursor.fetchone()
    if not exists:
        return [f"table {table} does not exist"]
    problems = []
    missing = [name for name in columns if name not in present]
    if missing:
        problems.append(f"table {table} lacks the column(s) {', '.join(missing)}")
    elif not indexed:
        on = unique[0] + " alone" if len(unique) == 1 else "(" + ", ".join(unique) + ") together"
        problems.append(
            f"table {table} has no primary key or unique index on {on} "
            "(INSERT ... ON CONFLICT needs one)"
        )
    if missing_privileges:
        problems.append(
            f"the current role lacks {', '.join(missing_privileges)} on table {table}"
        )
    return problems


def _sequence_problems(cursor: Any, names: Names) -> list[str]:
    cursor.execute(_SEQUENCE_CHECK, {"sequence": names.sequence})
    is_sequence, usable = cursor.fetchone()
    if not is_sequence:
        return [f"the fence sequence {names.sequence} does not exist"]
    if not usable:
        return [f"the current role lacks USAGE on the fence sequence {names.sequence}"]
    return []


def _raise_problems(names: Names, problems: list[str]) -> None:
    if problems:
        raise ValidationError(
            f"PostgreSQL lock table {names.label!r} is not usable: {'; '.join(problems)}. "
            "Create it with lease_lock.backends.postgres.ddl() (or create_table=True) and "
            "grant the role SELECT, INSERT, UPDATE, DELETE on the tables and USAGE on the "
            "sequence"
        )


class _Tries:
    """What the earlier tries of one statement met (see :meth:`PostgresBackend._run`)."""

    __slots__ = ("failures", "rechecked", "reprepared", "retried")

    def __init__(self) -> None:
        #: Tries that found their connection broken.
        self.failures = 0
        #: Whether the tables were checked again after the server said one was missing.
        self.rechecked = False
        #: Whether the statement was prepared again after the session said it had lost it.
        self.reprepared = False
        #: Whether a try broke after the statement may have reached the server.
        self.retried = False


class _Statement(NamedTuple):
    """One statement as the backend sends it.

    ``text`` is the statement itself with its ``%(name)s`` parameters. A prepared statement
    (``name`` set) is sent as ``sql``, an ``EXECUTE`` of that name, and as ``prepare_then_sql``
    (a block that prepares it unless the session has it, then the same ``EXECUTE``, in one
    query and so one round trip) on a session not known to have it. Any other statement is
    sent as its text, and all three fields but ``name`` are that text.
    """

    name: str
    text: str
    sql: str
    prepare_then_sql: str


#: The statements of every lock cycle, heartbeat and read, prepared on each session that runs
#: them: the server then skips parsing and planning them on every call, which saves more time
#: per cycle (hundreds of microseconds for a fenced grant) than the client spends on it.
_PREPARED = frozenset(
    {
        "acquire", "acquire_fenced", "release", "extend", "is_held", "inspect", "join", "join_fenced",
        "release_handing", "release_unqueued", "acquire_counted", "release_place",
    }
)

#: The SQL type of each parameter of a prepared statement.
_PARAMETER_TYPES = {
    "key": "text", "token": "text", "ttl": "float8", "owner": "text", "channel": "text",
    "gate": "int4", "slot": "int4", "claim_window": "float8", "fenced": "bool", "listen": "text", "ticket": "text",
    "fresh_for": "float8", "burst": "float8", "limit": "int4", "marker": "text",
}

_PARAMETER = re.compile(r"%\((\w+)\)s")

#: Part of every prepared statement name: names of different processes never meet on one
#: server session (a pooler in transaction mode may move a session from client to client,
#: and the same text can name different tables under different search paths).
_PROCESS_TAG = secrets.token_hex(4)


def _prepared(kind: str, text: str) -> tuple[str, str, str]:
    """The name of ``text`` prepared as ``kind``, the block that prepares it unless the session
    has it, and its ``EXECUTE``."""
    order: list[str] = []
    for parameter in _PARAMETER.findall(text):
        if parameter not in order:
            order.append(parameter)
    body = _PARAMETER.sub(lambda match: f"${order.index(match[1]) + 1}", text)
    types = ", ".join(_PARAMETER_TYPES[parameter] for parameter in order)
    # The name depends on the whole text, table names included: one name, one statement.
    digest = hashlib.blake2b(f"{types}|{body}".encode(), digest_size=6).hexdigest()
    name = f"lease_lock_{_PROCESS_TAG}_{kind}_{digest}"
    prepare = f"PREPARE {name} ({types}) AS {body}".replace("'", "''")
    # A DO block, so that a session that already has the statement (another backend of this
    # process on the same connection) is not an error. No '%' anywhere in it: the driver
    # interpolates the EXECUTE's parameters into the same query.
    block = (
        "DO $lease_lock$ BEGIN IF NOT EXISTS (SELECT FROM pg_prepared_statements"
        f" WHERE name = '{name}') THEN EXECUTE '{prepare}'; END IF; END $lease_lock$;\n"
    )
    return name, block, f"EXECUTE {name}({', '.join(f'%({parameter})s' for parameter in order)})"


#: The key's gate, the transaction-scoped advisory lock of the fenced grants, taken before
#: every statement of the line. A statement's snapshot is taken when it starts, so the gate is
#: taken by a statement of its own: the statement after it reads what the gate's previous
#: holder did.
_GATE = "SELECT pg_advisory_xact_lock(%(gate)s, %(slot)s)"


def _statement(kind: str, prefix: str, text: str, *, gated: bool = False) -> _Statement:
    """The :class:`_Statement` of ``text``, run after ``prefix`` in the same query, and after
    :data:`_GATE` when ``gated``: the gate is prepared with ``text`` when ``text`` is prepared,
    so that a release that hands a key on does not parse and plan it every time."""
    gate = _GATE + ";\n" if gated else ""
    if kind not in _PREPARED:
        whole = prefix + gate + text
        return _Statement("", whole, whole, whole)
    name, block, execute = _prepared(kind, text)
    if gated:
        _, gate_block, gate_execute = _prepared("gate", _GATE)
        block, execute = gate_block + block, f"{gate_execute};\n{execute}"
    return _Statement(name, prefix + gate + text, prefix + execute, block + prefix + execute)


def _line_statements(
    names: Names, acquire: str, acquire_fenced: str, draw: Callable[[str, str], str]
) -> dict[str, str]:
    """The statements of the line of waiters (see :meth:`PostgresBackend.join_line`), each run
    after :data:`_GATE`; ``acquire`` and ``acquire_fenced`` are the grants (up to and with
    their ``RETURNING fence``), ``draw`` makes the CTE that draws a fence. Each statement is
    headed by its inputs and result."""
    t, q = names.table, names.queue
    # A waiter's attempt: grant as acquire(_fenced) does, and only when that grants nothing,
    # take a place at the end of the line or refresh the one held (a place gone stale is
    # taken afresh, at the end); a grant takes the place out.
    place = (
        f" placed AS (INSERT INTO {q} AS line"
        " (key, token, owner, claim, fenced, channel, ticket, joined, fresh_until)"
        " SELECT %(key)s, %(token)s, %(owner)s, %(claim_window)s, %(fenced)s, %(listen)s, %(ticket)s,"
        " clock_timestamp(), clock_timestamp() + %(fresh_for)s * interval '1 second'"
        " WHERE NOT EXISTS (SELECT 1 FROM granted)"
        " ON CONFLICT (key, token) DO UPDATE SET owner = EXCLUDED.owner, claim = EXCLUDED.claim,"
        " fenced = EXCLUDED.fenced, channel = EXCLUDED.channel, ticket = EXCLUDED.ticket,"
        " joined = CASE WHEN line.fresh_until > clock_timestamp() THEN line.joined ELSE EXCLUDED.joined END,"
        " fresh_until = EXCLUDED.fresh_until),"
        f" gone AS (DELETE FROM {q} WHERE key = %(key)s AND token = %(token)s"
        " AND EXISTS (SELECT 1 FROM granted))"
        # A waiter at the head of the line learns how long the holder's burst still runs (see
        # hand_on): it asks for the key itself when the burst ends, as no release hands it over
        # before then.
        " SELECT EXISTS (SELECT 1 FROM granted), (SELECT fence FROM granted),"
        " (SELECT extract(epoch FROM burst.fresh_until - clock_timestamp())::float8"
        f" FROM {q} AS burst WHERE burst.key = %(key)s AND burst.token = ''"
        " AND burst.fresh_until > clock_timestamp() AND NOT EXISTS (SELECT 1 FROM granted)"
        f" AND NOT EXISTS (SELECT 1 FROM {q} AS ahead WHERE ahead.key = %(key)s"
        " AND ahead.token <> '' AND ahead.token <> %(token)s AND ahead.fresh_until > clock_timestamp()"
        f" AND ahead.joined < COALESCE((SELECT me.joined FROM {q} AS me WHERE me.key = %(key)s"
        " AND me.token = %(token)s AND me.fresh_until > clock_timestamp()), clock_timestamp())))"
    )
    def hand_on(lease_rows: str, line_rows: str, extra: str = "", *, burst: bool = True) -> str:
        """A release that hands the key to the oldest fresh waiter in line, else deletes it.

        ``lease_rows`` picks the lease row released, ``line_rows`` the places it may hand the
        key to; ``extra`` is one more CTE. The key goes to the waiter's token for its claim
        window, with a new fence (larger than the released one) when the waiter is fenced,
        its place is taken out, and its listening connection is told on its own channel with
        the ticket of the refresh whose place this read and the fence. Stale places of the
        key are dropped on the way. Without a fresh waiter, the row is deleted and the
        release is announced on the table's channel, as before lines existed.

        The waiter handed the key keeps it through its own releases for a burst (``burst``
        seconds, kept in the key's row of the line with the empty token, which no waiter has):
        until it ends, a release hands nothing over and leaves the key free, so that a holder
        that releases and takes the key straight back is not interrupted by a hand-over, each of
        which costs a waiter's wake-up, at every release. A release that leaves the key free
        inside a burst tells the head of the line so on its channel (``<ticket>|free``): the
        waiter asks at once, and takes the key unless the holder took it back, in which case its
        ask learns when the burst ends (see the ``join`` statement). The head is told once per
        burst (the burst row's ``ticket`` names the waiter told): a holder taking the key back
        and releasing it again wakes nobody, and the head asks at the burst's end at the latest.
        Without ``burst`` (a waiter that leaves without using a key handed to it) a running
        burst is no reason to keep the key back: the burst was that waiter's own."""
        # One read of the key's places (the rest reads that); each write below is skipped by
        # a one-time filter unless its case arose, so a release with nobody in line costs one
        # index probe of the line more than the plain release.
        return (
            "WITH places AS MATERIALIZED (SELECT line.token, line.owner, line.claim, line.fenced, line.channel,"
            " line.ticket, line.joined, line.fresh_until > clock_timestamp() AS fresh"
            f" FROM {q} AS line WHERE line.key = %(key)s{line_rows}),"
            " head AS MATERIALIZED (SELECT token, owner, claim, fenced, channel, ticket FROM places"
            " WHERE token <> '' AND fresh ORDER BY joined, token LIMIT 1),"
            " waiter AS MATERIALIZED (SELECT * FROM head"
            + (" WHERE NOT EXISTS (SELECT 1 FROM places WHERE token = '' AND fresh)" if burst else "")
            + "),"
            + draw("drawn", "waiter WHERE waiter.fenced")
            + f", handed AS (UPDATE {t} AS held SET token = waiter.token, owner = waiter.owner,"
            " expires_at = clock_timestamp() + waiter.claim * interval '1 second',"
            " fence = CASE WHEN waiter.fenced THEN GREATEST((SELECT value FROM drawn), held.fence + 1) END"
            f" FROM waiter, (SELECT expires_at > clock_timestamp() AS live FROM {t}"
            f" WHERE key = %(key)s{lease_rows}) AS old"
            f" WHERE held.key = %(key)s{lease_rows.replace(' AND ', ' AND held.')}"
            " AND EXISTS (SELECT 1 FROM waiter)"
            " RETURNING old.live, held.fence, waiter.token AS taker, waiter.channel, waiter.ticket),"
            f" taken AS (DELETE FROM {q} AS line USING handed WHERE line.key = %(key)s"
            " AND line.token = handed.taker),"
            f" bursting AS (INSERT INTO {q} (key, token, owner, claim, fenced, channel, ticket, joined,"
            " fresh_until) SELECT %(key)s, '', '', 0, false, '', '', clock_timestamp(),"
            " clock_timestamp() + %(burst)s * interval '1 second' FROM handed"
            " ON CONFLICT (key, token) DO UPDATE SET fresh_until = EXCLUDED.fresh_until, ticket = ''),"
            f" stale AS (DELETE FROM {q} AS line WHERE line.key = %(key)s{line_rows}"
            " AND EXISTS (SELECT 1 FROM places WHERE NOT fresh)"
            " AND (line.token <> '' OR NOT EXISTS (SELECT 1 FROM handed))"
            " AND line.fresh_until <= clock_timestamp()"
            " AND NOT EXISTS (SELECT 1 FROM waiter WHERE waiter.token = line.token)),"
            + extra
            + f" dropped AS (DELETE FROM {t} WHERE key = %(key)s{lease_rows}"
            " AND NOT EXISTS (SELECT 1 FROM waiter) RETURNING key, expires_at > clock_timestamp() AS live)"
            + (
                f", told AS (UPDATE {q} AS burst SET ticket = head.token FROM head, dropped"
                " WHERE burst.key = %(key)s AND burst.token = '' AND burst.fresh_until > clock_timestamp()"
                " AND burst.ticket <> head.token RETURNING pg_notify(head.channel, head.ticket || '|free'))"
                if burst
                else ""
            )
            + " SELECT live, pg_notify(%(channel)s, key),"
            " EXISTS (SELECT 1 FROM places WHERE token <> '' AND fresh) FROM dropped"
            " UNION ALL SELECT live, pg_notify(channel, ticket || '|' || COALESCE(fence::text, '')), true"
            " FROM handed"
        )

    mine, not_mine = " AND token = %(token)s", " AND line.token <> %(token)s"
    return {
        # Inputs: key, token, ttl, owner, claim_window, fenced (false), listen (the waiting
        # connection's channel), ticket, fresh_for (seconds the place stays fresh).
        # Result: one row (granted?, the fence: NULL here).
        "join": "WITH granted AS (" + acquire + ")," + place,
        # The same with fenced true, and gate, slot. Result: (granted?, the grant's fence).
        "join_fenced": "WITH granted AS (" + acquire_fenced + ")," + place,
        # Inputs: key, token, channel (the table's), burst. Result: one row (was the lease
        # live?, the notification's void result, is somebody in line?) if the token held the
        # row (somebody is, when the key was handed on or a burst kept it from the line).
        "release_handing": hand_on(mine, not_mine),
        # Inputs: key, token, channel. Result: (was the lease live?, void, false) when the token
        # held the key and nobody had a fresh place in its line: the row is deleted and the
        # release announced, as by the plain release; (NULL, NULL, true) when somebody has one,
        # and nothing was done (release_handing follows); no row when the token held nothing.
        "release_unqueued": (
            f"WITH placed AS MATERIALIZED (SELECT 1 FROM {q} WHERE key = %(key)s AND token <> %(token)s"
            " AND token <> '' AND fresh_until > clock_timestamp() LIMIT 1),"
            f" dropped AS (DELETE FROM {t} WHERE key = %(key)s AND token = %(token)s"
            " AND NOT EXISTS (SELECT 1 FROM placed) RETURNING key, expires_at > clock_timestamp() AS live)"
            " SELECT live, pg_notify(%(channel)s, key), false FROM dropped"
            " UNION ALL SELECT NULL, NULL, true FROM placed"
        ),
        # Inputs: key, channel. Result: as release_handing, for whoever held the key.
        "force_release_handing": hand_on("", ""),
        # Inputs: key, token, channel. A waiter that leaves without the key: its place goes,
        # and a key handed to it meanwhile goes on to the next waiter (or is released), inside
        # its burst too.
        "leave_line": hand_on(
            mine, not_mine, f" mine AS (DELETE FROM {q} WHERE key = %(key)s AND token = %(token)s),", burst=False
        ),
    }


#: Prefixed to every write when ``synchronous_commit=False``: the statement and the SET run in
#: one implicit transaction, so the setting covers exactly that statement.
_ASYNC_COMMIT = "SET LOCAL synchronous_commit TO off;\n"


def _statements(names: Names, write_prefix: str) -> dict[str, _Statement]:
    """Every statement of the backend, for one table. Each is headed by inputs and result."""
    t, seq, counters = names.table, names.sequence_literal, names.counters
    lease = "clock_timestamp() + %(ttl)s * interval '1 second'"
    # A fence is the larger of the sequence's next value and the server clock in
    # microseconds, so it keeps rising when the sequence is restarted (a restored backup, a
    # failover to a lagging replica) or dropped and recreated; a take-over also beats the
    # row's own fence. When the clock wins, the sequence is moved up to the fence, so that a
    # server clock stepped back later still draws larger fences from the sequence. (Two grants
    # of different keys racing between nextval and setval can leave the sequence at the
    # smaller of their two fences, microseconds apart; only a step back of the clock in that
    # window could then matter.) setval needs UPDATE on the sequence; a role granted only
    # USAGE gets the same fences without the move.
    def draw(name: str, source: str) -> str:
        """The CTE ``name``: one fence drawn for each row of ``source`` (a FROM ... WHERE)."""
        return (
            f" {name} AS MATERIALIZED (SELECT CASE WHEN drawn.clock <= drawn.next THEN drawn.next"
            f" WHEN has_sequence_privilege({seq}::regclass, 'UPDATE')"
            f" THEN setval({seq}::regclass, drawn.clock) ELSE drawn.clock END AS value"
            f" FROM (SELECT nextval({seq}::regclass) AS next,"
            " floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS clock"
            f" FROM {source}) AS drawn)"
        )

    fence_drawn = draw("fence", "gate WHERE {free}")
    # A same-token re-acquire keeps its fence only while its lease is live: once it lapsed the
    # key was free, so the grant is a new one and must carry a new, larger fence.
    still_ours = "held.token = EXCLUDED.token AND held.expires_at > clock_timestamp()"
    take_over = (
        "ON CONFLICT (key) DO UPDATE SET token = EXCLUDED.token,"
        " expires_at = EXCLUDED.expires_at, owner = EXCLUDED.owner, fence = {fence}"
        " WHERE held.expires_at <= clock_timestamp() OR held.token = EXCLUDED.token"
    )
    free = (
        f"NOT EXISTS (SELECT 1 FROM {t} WHERE key = %(key)s AND token <> %(token)s"
        " AND expires_at > clock_timestamp())"
    )
    free_but_claim = (
        f"NOT EXISTS (SELECT 1 FROM {t} WHERE key = %(key)s AND token <> %(token)s"
        " AND token <> %(claim)s AND expires_at > clock_timestamp())"
    )

    def fenced_grant(free_rows: str) -> str:
        """A fenced grant under the key's gate where ``free_rows`` holds, up to its RETURNING."""
        return (
            "WITH gate AS MATERIALIZED (SELECT pg_advisory_xact_lock(%(gate)s, %(slot)s)),"
            + fence_drawn.format(free=free_rows)
            + f" INSERT INTO {t} AS held (key, token, expires_at, fence, owner)"
            f" SELECT %(key)s, %(token)s, {lease}, fence.value, %(owner)s FROM fence "
            + take_over.format(
                fence=f"CASE WHEN {still_ours} THEN COALESCE(held.fence, EXCLUDED.fence)"
                " ELSE GREATEST(EXCLUDED.fence, held.fence + 1) END"
            )
        )

    # The last column says whether the row is a counting key's (see _place_statements).
    state_columns = (
        "key, expires_at, fence, owner, extract(epoch FROM expires_at - now.at)::float8,"
        " left(token, 1) = '#'"
    )
    statements = {
        # Inputs: key, token, ttl, owner. Result: one row affected on a grant, none on
        # contention. A same-token re-acquire keeps the fence an earlier fenced grant set.
        # The NOT EXISTS filter answers contention with a plain read: without it, ON CONFLICT
        # would lock the holder's row, which costs a transaction id, WAL and a commit flush
        # for every failed attempt. It reads the statement's snapshot, so it can only turn
        # away a key that was held when the call began; ON CONFLICT still decides every grant.
        "acquire": (
            f"INSERT INTO {t} AS held (key, token, expires_at, fence, owner)"
            f" SELECT %(key)s, %(token)s, {lease}, NULL, %(owner)s WHERE {free} "
            + take_over.format(fence=f"CASE WHEN {still_ours} THEN held.fence END")
        ),
        # Inputs: key, token, ttl, owner, gate, slot. Result: the fence, or no row.
        # nextval() in INSERT ... ON CONFLICT is drawn before the conflict check and the row
        # lock, so a grant that stalled after drawing could land after a later, larger one.
        # The transaction-scoped advisory lock (gate, slot) is taken first, in the same
        # statement, and the fence is computed from the gate's row, so the grants of one key
        # draw their fences one after the other.
        # The CTEs run in order (each reads the one before): the lock, then the fence, drawn
        # only when the key looks free.
        "acquire_fenced": (
            fenced_grant(free) + " RETURNING fence"
        ),
        # Inputs: key, token, ttl, owner, gate, slot, claim. Result: the fence, or no row.
        # acquire_fenced with the claim's live row counted as free: the claim is replaced by
        # a new grant with a new, larger fence; the token's own live row keeps its fence.
        "adopt": (
            fenced_grant(free_but_claim) + " OR held.token = %(claim)s RETURNING fence"
        ),
        # Inputs: key, token, channel. Result: one row (was the lease live?) if the token
        # held the row; the NOTIFY is delivered when the statement commits.
        "release": (
            f"DELETE FROM {t} WHERE key = %(key)s AND token = %(token)s"
            " RETURNING expires_at > clock_timestamp(), pg_notify(%(channel)s, key)"
        ),
        # Inputs: key, token, ttl. Result: one row affected if the live lease was ours.
        "extend": (
            f"UPDATE {t} SET expires_at = {lease}"
            " WHERE key = %(key)s AND token = %(token)s AND expires_at > clock_timestamp()"
        ),
        # Inputs: parallel arrays keys, tokens, ttls. Result: (key, token) of each lease
        # extended; the caller maps them back to the requests.
        "extend_many": (
            f"UPDATE {t} AS held SET expires_at = clock_timestamp() + item.ttl * interval '1 second'"
            " FROM unnest(%(keys)s::text[], %(tokens)s::text[], %(ttls)s::float8[])"
            " AS item(key, token, ttl)"
            " WHERE held.key = item.key AND held.token = item.token"
            " AND held.expires_at > clock_timestamp() RETURNING held.key, held.token"
        ),
        # Inputs: key, channel. Result: one row (was the lease live?) if a row was deleted.
        "force_release": (
            f"DELETE FROM {t} WHERE key = %(key)s"
            " RETURNING expires_at > clock_timestamp(), pg_notify(%(channel)s, key)"
        ),
        # Inputs: none. Result: the number of rows deleted.
        "sweep": f"DELETE FROM {t} WHERE expires_at <= clock_timestamp()",
        # Inputs: none. Result: the number of lease rows deleted (stale places in line go too).
        "sweep_line": (
            f"WITH places AS (DELETE FROM {names.queue} WHERE fresh_until <= clock_timestamp())"
            f" DELETE FROM {t} WHERE expires_at <= clock_timestamp()"
        ),
        # Inputs: name, window (seconds), amount. Result: (count, seconds left in the window). A
        # statement that read the clock just before another moved the counter to the next
        # window counts in that newer window instead of resetting it.
        "count": (
            "WITH now AS (SELECT extract(epoch FROM clock_timestamp())::float8 AS at)"
            f" INSERT INTO {counters} AS counter (name, window_index, count)"
            " SELECT %(name)s, floor(now.at / %(window)s)::bigint, %(amount)s FROM now"
            " ON CONFLICT (name) DO UPDATE SET"
            " count = CASE WHEN EXCLUDED.window_index <= counter.window_index"
            " THEN counter.count + EXCLUDED.count ELSE EXCLUDED.count END,"
            " window_index = GREATEST(counter.window_index, EXCLUDED.window_index)"
            " RETURNING count, (window_index + 1) * %(window)s - (SELECT at FROM now)"
        ),
    }
    reads = {
        # Inputs: key, token. Result: a row if the token holds a live lease.
        "is_held": (
            f"SELECT 1 FROM {t} WHERE key = %(key)s AND token = %(token)s"
            " AND expires_at > clock_timestamp()"
        ),
        # Inputs: key. Result: the live lease's state, remaining time measured here.
        "inspect": (
            f"SELECT {state_columns} FROM {t}, (SELECT clock_timestamp() AS at) AS now"
            " WHERE key = %(key)s AND expires_at > now.at"
        ),
        # Inputs: prefix. Result: the state of every live lease under it, by key.
        "scan": (
            f"SELECT {state_columns} FROM {t}, (SELECT clock_timestamp() AS at) AS now"
            " WHERE starts_with(key, %(prefix)s) AND expires_at > now.at ORDER BY key"
        ),
    }
    lines = _line_statements(names, statements["acquire"] + " RETURNING fence", statements["acquire_fenced"], draw)
    places = _place_statements(names, draw)
    # A place's grant and release run under the key's gate like the line's statements; the
    # extension takes the gates of its keys itself.
    for name in ("acquire_counted", "release_place"):
        lines[name] = places.pop(name)
    built = {name: _statement(name, write_prefix, sql) for name, sql in statements.items()}
    # Every statement of the line runs under the key's gate, taken by a statement of its own
    # before it in the same transaction: so each one reads (in its own, later snapshot) what
    # the previous holder of the gate committed. See _line_statements.
    built.update((name, _statement(name, write_prefix, sql, gated=True)) for name, sql in lines.items())
    built.update((name, _statement(name, "", sql)) for name, sql in reads.items())
    built["extend_places"] = _statement("extend_places", write_prefix, places.pop("extend_places"))
    built.update((name, _statement(name, "", sql)) for name, sql in places.items())
    return built


def _place_statements(names: Names, draw: Callable[[str, str], str]) -> dict[str, str]:
    """The statements of counting keys; ``draw`` makes the CTE that draws a fence. Each is
    headed by its inputs and result.

    A counting key has its row in the lock table, whose token is ``#<limit>`` (see
    :func:`_marker`), whose ``expires_at`` is the end of its last live place and whose fence
    is the largest granted, and one row per place in ``<table>_place``. A place counts only
    while both its own lease and its key's ``#`` row are live: a key taken by another kind of
    grant (a force release handed on, say) leaves its places inert until the next grant of
    the key drops them. Every statement that writes places runs under the key's gate (the
    advisory lock of its fenced grants), taken by a statement of its own before it, so each
    reads what the previous writer committed; an exclusive grant meets the ``#`` row as a
    holder's and never writes a live one.
    """
    t, p = names.table, names.places
    # The live places of the key, read once; none unless the key's row is a live '#' row.
    live = (
        "WITH now AS MATERIALIZED (SELECT clock_timestamp() AS at),"
        f" main AS MATERIALIZED (SELECT held.token, held.fence, held.expires_at > now.at AS live"
        f" FROM {t} AS held, now WHERE held.key = %(key)s),"
        " live AS MATERIALIZED (SELECT place.token, place.fence, place.expires_at"
        f" FROM {p} AS place, now WHERE place.key = %(key)s AND place.expires_at > now.at"
        " AND EXISTS (SELECT 1 FROM main WHERE main.live AND left(main.token, 1) = '#')),"
    )
    return {
        # Inputs: key, token, ttl, owner, limit, marker (the '#' token of limit). Result: one
        # row (the place's fence or NULL, the limit of the live holders when it differs from
        # limit, and then nothing was written). The place is written only when the key's row
        # was: an exclusive grant that takes an expired '#' row meanwhile (acquire takes no
        # gate) leaves the ask refused. Places that ended (or count no longer) are dropped.
        "acquire_counted": (
            live
            + " held AS MATERIALIZED (SELECT CASE WHEN left(main.token, 1) = '#'"
            " THEN substr(main.token, 2)::int ELSE 1 END AS lim FROM main"
            " WHERE main.live AND (left(main.token, 1) <> '#' OR EXISTS (SELECT 1 FROM live))),"
            " refused AS MATERIALIZED (SELECT lim FROM held WHERE lim <> %(limit)s),"
            " mine AS MATERIALIZED (SELECT fence FROM live WHERE token = %(token)s),"
            " go AS MATERIALIZED (SELECT NOT EXISTS (SELECT 1 FROM mine) AS fresh"
            " WHERE NOT EXISTS (SELECT 1 FROM refused)"
            " AND (EXISTS (SELECT 1 FROM mine) OR (SELECT count(*) FROM live) < %(limit)s)),"
            + draw("drawn", "go WHERE go.fresh")
            + ", granted AS MATERIALIZED (SELECT COALESCE((SELECT fence FROM mine),"
            " GREATEST((SELECT value FROM drawn), (SELECT fence + 1 FROM main))) AS fence,"
            " now.at + %(ttl)s * interval '1 second' AS ends FROM go, now),"
            f" head AS (INSERT INTO {t} AS held (key, token, expires_at, fence, owner)"
            " SELECT %(key)s, %(marker)s,"
            " GREATEST(granted.ends, (SELECT max(expires_at) FROM live WHERE token <> %(token)s)),"
            " granted.fence, '' FROM granted"
            " ON CONFLICT (key) DO UPDATE SET token = EXCLUDED.token, expires_at = EXCLUDED.expires_at,"
            " fence = GREATEST(EXCLUDED.fence, held.fence), owner = EXCLUDED.owner"
            " WHERE left(held.token, 1) = '#' OR held.expires_at <= clock_timestamp() RETURNING 1),"
            f" placed AS (INSERT INTO {p} AS place (key, token, expires_at, fence, owner)"
            " SELECT %(key)s, %(token)s, granted.ends, granted.fence, %(owner)s FROM granted"
            " WHERE EXISTS (SELECT 1 FROM head)"
            " ON CONFLICT (key, token) DO UPDATE SET expires_at = EXCLUDED.expires_at,"
            " fence = EXCLUDED.fence, owner = EXCLUDED.owner),"
            f" pruned AS (DELETE FROM {p} AS place WHERE place.key = %(key)s AND place.token <> %(token)s"
            " AND NOT EXISTS (SELECT 1 FROM refused)"
            " AND NOT EXISTS (SELECT 1 FROM live WHERE live.token = place.token))"
            " SELECT (SELECT fence FROM granted WHERE EXISTS (SELECT 1 FROM head)), (SELECT lim FROM refused)"
        ),
        # Inputs: key, token, channel. Result: one row (was the place live?, the
        # notification's void result) if the token had a place row; the key's row then ends
        # with its last live place, or goes with it, and the release is announced as a key's.
        "release_place": (
            live
            + f" gone AS (DELETE FROM {p} WHERE key = %(key)s AND token = %(token)s RETURNING expires_at),"
            " rest AS MATERIALIZED (SELECT max(expires_at) AS ends FROM live WHERE token <> %(token)s),"
            f" shrunk AS (UPDATE {t} AS held SET expires_at = rest.ends FROM rest"
            " WHERE held.key = %(key)s AND left(held.token, 1) = '#' AND rest.ends IS NOT NULL"
            " AND EXISTS (SELECT 1 FROM gone)),"
            f" emptied AS (DELETE FROM {t} AS held USING rest"
            " WHERE held.key = %(key)s AND left(held.token, 1) = '#' AND rest.ends IS NULL"
            " AND EXISTS (SELECT 1 FROM gone))"
            " SELECT EXISTS (SELECT 1 FROM live WHERE token = %(token)s), pg_notify(%(channel)s, %(key)s)"
            " FROM gone"
        ),
        # Inputs: gate, slots (the keys' slots, sorted), parallel arrays keys, tokens, ttls.
        # Result: (key, token) of each live place extended; each key's row then ends with its
        # last live place.
        "extend_places": (
            "SELECT pg_advisory_xact_lock(%(gate)s, slot)"
            " FROM (SELECT unnest(%(slots)s::int4[]) AS slot) AS ordered;\n"
            "WITH now AS MATERIALIZED (SELECT clock_timestamp() AS at),"
            " item AS MATERIALIZED (SELECT * FROM unnest(%(keys)s::text[], %(tokens)s::text[], %(ttls)s::float8[])"
            " AS item(key, token, ttl)),"
            f" moved AS (UPDATE {p} AS place SET expires_at = now.at + item.ttl * interval '1 second'"
            f" FROM item, now, {t} AS held"
            " WHERE place.key = item.key AND place.token = item.token AND place.expires_at > now.at"
            " AND held.key = item.key AND left(held.token, 1) = '#' AND held.expires_at > now.at"
            " RETURNING place.key, place.token, place.expires_at),"
            " ends AS (SELECT every.key, max(every.expires_at) AS at FROM (SELECT key, expires_at FROM moved"
            f" UNION ALL SELECT place.key, place.expires_at FROM {p} AS place, now"
            " WHERE place.key IN (SELECT key FROM moved) AND place.expires_at > now.at"
            " AND NOT EXISTS (SELECT 1 FROM moved WHERE moved.key = place.key AND moved.token = place.token))"
            " AS every GROUP BY every.key),"
            f" shifted AS (UPDATE {t} AS held SET expires_at = ends.at FROM ends WHERE held.key = ends.key)"
            " SELECT key, token FROM moved"
        ),
        # Inputs: key, token. Result: a row if the token holds a live place of the key.
        "is_held_place": (
            f"SELECT 1 FROM {p} AS place, {t} AS held WHERE place.key = %(key)s AND place.token = %(token)s"
            " AND place.expires_at > clock_timestamp() AND held.key = %(key)s"
            " AND left(held.token, 1) = '#' AND held.expires_at > clock_timestamp()"
        ),
        # Inputs: keys. Result: (key, limit, expires_at, fence, owner, seconds left) of each
        # live place of those keys that are counting keys, and of the live row of each that is
        # not (limit 1).
        "holders": (
            "WITH now AS MATERIALIZED (SELECT clock_timestamp() AS at)"
            " SELECT held.key, substr(held.token, 2)::int, place.expires_at, place.fence, place.owner,"
            " extract(epoch FROM place.expires_at - now.at)::float8"
            f" FROM {t} AS held JOIN {p} AS place ON place.key = held.key, now"
            " WHERE held.key = ANY(%(keys)s::text[]) AND left(held.token, 1) = '#'"
            " AND held.expires_at > now.at AND place.expires_at > now.at"
            " UNION ALL SELECT key, 1, expires_at, fence, owner, extract(epoch FROM expires_at - now.at)::float8"
            f" FROM {t}, now WHERE key = ANY(%(keys)s::text[]) AND left(token, 1) <> '#' AND expires_at > now.at"
        ),
        # Inputs: none. Result: the number of places deleted. Only places that ended: a place
        # row found written meanwhile is read again, and kept.
        "sweep_places": f"DELETE FROM {p} WHERE expires_at <= clock_timestamp()",
    }
