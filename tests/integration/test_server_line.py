"""Waiting acquisitions in the store's line: with ``Prefer: wait=N`` on a store that keeps a line
of waiters (Redis; PostgreSQL and etcd with ``direct_handoff``), a waiting request takes a place in the
key's line and a release hands it the key in the same atomic step. Real servers throughout: a
private redis-server, PostgreSQL and etcd, the service on waitress, clients over loopback HTTP.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable, NamedTuple

import psycopg2
import pytest
import requests
from lease_lock.backends.base import Backend
from lease_lock.backends.etcd import EtcdBackend
from lease_lock.backends.postgres import PostgresBackend
from lease_lock.backends.redis import RedisBackend, line_keys
from lease_lock.server import LockServiceApp, create_app
from lease_lock.testing import wait_until

from tests.support.etcd_server import EtcdCluster, line_places
from tests.support.http_server import ThreadedServer, make_keys, waiting_acquisition_then_leave
from tests.support.postgres_server import PostgresServer
from tests.support.redis_server import RedisServer


class Store:
    """The service's store, and how many places its line of ``key`` holds right now."""

    def __init__(self, backend: Backend, in_line: Callable[[str], int]) -> None:
        self.backend = backend
        self.in_line = in_line


@pytest.fixture(params=["redis", "postgres", "etcd"])
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    if request.param == "etcd":
        cluster: EtcdCluster = request.getfixturevalue("etcd_server")
        backend = EtcdBackend.from_url(cluster.url, direct_handoff=True)
        yield Store(backend, lambda key: len(line_places(cluster, key)))
    elif request.param == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        backend: Backend = RedisBackend.from_url(server.url)
        client = backend.client  # type: ignore[attr-defined]
        yield Store(backend, lambda key: int(client.llen(line_keys(key)[0])))
    else:
        postgres: PostgresServer = request.getfixturevalue("postgres_server")
        table = f"sl_{uuid.uuid4().hex[:12]}"
        backend = PostgresBackend.from_url(postgres.url, table=table, direct_handoff=True)
        admin = psycopg2.connect(postgres.url)
        admin.autocommit = True

        def in_line(key: str) -> int:
            with admin.cursor() as cursor:
                cursor.execute(f"SELECT count(*) FROM \"{table}_queue\" WHERE key = %s AND token <> ''", (key,))
                return int(cursor.fetchone()[0])

        yield Store(backend, in_line)
        admin.close()
    backend.close()


@pytest.fixture
def served(store: Store, tmp_path: Path) -> Iterator[tuple[LockServiceApp, str, dict[str, str]]]:
    keys_file = tmp_path / "keys.toml"
    keys = make_keys(keys_file)
    app = create_app(store.backend, keys_file, rate_limit=100_000, max_waits=12)
    with ThreadedServer(app, threads=16) as server:
        yield app, server.url, keys
    app.close()


def _session(api_key: str) -> requests.Session:
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {api_key}"
    return session


def _acquire(session: requests.Session, url: str, key: str, token: str, ttl: int = 30, **headers: str) -> Any:
    return session.post(
        f"{url}/locks/{key}/lease", json={"ttl_seconds": ttl}, headers={"X-Volcano-Lock-Token": token, **headers},
        timeout=60,
    )


def _release(session: requests.Session, url: str, key: str, token: str) -> None:
    answer = session.delete(f"{url}/locks/{key}/lease", headers={"X-Volcano-Lock-Token": token}, timeout=10)
    assert answer.status_code == 204, answer.text


def _read(session: requests.Session, url: str, key: str) -> Any:
    answer = session.get(f"{url}/locks/{key}", timeout=10)
    assert answer.status_code == 200, answer.text
    return answer.json()


def _store_key(key: str) -> str:
    return f"locks/alpha/{key}"


def _waiting(session: requests.Session, url: str, key: str, token: str, out: list[Any], wait: str) -> threading.Thread:
    thread = threading.Thread(
        target=lambda: out.append(_acquire(session, url, key, token, Prefer=f"wait={wait}")), daemon=True
    )
    thread.start()
    return thread


