"""PostgreSQL under stress and faults: fence order, killed sessions, a restarted server."""

from __future__ import annotations

import random
import threading
import time
import uuid
from typing import Any, Iterator

import lease_lock
import psycopg2
import pytest
from lease_lock.backends.postgres import PostgresBackend
from lease_lock.errors import BackendUnavailableError
from lease_lock.testing import wait_until

from tests.support.events import Recorder
from tests.support.postgres_server import PostgresServer

TOKEN = "t" * 32
OTHER = "o" * 32


def _admin(server: PostgresServer) -> Any:
    conn = psycopg2.connect(server.dsn)
    conn.autocommit = True
    return conn


def _terminate(server: PostgresServer, application_name: str) -> int:
    """Kill every session with this application_name; returns how many were killed."""
    conn = _admin(server)
    try:
        with conn.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE application_name = %s",
                (application_name,),
            )
            return int(cursor.fetchone()[0])
    finally:
        conn.close()


def _answer(call: Any) -> Any:
    """The call's answer, or None while the backend reports the server unavailable."""
    try:
        return call()
    except BackendUnavailableError:
        return None


@pytest.fixture
def app_name() -> str:
    return f"ll-fault-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def backend(postgres_server: PostgresServer, app_name: str) -> Iterator[PostgresBackend]:
    backend = PostgresBackend.from_url(f"{postgres_server.url}?application_name={app_name}")
    yield backend
    backend.close()


