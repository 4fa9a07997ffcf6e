"""PostgreSQL through outages: dead pooled connections, a stopped server, a dropped or restarted
fence sequence, a reply lost after commit, fork(), and secrets kept out of every message."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any, Callable

import lease_lock
import psycopg2
import pytest
from benchmarks.chaos_harness.proxy import TcpProxy
from lease_lock.backends.base import ExtendRequest
from lease_lock.backends.postgres import PostgresBackend, ddl
from lease_lock.errors import BackendUnavailableError, ValidationError
from lease_lock.events import LockEvent
from lease_lock.testing import wait_until

from tests.support.children import check_forked_children_beside_the_parent, exit_codes, fork_children
from tests.support.outage import check_an_outage_past_the_timeout
from tests.support.postgres_server import PostgresServer

TOKEN = "t" * 32
OTHER = "o" * 32
SECRET = "Sup3rSecretPw"  # noqa: S105 - a made-up password that must never be shown


def _admin(server: PostgresServer) -> Any:
    conn = psycopg2.connect(server.dsn)
    conn.autocommit = True
    return conn


def _sql(server: PostgresServer, statement: str, *parameters: Any) -> list[Any]:
    conn = _admin(server)
    try:
        with conn.cursor() as cursor:
            cursor.execute(statement, parameters)
            return cursor.fetchall() if cursor.description is not None else []
    finally:
        conn.close()


def _terminate(server: PostgresServer, application_name: str) -> int:
    rows = _sql(
        server,
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
        " WHERE application_name = %s",
        application_name,
    )
    return int(rows[0][0])


def _fill_pool(backend: PostgresBackend, count: int) -> None:
    """Leave ``count`` idle connections in the backend's pool."""
    connections = [backend.pool.getconn() for _ in range(count)]
    for conn in connections:
        backend.pool.putconn(conn)


@pytest.fixture
def app_name() -> str:
    return f"ll-outage-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def table() -> str:
    return f"outage_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def private(postgres_private_server: PostgresServer) -> Iterator[PostgresServer]:
    yield postgres_private_server
    # A test that stopped the server and failed before starting it again must not leave the
    # next test without one.
    try:
        _sql(postgres_private_server, "SELECT 1")
    except psycopg2.OperationalError:
        postgres_private_server.start()


def _url(server: PostgresServer, app_name: str, table: str, password: bool = False) -> str:
    url = server.url
    if password:
        # The private server trusts every login, so a password is accepted and ignored.
        url = url.replace("postgres@", f"postgres:{SECRET}@", 1)
    return f"{url}?application_name={app_name}&table={table}"


def _every_call(backend: PostgresBackend, index: int) -> dict[str, Callable[[], Any]]:
    key = f"k{index}"
    return {
        "acquire": lambda: backend.acquire_fenced(key, TOKEN, 60, "o"),
        "extend": lambda: backend.extend(key, TOKEN, 60),
        "extend_many": lambda: backend.extend_many([ExtendRequest(key, TOKEN, 60)]),
        "get": lambda: backend.inspect(key),
        "is_held": lambda: backend.is_held(key, TOKEN),
        "list": lambda: list(backend.scan("k")),
        "release": lambda: backend.release(key, TOKEN),
    }


def _twenty_of_each(backend: PostgresBackend) -> None:
    for index in range(20):
        calls = _every_call(backend, index)
        assert calls["acquire"]() is not None
        assert calls["extend"]() is True
        assert calls["extend_many"]() == [True]
        assert calls["get"]().held
        assert calls["is_held"]() is True
        assert [state.key for state in calls["list"]()] == [f"k{index}"]
        assert calls["release"]() is True


def test_restart_and_killed_pooled_sessions_then_every_call_succeeds(
    private: PostgresServer, app_name: str, table: str
) -> None:
    backend = PostgresBackend.from_url(_url(private, app_name, table))
    try:
        _twenty_of_each(backend)
        _fill_pool(backend, 10)
        private.restart()
        _twenty_of_each(backend)
        _fill_pool(backend, 10)
        assert _terminate(private, app_name) == 10
        _twenty_of_each(backend)
    finally:
        backend.close()