class Held(NamedTuple):
    """A fresh key of project alpha held through the service: the holder's session, token and
    grant, and a second session of the project's to wait with."""

    key: str
    holder: requests.Session
    token: str
    grant: Any
    waiter: requests.Session


@contextlib.contextmanager
def _held(url: str, keys: dict[str, str], ttl: int = 30) -> Iterator[Held]:
    key, token = f"line.{uuid.uuid4().hex[:12]}", str(uuid.uuid4())
    with _session(keys["alpha"]) as holder, _session(keys["alpha"]) as waiter:
        grant = _acquire(holder, url, key, token, ttl=ttl)
        assert grant.status_code == 201, grant.text
        yield Held(key, holder, token, grant, waiter)


def test_a_release_hands_the_key_to_the_request_waiting_in_line(
    served: tuple[LockServiceApp, str, dict[str, str]], store: Store
) -> None:
    app, url, keys = served
    with _held(url, keys) as (key, holder, first, held, waiter):
        answers: list[Any] = []
        thread = _waiting(waiter, url, key, str(uuid.uuid4()), answers, "20")
        # The request waits in the store's own line, not on a wake-up of this process.
        assert wait_until(lambda: store.in_line(_store_key(key)) == 1, 20)
        assert app.waits is not None and app.waits.waiting == 1
        _release(holder, url, key, first)
        thread.join(30)
        [answer] = answers
        assert answer.status_code == 201, answer.text
        assert answer.headers["Preference-Applied"] == "wait=20"
        assert float(answer.headers["X-Lease-Lock-Waited"]) >= 0
        assert answer.json()["fencing_token"] > held.json()["fencing_token"]
        # The handed key carries a full lease of the TTL asked for, not the short claim window.
        state = store.backend.inspect(_store_key(key))
        assert state.held and state.expires_in is not None and state.expires_in > 20
        assert _read(holder, url, key)["held"] is True
        assert store.in_line(_store_key(key)) == 0 and app.waits.waiting == 0


def test_a_wait_in_line_that_ends_unserved_is_a_409_and_leaves_the_line(
    served: tuple[LockServiceApp, str, dict[str, str]], store: Store
) -> None:
    app, url, keys = served
    with _held(url, keys) as (key, holder, first, _grant, waiter):
        answer = _acquire(waiter, url, key, str(uuid.uuid4()), Prefer="wait=0.5")
        assert answer.status_code == 409 and answer.json()["code"] == "lock_held"
        assert answer.headers["Preference-Applied"] == "wait=0.5"
        assert store.in_line(_store_key(key)) == 0 and app.waits is not None and app.waits.waiting == 0
        # The release that follows hands nothing to the request that left: the key is free.
        _release(holder, url, key, first)
        assert _read(holder, url, key) == {"held": False}


def test_a_holder_whose_lease_runs_out_is_followed_by_the_request_in_line(
    served: tuple[LockServiceApp, str, dict[str, str]], store: Store
) -> None:
    # A lease that runs out hands nothing over: the waiting request asks for the key itself
    # when the holder's lease (and its grace second) ends.
    _app, url, keys = served
    with _held(url, keys, ttl=5) as (key, _holder, _token, _grant, waiter):
        # Read after the clock starts: a grant before the lease's end would show as took < left
        # however slowly the machine runs (a bound from above would only measure the machine).
        began = time.monotonic()
        left = store.backend.inspect(_store_key(key)).expires_in
        answer = _acquire(waiter, url, key, str(uuid.uuid4()), Prefer="wait=20")
        took = time.monotonic() - began
        assert answer.status_code == 201, answer.text
        assert left is not None and took >= left


def test_a_request_whose_client_left_leaves_the_line_and_the_next_one_is_served(
    served: tuple[LockServiceApp, str, dict[str, str]], store: Store
) -> None:
    app, url, keys = served
    with _held(url, keys) as (key, holder, first, _grant, waiter):
        answers: list[Any] = []
        with waiting_acquisition_then_leave(url, keys["alpha"], key):
            assert wait_until(lambda: store.in_line(_store_key(key)) == 1, 20)
            thread = _waiting(waiter, url, key, str(uuid.uuid4()), answers, "30")
            assert wait_until(lambda: store.in_line(_store_key(key)) == 2, 20)
        # The client that left loses its place (and its waiting slot) within a quarter second.
        assert wait_until(lambda: store.in_line(_store_key(key)) == 1, 20)
        _release(holder, url, key, first)
        thread.join(30)
        [answer] = answers
        assert answer.status_code == 201, answer.text
        assert wait_until(lambda: app.waits is not None and app.waits.waiting == 0, 20)
        assert store.in_line(_store_key(key)) == 0