@pytest.mark.slow
def test_fences_rise_in_grant_order_under_concurrency(postgres_server: PostgresServer) -> None:
    """16 threads x 100 grants of one key: no overlap, and fences rise in grant order.

    Every other hold is released the moment it is granted, so releases and fresh grants
    interleave as tightly as they can; that is where a fence drawn before the row lock would
    come out of order.
    """
    threads_count, grants_each = 16, 100
    backend = PostgresBackend.from_url(postgres_server.url, max_connections=threads_count)
    key = f"fence-race:{uuid.uuid4().hex}"
    guard = threading.Lock()
    holder: list[str] = []
    fences: list[int] = []
    overlaps: list[tuple[str, str]] = []
    failures: list[Exception] = []
    start = threading.Barrier(threads_count)

    def worker(index: int) -> None:
        try:
            start.wait()
            for grant in range(grants_each):
                token = f"w{index:02d}-{grant:03d}-{uuid.uuid4().hex}"
                while (fence := backend.acquire_fenced(key, token, 60, f"worker-{index}")) is None:
                    # Contenders back off a little, as real waiters do; a hot spin only
                    # starves the holder's release of CPU on a small machine.
                    time.sleep(random.uniform(0.001, 0.004))
                with guard:
                    if holder:
                        overlaps.append((holder[0], token))
                    holder[:] = [token]
                    fences.append(fence)
                if grant % 2:
                    time.sleep(0.001)
                with guard:
                    holder.clear()
                assert backend.release(key, token)
        except Exception as exc:  # noqa: BLE001 -- a worker's failure is asserted on below
            failures.append(exc)

    workers = [threading.Thread(target=worker, args=(index,)) for index in range(threads_count)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join(110)
    backend.close()
    assert not failures, failures[:3]
    assert overlaps == []
    assert len(fences) == threads_count * grants_each
    inversions = [(a, b) for a, b in zip(fences, fences[1:]) if b <= a]
    assert inversions == []


def test_killed_session_while_held(
    postgres_server: PostgresServer, backend: PostgresBackend, app_name: str
) -> None:
    fence = backend.acquire_fenced("k", TOKEN, 60, "o")
    assert fence is not None
    assert _terminate(postgres_server, app_name) >= 1
    # The dead pooled connection is found broken, dropped, and the call retried on a fresh
    # one: the lease (a committed row) is still ours, and nobody else's.
    assert backend.is_held("k", TOKEN)
    assert backend.acquire("k", OTHER, 60, "o") is False
    assert backend.inspect("k").fence == fence
    assert backend.release("k", TOKEN)


def test_listener_reconnects_after_its_session_is_killed(
    postgres_server: PostgresServer, backend: PostgresBackend, app_name: str
) -> None:
    heard: list[str] = []
    watcher = backend.watch_releases(heard.append)
    try:
        assert wait_until(lambda: watcher.active, 30)
        first_pid = watcher.backend_pid
        assert _terminate(postgres_server, f"{app_name} listener") == 1
        assert wait_until(lambda: watcher.backend_pid not in (None, first_pid), 30)
        assert backend.acquire("k", TOKEN, 60, "o")
        assert backend.release("k", TOKEN)
        assert wait_until(lambda: "k" in heard, 30)
    finally:
        watcher.close()
    assert not watcher.active and watcher.backend_pid is None


# Without the direct hand-off a waiter is woken through the backend's listener; with it, it waits
# in the key's line, on a listening connection of its own ("line").
@pytest.mark.parametrize("connection", ["listener", "line"])
def test_waiter_gets_the_key_when_its_waiting_connection_was_killed(
    postgres_server: PostgresServer, app_name: str, connection: str
) -> None:
    direct = "true" if connection == "line" else "false"
    url = f"{postgres_server.url}?application_name={app_name}&direct_handoff={direct}"
    holder_locker = lease_lock.connect(url, ttl=30)
    waiter_locker = lease_lock.connect(url, ttl=30)
    key = f"handoff:{uuid.uuid4().hex}"
    try:
        lock = holder_locker.acquire(key)
        outcome: list[Any] = []
        waiter = threading.Thread(
            target=lambda: outcome.append(waiter_locker.acquire(key, timeout=60)), daemon=True
        )
        waiter.start()
        # The waiter connects before its first wait; kill that session mid-wait.
        assert wait_until(lambda: _terminate(postgres_server, f"{app_name} {connection}") >= 1, 30)
        lock.release()
        waiter.join(60)
        assert len(outcome) == 1 and outcome[0].state == "held"
        outcome[0].release()
    finally:
        holder_locker.close()
        waiter_locker.close()


@pytest.mark.slow
def test_server_restart_keeps_leases_and_never_double_grants(
    postgres_private_server: PostgresServer,
) -> None:
    server = postgres_private_server
    backend = PostgresBackend.from_url(server.url)
    heard: list[str] = []
    watcher = backend.watch_releases(heard.append)
    try:
        fence = backend.acquire_fenced("k", TOKEN, 120, "o")
        assert fence is not None and wait_until(lambda: watcher.active, 30)
        server.restart()
        assert wait_until(lambda: _answer(lambda: backend.is_held("k", TOKEN)) is True, 30)
        assert backend.acquire_fenced("k", OTHER, 120, "o") is None
        assert wait_until(lambda: watcher.active, 30), "the listener reconnects"
        assert backend.release("k", TOKEN)
        assert wait_until(lambda: "k" in heard, 30)
        later = backend.acquire_fenced("k", OTHER, 120, "o")
        assert later is not None and later > fence
    finally:
        watcher.close()
        backend.close()


@pytest.mark.slow
def test_locker_lock_survives_restart_or_reads_lost(
    postgres_private_server: PostgresServer,
) -> None:
    server = postgres_private_server
    events = Recorder()
    locker = lease_lock.connect(server.url, ttl=3, fencing=True, on_event=events)
    rival = PostgresBackend.from_url(server.url)
    key = f"restart:{uuid.uuid4().hex}"
    try:
        lock = locker.acquire(key)
        server.restart()
        restarted = len(events.events)
        # The heartbeat has renewed (or failed to) across the outage; the rival's pool replaces
        # the connection the restart cut as it asks.
        assert wait_until(
            lambda: any(event.type in ("extended", "extend_failed", "lost") for event in events.events[restarted:]),
            60,
        )
        assert wait_until(lambda: _answer(lambda: rival.inspect(key)) is not None, 30)
        grabbed = rival.acquire(key, OTHER, 30, "rival")
        if lock.state == "held":
            assert grabbed is False, "a held lock must never be granted to another"
            assert wait_until(lambda: _answer(lambda: rival.is_held(key, lock.token)) is True, 30)
        else:
            assert lock.state == "lost"
    finally:
        locker.close()
        rival.close()