def test_fresh_sessions_after_a_restart_or_a_kill_prepare_the_statements_again(
    private: PostgresServer, app_name: str, table: str
) -> None:
    backend = PostgresBackend.from_url(_url(private, app_name, table) + "&max_connections=1")

    def prepared_on_the_pooled_session() -> set[str]:
        conn = backend.pool.getconn()
        try:
            with conn.cursor() as cursor:
                cursor.execute("SELECT name FROM pg_prepared_statements")
                return {name for (name,) in cursor.fetchall()}
        finally:
            conn.rollback()
            backend.pool.putconn(conn)

    try:
        _twenty_of_each(backend)
        names = prepared_on_the_pooled_session()
        # Every prepared kind _twenty_of_each runs: fenced grant, extend, inspect, is_held, release.
        assert len(names) == 5
        private.restart()
        _twenty_of_each(backend)
        assert prepared_on_the_pooled_session() == names
        assert _terminate(private, app_name) == 1
        _twenty_of_each(backend)
        assert prepared_on_the_pooled_session() == names
    finally:
        backend.close()


def test_server_down_is_backend_unavailable_then_recovers(
    private: PostgresServer, app_name: str, table: str
) -> None:
    backend = PostgresBackend.from_url(_url(private, app_name, table, password=True))
    try:
        assert backend.acquire_fenced("k0", TOKEN, 60, "o") is not None
        private.stop()
        try:
            for name, call in _every_call(backend, 0).items():
                with pytest.raises(BackendUnavailableError) as caught:
                    call()
                error = caught.value
                assert error.backend == "postgresql", name
                assert isinstance(error.__cause__, psycopg2.OperationalError), name
                assert "PostgreSQL" in str(error), name
                assert SECRET not in str(error) and SECRET not in repr(error), name
        finally:
            private.start()
        # Back up: the lease written before the outage is still ours.
        assert backend.is_held("k0", TOKEN)
        assert backend.release("k0", TOKEN)
    finally:
        backend.close()


def test_a_server_down_past_the_timeout_raises_the_outage(
    postgres_server: PostgresServer, app_name: str, table: str
) -> None:
    # Through a proxy that is then closed: every connection is cut and new ones are refused,
    # as when the server's host goes away.
    proxy = TcpProxy(postgres_server.host, postgres_server.port)
    url = _url(postgres_server, app_name, table).replace(f":{postgres_server.port}/", f":{proxy.port}/", 1)
    try:
        check_an_outage_past_the_timeout(f"{url}&connect_timeout=2", proxy.close)
    finally:
        proxy.close()


def test_unreachable_server_at_connect_keeps_the_password_out(table: str) -> None:
    url = f"postgresql://postgres:{SECRET}@127.0.0.1:1/db?connect_timeout=5&table={table}"
    with pytest.raises(BackendUnavailableError) as caught:
        lease_lock.connect(url)
    assert SECRET not in str(caught.value) and SECRET not in repr(caught.value)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://user:Sup%zzSecret@127.0.0.1/db",
        "postgresql://user:Sup%zzSecret@127.0.0.1:99x/db",
        f"postgresql://user:{SECRET}@127.0.0.1:99x/db",
        f"postgresql://user:{SECRET}@127.0.0.1:99999/db",
    ],
)
def test_dsn_errors_never_show_the_password(url: str) -> None:
    with pytest.raises(ValidationError) as caught:
        PostgresBackend.from_url(url)
    error: BaseException | None = caught.value
    while error is not None:
        for text in (str(error), repr(error)):
            assert "zzSecret" not in text and SECRET not in text, text
        error = error.__cause__ or error.__context__


def test_heartbeat_rides_over_killed_pooled_sessions(
    private: PostgresServer, app_name: str, table: str
) -> None:
    events: list[LockEvent] = []
    locker = lease_lock.connect(_url(private, app_name, table), ttl=3, on_event=events.append)
    try:
        lock = locker.acquire("held-through", extend_interval=0.5)
        backend: Any = locker.backend
        for _round in range(3):
            _fill_pool(backend, 10)
            extended = sum(event.type == "extended" for event in events)
            assert _terminate(private, app_name) >= 10
            assert wait_until(
                lambda extended=extended: sum(event.type == "extended" for event in events)
                >= extended + 2,
                30,
            ), [event.type for event in events]
        assert lock.state == "held"
        assert [event for event in events if event.type == "extend_failed"] == []
        for index in range(15):
            locker.acquire(f"after-{index}").release()
        assert lock.release()
    finally:
        locker.close()


