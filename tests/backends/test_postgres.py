"""The PostgreSQL backend against a real server (see tests/support/postgres_server.py)."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any, Iterator

import freezegun
import psycopg2
import psycopg2.errors
import psycopg2.extras
import psycopg2.pool
import pytest
from lease_lock.backends import backend_from_url
from lease_lock.backends.postgres import PostgresBackend, ddl
from lease_lock.errors import BackendUnavailableError, ValidationError
from lease_lock.testing import BackendContract, ServiceStoreContract, wait_until

from tests.support.postgres_server import PostgresServer, sql

TOKEN = "t" * 32
OTHER = "o" * 32






@pytest.fixture
def default_table(admin: Any) -> None:
    """The default lock table, made as a deployment makes it (``ddl()``, from a migration, say).

    Some contract tests read a key before anything writes one, and a read never creates the
    table: on a server no test has written to yet (the first test of a worker of its own) they
    would meet no table at all."""
    for statement in ddl():
        sql(admin, statement)


class TestPostgresPool(BackendContract, ServiceStoreContract):
    """The contract through ``connect("postgresql://...")``, which builds a pool."""

    @pytest.fixture
    def backend(self, postgres_server: PostgresServer, default_table: None) -> Iterator[PostgresBackend]:
        backend = backend_from_url(postgres_server.url)
        assert isinstance(backend, PostgresBackend)
        yield backend
        backend.close()


class TestPostgresConnection(BackendContract):
    """The contract on one caller-owned connection that several threads share."""

    @pytest.fixture
    def backend(self, postgres_server: PostgresServer, default_table: None) -> Iterator[PostgresBackend]:
        conn = psycopg2.connect(postgres_server.dsn)
        backend = PostgresBackend(conn)
        yield backend
        backend.close()
        assert not conn.closed, "a caller's connection stays open"
        conn.close()


# -- storage an operator can read ----------------------------------------------------------------


def test_row_is_readable_by_operators(postgres_server: PostgresServer, admin: Any, table: str) -> None:
    backend = PostgresBackend.from_url(postgres_server.url, table=table)
    key = "app:orders/42 ünï"
    fence = backend.acquire_fenced(key, TOKEN, 60, "host:1")
    rows = sql(
        admin,
        f'SELECT key, token, fence, owner, expires_at > clock_timestamp() FROM "{table}"',
    )
    assert rows == [(key, TOKEN, fence, "host:1", True)]
    backend.close()


def test_postgres_scheme_alias_and_query_options(postgres_server: PostgresServer, table: str) -> None:
    url = postgres_server.url.replace("postgresql://", "postgres://", 1)
    backend = backend_from_url(f"{url}?table={table}&application_name=ll-test&max_connections=2")
    assert isinstance(backend, PostgresBackend)
    assert backend.names.label == table and backend.pool.maxconn == 2
    assert backend.acquire("k", TOKEN, 30, "o")
    conn = backend.pool.getconn()
    assert sql(conn, "SELECT current_setting('application_name')") == [("ll-test",)]
    backend.pool.putconn(conn)
    backend.close()
    assert backend.pool.closed


def test_caller_connection_keeps_its_autocommit_setting(
    postgres_server: PostgresServer, admin: Any, table: str
) -> None:
    conn = psycopg2.connect(postgres_server.dsn)
    assert conn.autocommit is False
    backend = PostgresBackend(conn, table=table)
    assert backend.connection is conn and backend.pool is None
    assert backend.acquire("k", TOKEN, 30, "o")
    assert conn.autocommit is False
    # Committed by the statement itself: another session sees the lease at once.
    assert sql(admin, f'SELECT token FROM "{table}" WHERE key = %s', "k") == [(TOKEN,)]
    conn.close()


def test_simple_pool_is_made_thread_safe(postgres_server: PostgresServer, table: str) -> None:
    pool = psycopg2.pool.SimpleConnectionPool(1, 3, postgres_server.dsn)
    backend = PostgresBackend(pool, table=table)
    wins: list[int] = []

    def worker(index: int) -> None:
        for round_ in range(20):
            if backend.acquire(f"k{round_}", f"{index:02d}" + "x" * 30, 30, "o"):
                wins.append(round_)

    threads = [threading.Thread(target=worker, args=(index,)) for index in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(wins) == list(range(20)), "every key granted exactly once"
    backend.close()
    assert not pool.closed, "a caller's pool stays open"
    pool.closeall()


def test_kept_cursors_stay_bounded_when_the_pool_closes_what_it_returns(
    postgres_server: PostgresServer, table: str
) -> None:
    # minconn=0: the pool closes every connection given back, so each statement runs on a new
    # connection with a new kept cursor; those of closed connections must not pile up.
    pool = psycopg2.pool.ThreadedConnectionPool(0, 2, postgres_server.dsn)
    backend = PostgresBackend(pool, table=table)
    for index in range(30):
        assert backend.acquire(f"k{index}", TOKEN, 30, "o")
        assert backend.release(f"k{index}", TOKEN) is True
    assert len(backend._source.cursors) <= 4
    backend.close()
    pool.closeall()


def test_refuses_an_autocommit_connection_inside_an_explicit_transaction(
    postgres_server: PostgresServer, admin: Any, table: str
) -> None:
    conn = psycopg2.connect(postgres_server.dsn)
    conn.autocommit = True
    backend = PostgresBackend(conn, table=table)
    assert backend.acquire("k", TOKEN, 30, "o")
    sql(conn, "BEGIN")
    with pytest.raises(ValidationError, match="inside a transaction"):
        backend.release("k", TOKEN)
    sql(conn, "ROLLBACK")
    assert sql(admin, f'SELECT token FROM "{table}" WHERE key = %s', "k") == [(TOKEN,)]
    assert backend.release("k", TOKEN) is True
    assert conn.autocommit is True
    conn.close()


def _cycle(backend: PostgresBackend, key: str) -> None:
    """Every prepared statement once, each answer checked."""
    fence = backend.acquire_fenced(key, TOKEN, 30, "o")
    assert fence is not None
    assert backend.acquire(key, TOKEN, 30, "o"), "the holder's re-acquire"
    assert not backend.acquire(key, OTHER, 30, "o"), "another token is turned away"
    assert backend.extend(key, TOKEN, 30)
    assert backend.is_held(key, TOKEN)
    assert backend.inspect(key).fence == fence
    assert backend.release(key, TOKEN) is True
    assert not backend.is_held(key, TOKEN)


def _prepared(conn: Any) -> set[str]:
    return {name for (name,) in sql(conn, "SELECT name FROM pg_prepared_statements")}


def test_statements_are_prepared_again_after_the_session_drops_them(
    postgres_server: PostgresServer, table: str
) -> None:
    conn = psycopg2.connect(postgres_server.dsn)
    conn.autocommit = True
    backend = PostgresBackend(conn, table=table)
    _cycle(backend, "k")
    names = _prepared(conn)
    assert len(names) == 6 and all(name.startswith("lease_lock_") for name in names)
    for reset in ("DEALLOCATE ALL", "DISCARD ALL"):
        sql(conn, reset)
        assert _prepared(conn) == set()
        _cycle(backend, "k")
        assert _prepared(conn) == names
    conn.close()


def test_the_lines_statements_and_their_gate_are_prepared_and_prepared_again(
    postgres_server: PostgresServer, table: str
) -> None:
    # A release that hands the key on runs the key's gate, then the release itself: both are
    # prepared in the same query as their first run, and again after the session drops them.
    conn = psycopg2.connect(postgres_server.dsn)
    conn.autocommit = True
    backend = PostgresBackend(conn, table=table, direct_handoff=True)
    try:
        # A key of its own each time: the waiter handed the first one keeps it through its
        # releases for a short burst, and a release in a burst hands nothing over.
        for reset in ("", "DEALLOCATE ALL", "DISCARD ALL"):
            if reset:
                sql(conn, reset)
            key = f"k{reset}"
            assert backend.acquire(key, TOKEN, 30, "o")
            line = backend.join_line(key, OTHER, 30, "w", False, time.monotonic)
            assert line is not None
            assert line.ask() is None, "in line behind the holder"
            assert backend.release(key, TOKEN) is True
            grant = line.wait(30)
            assert grant is not None and grant.claimed, f"the release handed the key over ({reset or 'first'})"
            line.leave(True)
            assert backend.release(key, OTHER) is True
            prepared = _prepared(conn)
            for kind in ("gate", "join", "release_handing", "release_unqueued"):
                assert any(name.startswith("lease_lock_") and f"_{kind}_" in name for name in prepared), kind
    finally:
        backend.close()
        conn.close()


def test_two_backends_share_one_connections_prepared_statements(
    postgres_server: PostgresServer, table: str
) -> None:
    conn = psycopg2.connect(postgres_server.dsn)
    first, second = PostgresBackend(conn, table=table), PostgresBackend(conn, table=table)
    _cycle(first, "k1")
    _cycle(second, "k2")
    assert first.acquire("k", TOKEN, 30, "o")
    assert not second.acquire("k", OTHER, 30, "o")
    assert second.release("k", TOKEN) is True
    assert conn.autocommit is False
    conn.close()


def test_a_single_connections_failures_read_as_a_pools_do(
    postgres_server: PostgresServer, admin: Any, table: str
) -> None:
    # A single connection's usual statement takes a path of its own (see PostgresBackend._run):
    # what fails on it must come out as it does on any connection.
    app_name = f"ll-{uuid.uuid4().hex[:8]}"
    conn = psycopg2.connect(postgres_server.dsn, application_name=app_name)
    conn.autocommit = True
    backend = PostgresBackend(conn, table=table)
    assert backend.acquire("k", TOKEN, 30, "o")
    # An error of the statement itself passes through, and the connection keeps serving.
    with pytest.raises(psycopg2.errors.DatetimeFieldOverflow):
        backend.acquire("k", TOKEN, float("inf"), "o")
    assert backend.release("k", TOKEN) is True
    # A table dropped under the backend is made again by the next write.
    sql(admin, f'DROP TABLE "{table}"')
    assert backend.acquire("k", TOKEN, 30, "o")
    assert sql(admin, f'SELECT token FROM "{table}" WHERE key = %s', "k") == [(TOKEN,)]
    # A killed session cannot be replaced: the server is out of reach, from the driver's error.
    sql(admin, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s", app_name)
    for _attempt in range(2):
        with pytest.raises(BackendUnavailableError) as caught:
            backend.release("k", TOKEN)
        assert isinstance(caught.value.__cause__, (psycopg2.OperationalError, psycopg2.InterfaceError))
    conn.close()
    with pytest.raises(BackendUnavailableError) as caught:
        backend.acquire("k", TOKEN, 30, "o")
    assert isinstance(caught.value.__cause__, psycopg2.InterfaceError)


def test_rows_are_tuples_whatever_the_connections_cursor_factory(
    postgres_server: PostgresServer, table: str
) -> None:
    conn = psycopg2.connect(postgres_server.dsn, cursor_factory=psycopg2.extras.RealDictCursor)
    backend = PostgresBackend(conn, table=table)
    _cycle(backend, "k")
    assert list(backend.scan("")) == []
    conn.close()


def test_asynchronous_commit_runs_every_statement(postgres_server: PostgresServer, table: str) -> None:
    backend = PostgresBackend.from_url(postgres_server.url, table=table, synchronous_commit=False)
    for _ in range(3):
        _cycle(backend, "k")
    assert backend.force_release("k") is False
    assert backend.count_in_window("c", 60)[0] == 1
    backend.close()

# -- server clock ---------------------------------------------------------------------------------


@pytest.mark.parametrize("frozen_at", ["2001-01-01 00:00:00", "2150-06-01 12:00:00"])
def test_expiry_ignores_the_client_wall_clock(postgres_server: PostgresServer, table: str, frozen_at: str) -> None:
    backend = PostgresBackend.from_url(postgres_server.url, table=table)
    with freezegun.freeze_time(frozen_at):
        assert backend.acquire("k", TOKEN, 0.4, "o")
        state = backend.inspect("k")
        assert state.expires_at is not None and state.expires_at.year >= 2024
        assert state.expires_in is not None and 0 < state.expires_in <= 0.4
        # Event.wait sleeps on the real monotonic clock, which freezegun does not stop.
        assert wait_until(lambda: not backend.is_held("k", TOKEN), 10, 0.05)
        assert backend.acquire("k", OTHER, 30, "o")
        assert not backend.extend("k", TOKEN, 30)
    backend.close()


# -- counters and sweeping ------------------------------------------------------------------------


def test_count_in_window_is_shared_and_resets(postgres_server: PostgresServer, table: str) -> None:
    first = PostgresBackend.from_url(postgres_server.url, table=table)
    second = PostgresBackend.from_url(postgres_server.url, table=table)
    window = 3600.0
    count, left = first.count_in_window("api", window)
    assert count == 1 and 0 < left <= window
    assert second.count_in_window("api", window)[0] == 2
    assert first.count_in_window("other", window)[0] == 1
    short_count, short_left = first.count_in_window("burst", 0.5)
    assert short_count == 1 and 0 < short_left <= 0.5
    # After the window ends the counter starts again at one.
    assert wait_until(lambda: first.count_in_window("burst", 0.5)[0] == 1, 10, 0.6)
    first.close()
    second.close()


def test_sweep_expired_deletes_only_expired_rows(postgres_server: PostgresServer, admin: Any, table: str) -> None:
    backend = PostgresBackend.from_url(postgres_server.url, table=table)
    assert backend.acquire("short", TOKEN, 0.2, "o")
    assert backend.acquire("long", TOKEN, 60, "o")
    assert wait_until(lambda: not backend.inspect("short").held, 10)
    assert backend.sweep_expired() == 1
    assert sql(admin, f'SELECT key FROM "{table}"') == [("long",)]
    assert backend.sweep_expired() == 0
    backend.close()


# -- DDL and the table check ----------------------------------------------------------------------


def test_ddl_is_idempotent_sql_for_migrations(admin: Any, postgres_server: PostgresServer, table: str) -> None:
    statements = ddl(table)
    assert isinstance(statements, list) and all(isinstance(sql, str) for sql in statements)
    for _ in range(2):
        for statement in statements:
            sql(admin, statement)
    backend = PostgresBackend.from_url(postgres_server.url, table=table, create_table=False)
    first = backend.acquire_fenced("k", TOKEN, 30, "o")
    # The fence sequence starts at the server clock in microseconds (fences keep rising
    # even if the sequence is ever recreated).
    assert first is not None and 10**15 < first < 2**53
    backend.close()


def test_unlogged_ddl(admin: Any, table: str) -> None:
    for statement in ddl(table, unlogged=True):
        sql(admin, statement)
    assert sql(admin, "SELECT relpersistence FROM pg_class WHERE relname = %s", table) == [("u",)]


def test_schema_qualified_table(postgres_server: PostgresServer, admin: Any) -> None:
    schema = f"s_{uuid.uuid4().hex[:8]}"
    sql(admin, f'CREATE SCHEMA "{schema}"')
    try:
        backend = PostgresBackend.from_url(postgres_server.url, table=f"{schema}.locks")
        assert backend.acquire_fenced("k", TOKEN, 30, "o") is not None
        assert sql(admin, f'SELECT key FROM "{schema}"."locks"') == [("k",)]
        backend.close()
        again = PostgresBackend.from_url(postgres_server.url, table="locks", schema=schema)
        assert again.inspect("k").held
        again.close()
    finally:
        sql(admin, f'DROP SCHEMA "{schema}" CASCADE')


def _misconfigured(postgres_server: PostgresServer, table: str) -> PostgresBackend:
    return PostgresBackend.from_url(postgres_server.url, table=table, create_table=False)


def test_missing_table_is_reported_then_rechecked(postgres_server: PostgresServer, admin: Any, table: str) -> None:
    backend = _misconfigured(postgres_server, table)
    with pytest.raises(ValidationError, match=f'table "{table}" does not exist'):
        backend.acquire("k", TOKEN, 30, "o")
    for statement in ddl(table):
        sql(admin, statement)
    # The failed check runs again on the next call, which now succeeds.
    assert backend.acquire("k", TOKEN, 30, "o")
    backend.close()


def test_missing_unique_index(postgres_server: PostgresServer, admin: Any, table: str) -> None:
    for statement in ddl(table):
        sql(admin, statement.replace(' COLLATE "C" PRIMARY KEY', ""))
    backend = _misconfigured(postgres_server, table)
    with pytest.raises(ValidationError, match="no primary key or unique index on key alone"):
        backend.inspect("k")
    sql(admin, f'CREATE UNIQUE INDEX ON "{table}" (key, token)')
    with pytest.raises(ValidationError, match="no primary key or unique index on key alone"):
        backend.inspect("k")
    sql(admin, f'CREATE UNIQUE INDEX ON "{table}" (key)')
    assert backend.acquire("k", TOKEN, 30, "o")
    backend.close()


def test_missing_sequence(postgres_server: PostgresServer, admin: Any, table: str) -> None:
    for statement in ddl(table):
        sql(admin, statement)
    sql(admin, f'DROP SEQUENCE "{table}_fence"')
    backend = _misconfigured(postgres_server, table)
    with pytest.raises(ValidationError, match=r"fence sequence .* does not exist"):
        backend.acquire_fenced("k", TOKEN, 30, "o")
    assert sql(admin, f'SELECT count(*) FROM "{table}"') == [(0,)], "nothing written"
    backend.close()


def test_role_with_only_select(postgres_server: PostgresServer, admin: Any, table: str) -> None:
    for statement in ddl(table):
        sql(admin, statement)
    role = f"r_{uuid.uuid4().hex[:8]}"
    sql(admin, f"CREATE ROLE {role} LOGIN PASSWORD 'secret-pw'")
    try:
        sql(admin, f'GRANT SELECT ON "{table}" TO {role}')
        dsn = f"{postgres_server.dsn} user={role} password=secret-pw"
        conn = psycopg2.connect(dsn)
        backend = PostgresBackend(conn, table=table, create_table=False)
        with pytest.raises(ValidationError, match="lacks INSERT, UPDATE, DELETE on table") as caught:
            backend.acquire("k", TOKEN, 30, "o")
        assert "USAGE" not in str(caught.value) or "sequence" in str(caught.value)
        sql(admin, f'GRANT INSERT, UPDATE, DELETE ON "{table}" TO {role}')
        with pytest.raises(ValidationError, match="lacks USAGE on the fence sequence"):
            backend.acquire("k", TOKEN, 30, "o")
        sql(admin, f'GRANT USAGE ON SEQUENCE "{table}_fence" TO {role}')
        assert backend.acquire_fenced("k", TOKEN, 30, "o") is not None
        with pytest.raises(ValidationError, match="lacks SELECT, INSERT, UPDATE on table"):
            backend.count_in_window("n", 60)
        conn.close()
    finally:
        sql(admin, f'DROP OWNED BY {role}; DROP ROLE {role}')


# -- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"table": "bad-name"}, "table 'bad-name' must be letters"),
        ({"table": "1abc"}, "must be letters"),
        ({"table": 'x"; DROP TABLE y; --'}, "must be letters"),
        ({"table": "t" * 58}, "longer than 57 characters"),
        ({"table": "a.b", "schema": "c"}, "already schema-qualified"),
        ({"schema": "bad schema"}, "schema 'bad schema' must be letters"),
        ({"create_table": "yes"}, "create_table must be True or False"),
        ({"synchronous_commit": 1}, "synchronous_commit must be True or False"),
    ],
)
def test_bad_options_refused_before_connecting(options: dict[str, Any], message: str) -> None:
    # Port 1 has no server: reaching the driver would raise OperationalError instead.
    with pytest.raises(ValidationError, match=message):
        PostgresBackend.from_url("postgresql://nobody@127.0.0.1:1/none", **options)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("postgresql://127.0.0.1:1/db?colour=blue", "invalid PostgreSQL DSN"),
        ("postgresql://127.0.0.1:notaport/db", "invalid PostgreSQL DSN"),
        ("postgresql://127.0.0.1:1/db?create_table=maybe", "create_table='maybe'"),
        ("postgresql://127.0.0.1:1/db?max_connections=0", "max_connections='0'"),
    ],
)
def test_bad_urls(url: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        PostgresBackend.from_url(url)


def test_unknown_keyword_option() -> None:
    with pytest.raises(ValidationError, match="unknown postgresql option 'tabel'"):
        PostgresBackend.from_url("postgresql://127.0.0.1:1/db", tabel="x")


def test_unreachable_server_raises_backend_unavailable_from_the_driver_error() -> None:
    with pytest.raises(BackendUnavailableError) as caught:
        PostgresBackend.from_url("postgresql://nobody:Sup3rSecretPw@127.0.0.1:1/none?connect_timeout=5")
    assert caught.value.backend == "postgresql"
    assert isinstance(caught.value.__cause__, psycopg2.OperationalError)
    assert "PostgreSQL" in str(caught.value) and "Sup3rSecretPw" not in str(caught.value)


def test_a_refused_login_passes_through_as_the_driver_error(postgres_server: PostgresServer) -> None:
    with pytest.raises(psycopg2.OperationalError) as caught:
        PostgresBackend.from_url(postgres_server.url.rsplit("/", 1)[0] + "/no_such_database_xyz")
    assert not isinstance(caught.value, BackendUnavailableError)


def test_refuses_what_is_not_a_connection() -> None:
    with pytest.raises(ValidationError, match=r"psycopg2 connection or a psycopg2\.pool pool"):
        PostgresBackend("postgresql://127.0.0.1/db")


def test_refuses_a_connection_inside_a_transaction(postgres_server: PostgresServer, admin: Any, table: str) -> None:
    conn = psycopg2.connect(postgres_server.dsn)
    sql(conn, "SELECT 1")  # psycopg2 opened a transaction for this query
    with pytest.raises(ValidationError, match="inside a transaction"):
        PostgresBackend(conn, table=table)
    conn.rollback()
    backend = PostgresBackend(conn, table=table)
    sql(conn, "SELECT 1")
    with pytest.raises(ValidationError, match="inside a transaction"):
        backend.acquire("k", TOKEN, 30, "o")
    conn.rollback()
    assert sql(admin, "SELECT to_regclass(%s)", table) == [(None,)], "nothing written"
    assert backend.acquire("k", TOKEN, 30, "o")
    conn.close()


def test_url_without_host_part_keeps_its_host_parameter(postgres_server: Any) -> None:
    # Regression: "postgresql:///db?host=..." lost its "//" on the way to libpq, which then
    # rejected the DSN. The host travels in the query string instead of the URL's host part.
    user = postgres_server.dsn.split("user=", 1)[1].split(" ", 1)[0]
    url = (
        f"postgresql:///postgres?host={postgres_server.host}&port={postgres_server.port}"
        f"&user={user}&table=lease_lock_hostless"
    )
    backend = PostgresBackend.from_url(url)
    try:
        assert backend.acquire("hostless", "t" * 32, 30, "test")
        assert backend.inspect("hostless").held
    finally:
        backend.force_release("hostless")
        backend.close()


def test_url_built_pool_bounds_network_waits(postgres_server: Any) -> None:
    # The heartbeat calls the backend on its own thread; a dead network must not hold it for ever.
    backend = PostgresBackend.from_url(f"{postgres_server.url}?table=lease_lock_timeouts")
    try:
        connection = backend.pool.getconn()
        try:
            parameters = connection.get_dsn_parameters()
            assert parameters["connect_timeout"] == "5"
            assert parameters["tcp_user_timeout"] == "5000"
        finally:
            backend.pool.putconn(connection)
    finally:
        backend.close()
    backend = PostgresBackend.from_url(f"{postgres_server.url}?table=lease_lock_timeouts&connect_timeout=2")
    try:
        connection = backend.pool.getconn()
        try:
            assert connection.get_dsn_parameters()["connect_timeout"] == "2"
        finally:
            backend.pool.putconn(connection)
    finally:
        backend.close()
