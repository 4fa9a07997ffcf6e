"""Counting keys (limit > 1) on PostgreSQL: what the contract suite cannot see (concurrent grants
on a real server, a table made by an earlier release, the release announcement, the sweep)."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from lease_lock.backends.postgres import PostgresBackend, ddl
from lease_lock.errors import ValidationError
from lease_lock.testing import wait_until

from tests.support.postgres_server import PostgresServer, sql


def _token() -> str:
    return uuid.uuid4().hex





def _live_places(admin: Any, table: str, key: str) -> int:
    return int(
        sql(
            admin,
            f'SELECT count(*) FROM "{table}_place" AS p JOIN "{table}" AS l USING (key) WHERE p.key = %s'
            " AND l.token LIKE '#%%' AND l.expires_at > clock_timestamp() AND p.expires_at > clock_timestamp()",
            key,
        )[0][0]
    )


def test_racing_grants_never_exceed_the_limit(postgres_server: PostgresServer, admin: Any, table: str) -> None:
    backend = PostgresBackend.from_url(postgres_server.url, table=table, max_connections=8)
    try:
        key = "raced"
        start = threading.Barrier(8)
        granted: list[int] = []

        def ask() -> None:
            start.wait(30)
            fence = backend.acquire_counted(key, _token(), 30, "o", 3)
            if fence is not None:
                granted.append(fence)

        threads = [threading.Thread(target=ask) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert len(granted) == 3 and len(set(granted)) == 3
        assert _live_places(admin, table, key) == 3
    finally:
        backend.close()


def test_grants_and_releases_in_a_crowd_stay_within_the_limit(
    postgres_server: PostgresServer, admin: Any, table: str
) -> None:
    for statement in ddl(table):
        sql(admin, statement)  # before the watching thread reads it
    backend = PostgresBackend.from_url(postgres_server.url, table=table, max_connections=6)
    key = "crowded"
    stop = threading.Event()
    fences: list[int] = []
    seen: list[int] = []

    def work() -> None:
        token = _token()
        while not stop.is_set():
            fence = backend.acquire_counted(key, token, 30, "o", 2)
            if fence is not None:
                fences.append(fence)
                assert backend.release(key, token)

    def watch() -> None:
        while not stop.is_set():
            seen.append(_live_places(admin, table, key))

    threads = [threading.Thread(target=work) for _ in range(5)] + [threading.Thread(target=watch)]
    try:
        for thread in threads:
            thread.start()
        assert wait_until(lambda: len(fences) >= 60, 60)
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
        backend.close()
    assert max(seen) <= 2
    assert len(set(fences)) == len(fences), "every grant has a fence of its own"


def _race(backend: PostgresBackend, key: str) -> tuple[list[bool], list[int]]:
    """Six threads ask for the free ``key`` at once: two with acquire, two with acquire_fenced,
    two for a place of limit 3; what the exclusive ones got, and the places' fences."""
    start = threading.Barrier(6)
    exclusive: list[bool] = []
    counted: list[int] = []

    def grab(kind: int) -> None:
        start.wait(30)
        if kind == 0:
            exclusive.append(backend.acquire(key, _token(), 30, "o"))
        elif kind == 1:
            exclusive.append(backend.acquire_fenced(key, _token(), 30, "o") is not None)
        else:
            try:
                fence = backend.acquire_counted(key, _token(), 30, "o", 3)
            except ValidationError:
                return  # an exclusive grant came first
            if fence is not None:
                counted.append(fence)

    threads = [threading.Thread(target=grab, args=(index % 3,)) for index in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return exclusive, counted


def test_exclusive_and_counting_grants_racing_for_a_free_key_never_share_it(
    postgres_server: PostgresServer, table: str
) -> None:
    backend = PostgresBackend.from_url(postgres_server.url, table=table, max_connections=6)
    try:
        for round_ in range(10):
            key = f"mixed:{round_}"
            exclusive, counted = _race(backend, key)
            state = backend.inspect(key)
            if any(exclusive):
                assert exclusive.count(True) == 1 and not counted and state.limit == 1
            else:
                assert 1 <= len(counted) <= 2 and state.limit == 3 and len(state.holders) == len(counted)
    finally:
        backend.close()


def test_a_table_from_an_earlier_release_keeps_working(
    postgres_server: PostgresServer, admin: Any, table: str
) -> None:
    for statement in ddl(table):
        if "_place" not in statement:
            sql(admin, statement)
    backend = PostgresBackend.from_url(postgres_server.url, table=table, create_table=False)
    try:
        token = _token()
        assert backend.acquire_fenced("k", token, 30, "o") is not None
        assert backend.is_held("k", token) and not backend.is_held("k", _token())
        assert backend.extend("k", token, 30) and not backend.extend("k", _token(), 30)
        assert backend.inspect("k").held and [state.key for state in backend.scan("")] == ["k"]
        assert backend.release("k", token) and not backend.release("k", token)
        with pytest.raises(ValidationError, match=f'table "{table}_place" does not exist'):
            backend.acquire_counted("c", _token(), 30, "o", 2)
        assert not backend.inspect("c").held
        # Running the DDL again adds the table, and the next counting grant uses it.
        for statement in ddl(table):
            sql(admin, statement)
        assert backend.acquire_counted("c", _token(), 30, "o", 2) is not None
    finally:
        backend.close()
    # A backend that may create tables adds it by itself.
    sql(admin, f'DROP TABLE "{table}_place"')
    creating = PostgresBackend.from_url(postgres_server.url, table=table)
    try:
        assert creating.acquire_counted("d", _token(), 30, "o", 2) is not None
    finally:
        creating.close()


def test_a_place_release_is_announced(postgres_server: PostgresServer, table: str) -> None:
    backend = PostgresBackend.from_url(postgres_server.url, table=table)
    try:
        first, second = _token(), _token()
        assert backend.acquire_counted("k", first, 30, "o", 2) is not None
        assert backend.acquire_counted("k", second, 30, "o", 2) is not None
        heard: list[str] = []
        watcher = backend.watch_releases(heard.append)
        assert wait_until(lambda: watcher.active, 30)
        assert backend.release("k", first)
        assert wait_until(lambda: heard == ["k"], 30)
        assert backend.inspect("k").held, "the other place holds the key"
        watcher.close()
    finally:
        backend.close()


def test_places_with_direct_handoff(postgres_server: PostgresServer, table: str) -> None:
    backend = PostgresBackend.from_url(postgres_server.url, table=table, direct_handoff=True)
    try:
        tokens = [_token() for _ in range(2)]
        for token in tokens:
            assert backend.acquire_counted("k", token, 30, "o", 2) is not None
        assert backend.acquire_counted("k", _token(), 30, "o", 2) is None
        assert backend.release("k", tokens[0]) and not backend.is_held("k", tokens[0])
        assert backend.force_release("k") and not backend.is_held("k", tokens[1])
        assert not backend.inspect("k").held
    finally:
        backend.close()


def test_sweep_deletes_ended_places(postgres_server: PostgresServer, admin: Any, table: str) -> None:
    backend = PostgresBackend.from_url(postgres_server.url, table=table)
    try:
        short, long = _token(), _token()
        assert backend.acquire_counted("k", short, 0.2, "o", 2) is not None
        assert backend.acquire_counted("k", long, 60, "o", 2) is not None
        assert wait_until(lambda: len(backend.inspect("k").holders) == 1, 10)
        backend.sweep_expired()
        assert sql(admin, f'SELECT token FROM "{table}_place"') == [(long,)]
    finally:
        backend.close()