def test_fences_keep_rising_after_the_sequence_restarts_or_is_dropped(
    postgres_server: PostgresServer, table: str
) -> None:
    backend = PostgresBackend.from_url(f"{postgres_server.url}?table={table}")
    try:
        first = backend.acquire_fenced("k", TOKEN, 60, "o")
        assert first is not None and backend.release("k", TOKEN)
        # The sequence was moved up to the fence, so a server clock stepped back later still
        # draws larger fences from it.
        assert _sql(postgres_server, f'SELECT last_value FROM "{table}_fence"')[0][0] >= first
        _sql(postgres_server, f'ALTER SEQUENCE "{table}_fence" RESTART WITH 1')
        second = backend.acquire_fenced("k", TOKEN, 60, "o")
        assert second is not None and second > first
        _sql(postgres_server, f'DROP SEQUENCE "{table}_fence"')
        # Taken over from a live holder while the sequence is missing: recreated, and larger.
        third = backend.acquire_fenced("k", OTHER, 60, "o")
        assert third is None
        assert backend.release("k", TOKEN)
        third = backend.acquire_fenced("k", OTHER, 60, "o")
        assert third is not None and third > second
        _sql(postgres_server, f'DROP SEQUENCE "{table}_fence"')
        # A take-over of an expired row beats the row's own fence too.
        _sql(postgres_server, f'UPDATE "{table}" SET expires_at = now() - interval \'1 s\'')
        fourth = backend.acquire_fenced("k", TOKEN, 60, "o")
        assert fourth is not None and fourth > third
    finally:
        backend.close()


def test_a_dropped_sequence_without_create_table_is_named(
    postgres_server: PostgresServer, table: str
) -> None:
    for statement in ddl(table):
        _sql(postgres_server, statement)
    backend = PostgresBackend.from_url(f"{postgres_server.url}?table={table}&create_table=false")
    try:
        assert backend.acquire_fenced("k", TOKEN, 60, "o") is not None
        _sql(postgres_server, f'DROP SEQUENCE "{table}_fence"')
        for _attempt in range(2):
            with pytest.raises(ValidationError, match=f'"{table}_fence" does not exist'):
                backend.acquire_fenced("k2", TOKEN, 60, "o")
        for statement in ddl(table):
            _sql(postgres_server, statement)
        assert backend.acquire_fenced("k2", TOKEN, 60, "o") is not None
    finally:
        backend.close()


def test_reads_of_a_mistyped_table_create_nothing(postgres_server: PostgresServer, table: str) -> None:
    backend = PostgresBackend.from_url(f"{postgres_server.url}?table={table}")
    try:
        reads: list[Callable[[], Any]] = [
            lambda: backend.inspect("k"),
            lambda: backend.is_held("k", TOKEN),
            lambda: list(backend.scan("")),
        ]
        for read in reads:
            with pytest.raises(ValidationError, match=f"table \"{table}\" does not exist"):
                read()
        found = _sql(
            postgres_server,
            "SELECT to_regclass(%s), to_regclass(%s), to_regclass(%s)",
            f'"{table}"', f'"{table}_fence"', f'"{table}_count"',
        )
        assert found == [(None, None, None)]
        # A write still creates the schema, and reads then work.
        assert backend.acquire("k", TOKEN, 60, "o")
        assert backend.inspect("k").held
    finally:
        backend.close()