def test_many_requests_waiting_in_line_and_beyond_it_each_get_the_key_once_with_rising_fences(
    served: tuple[LockServiceApp, str, dict[str, str]], store: Store
) -> None:
    # Twelve waiting requests: the store's line takes eight of them (its bound per backend),
    # the others wait on the release notifications as before. Each holder releases at once.
    app, url, keys = served
    key = f"line.{uuid.uuid4().hex[:12]}"
    fences: list[int] = []
    failures: list[str] = []
    mutex = threading.Lock()
    holders: list[str] = []  # the token holding the key, by the answers: never two at once

    def take_turn() -> None:
        with _session(keys["alpha"]) as session:
            token = str(uuid.uuid4())
            answer = _acquire(session, url, key, token, Prefer="wait=30")
            if answer.status_code != 201:
                failures.append(answer.text)
                return
            with mutex:
                if holders:
                    failures.append(f"granted while {holders} held the key")
                holders.append(token)
                fences.append(answer.json()["fencing_token"])
            with mutex:
                holders.remove(token)  # before the release: the next grant can only follow it
            _release(session, url, key, token)

    with _session(keys["alpha"]) as holder:
        first = str(uuid.uuid4())
        assert _acquire(holder, url, key, first).status_code == 201
        threads = [threading.Thread(target=take_turn, daemon=True) for _ in range(12)]
        for thread in threads:
            thread.start()
        assert wait_until(lambda: app.waits is not None and app.waits.waiting == 12, 20)
        # A request counts as waiting once it has its place object; the store sees the place
        # at its first attempt in line, a moment later.
        assert wait_until(lambda: store.in_line(_store_key(key)) == 8, 20)
        _release(holder, url, key, first)
        for thread in threads:
            thread.join(60)
    assert not failures
    assert len(fences) == 12 and fences == sorted(fences) and len(set(fences)) == 12


@pytest.mark.parametrize("store", ["postgres"], indirect=True)
def test_one_shot_holders_hand_the_key_along_the_stores_line_through_bursts(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every release below comes inside the burst of a hand-over, and the store's line never
    # asks by itself before the requests' waits end: a release that told nobody would leave the
    # rest of the line to be served only when their waits end, by then one at a time (the first
    # to ask takes the key; the others are answered 409).
    monkeypatch.setattr("lease_lock.backends.postgres._backend.claim_for", lambda ttl: ttl)
    monkeypatch.setattr("lease_lock.backends.postgres._backend.BURST", 600.0)
    keys_file = tmp_path / "keys.toml"
    keys = make_keys(keys_file)
    app = create_app(store.backend, keys_file, rate_limit=100_000, max_waits=12, max_wait=120)
    answers: list[Any] = []

    def take_once(session: requests.Session) -> None:
        token = str(uuid.uuid4())
        answer = _acquire(session, url, key, token, ttl=600, Prefer="wait=30")
        answers.append(answer)
        if answer.status_code == 201:
            _release(session, url, key, token)

    with ThreadedServer(app, threads=16) as server, contextlib.ExitStack() as sessions:
        url = server.url
        with _held(url, keys, ttl=600) as (key, holder, first, _grant, _waiter):
            waiters = [sessions.enter_context(_session(keys["alpha"])) for _ in range(4)]
            threads = [threading.Thread(target=take_once, args=(session,), daemon=True) for session in waiters]
            for thread in threads:
                thread.start()
            assert wait_until(lambda: store.in_line(_store_key(key)) == len(waiters), 30)
            _release(holder, url, key, first)
            for thread in threads:
                thread.join(120)
        assert [answer.status_code for answer in answers] == [201] * len(waiters), [a.text for a in answers]
        assert not store.backend.inspect(_store_key(key)).held
    app.close()