def test_a_release_whose_reply_was_lost_after_commit_is_not_a_loss(
    postgres_server: PostgresServer, app_name: str, table: str
) -> None:
    proxy = TcpProxy(postgres_server.host, postgres_server.port)
    url = _url(postgres_server, app_name, table).replace(
        f":{postgres_server.port}/", f":{proxy.port}/", 1
    )
    backend = PostgresBackend.from_url(url)
    try:
        assert backend.acquire("k", TOKEN, 60, "o")
        # The release's DELETE sleeps in a trigger, so the test can hold its reply back.
        _sql(
            postgres_server,
            f"CREATE FUNCTION \"{table}_slow\"() RETURNS trigger LANGUAGE plpgsql AS"
            " 'BEGIN PERFORM pg_sleep(0.5); RETURN OLD; END'",
        )
        _sql(
            postgres_server,
            f'CREATE TRIGGER slow AFTER DELETE ON "{table}" FOR EACH ROW'
            f' EXECUTE FUNCTION "{table}_slow"()',
        )
        answers: list[bool] = []
        releaser = threading.Thread(target=lambda: answers.append(backend.release("k", TOKEN)))
        releaser.start()
        assert wait_until(
            lambda: _sql(
                postgres_server,
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
                " AND wait_event = 'PgSleep'",
                app_name,
            )[0][0] == 1,
            30,
        )
        proxy.stall()
        # The DELETE commits; its reply waits in the proxy, which then resets the connection.
        assert wait_until(
            lambda: _sql(postgres_server, f'SELECT count(*) FROM "{table}"')[0][0] == 0, 30
        )
        proxy.cut()
        proxy.resume()
        releaser.join(30)
        assert answers == [True]
    finally:
        backend.close()
        proxy.close()


def _child_cycles(backend: PostgresBackend, server: PostgresServer, table: str, index: int) -> int:
    """Grant and release keys many times; return how many answers the database contradicts."""
    check = psycopg2.connect(server.dsn)
    check.autocommit = True
    wrong = 0
    try:
        for cycle in range(60):
            key = f"fork-{cycle % 3}"
            token = f"c{index}-{cycle}-{uuid.uuid4().hex}"
            while (fence := backend.acquire_fenced(key, token, 30, f"child-{index}")) is None:
                time.sleep(0.001)
            with check.cursor() as cursor:
                cursor.execute(f'SELECT token, fence FROM "{table}" WHERE key = %s', (key,))
                if cursor.fetchall() != [(token, fence)]:
                    wrong += 1
            if not backend.release(key, token):
                wrong += 1
    finally:
        check.close()
    return wrong


def test_forked_children_never_use_the_parents_connection(
    postgres_server: PostgresServer, table: str
) -> None:
    backend = PostgresBackend.from_url(f"{postgres_server.url}?table={table}")
    try:
        check_forked_children_beside_the_parent(
            backend, lambda index: _child_cycles(backend, postgres_server, table, index), TOKEN
        )
    finally:
        backend.close()


def test_a_single_connection_is_refused_in_a_forked_child(
    postgres_server: PostgresServer, table: str
) -> None:
    conn = psycopg2.connect(postgres_server.dsn)
    backend = PostgresBackend(conn, table=table)
    try:
        assert backend.acquire("k", TOKEN, 60, "o")
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through the pipe
            try:
                backend.is_held("k", TOKEN)
                os.write(write, b"used the parent's connection")
            except ValidationError as exc:
                os.write(write, b"refused" if "fork()" in str(exc) else str(exc).encode())
            finally:
                os._exit(0)
        os.close(write)
        os.waitpid(pid, 0)
        with os.fdopen(read, "rb") as pipe:
            assert pipe.read() == b"refused"
        assert backend.release("k", TOKEN)
    finally:
        backend.close()
        conn.close()


def test_a_locker_built_before_fork_serves_every_child(postgres_server: PostgresServer, table: str) -> None:
    locker = lease_lock.connect(f"{postgres_server.url}?table={table}", fencing=True, ttl=30)
    try:
        locker.acquire("warm").release()

        def use_the_locker(_index: int) -> int:
            check = psycopg2.connect(postgres_server.dsn)
            check.autocommit = True
            wrong = 0
            for cycle in range(30):
                lock = locker.acquire(f"fork-{cycle % 3}", timeout=30)
                with check.cursor() as cursor:
                    cursor.execute(f'SELECT token, fence FROM "{table}" WHERE key = %s', (lock.key,))
                    wrong += cursor.fetchall() != [(lock.token, lock.fence)]
                wrong += not lock.release()
            return min(wrong, 90)

        children = fork_children(4, use_the_locker)
        for _cycle in range(30):
            locker.acquire("parent").release()
        assert exit_codes(children) == [0, 0, 0, 0]
    finally:
        locker.close()
