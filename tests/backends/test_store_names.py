"""No lock key reaches the store's own structures, on any backend.

A lock held under the name of one of another key's auxiliary structures (the Redis fence counter,
waiting marker and wake list; the PostgreSQL and SQLite side tables and notification channels)
must survive waits on that key and its releases, and those must not fail. Where a name is one
the backend keeps for itself, it is refused as a lock key instead (Redis, and the lock service
over Redis). Real stores throughout: SQLite files, a private PostgreSQL and Redis, a waitress
server.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Callable

import pytest
import requests
from lease_lock import Locker
from lease_lock.backends.base import Backend
from lease_lock.backends.memory import MemoryBackend
from lease_lock.backends.postgres import PostgresBackend
from lease_lock.backends.redis import RedisBackend
from lease_lock.backends.sqlite import SqliteBackend
from lease_lock.server import create_app

from tests.support.handoff import hand_over
from tests.support.http_server import ThreadedServer, make_keys
from tests.support.postgres_server import PostgresServer
from tests.support.redis_server import RedisServer


def _names_beside(key: str, table: str) -> list[str]:
    """Names a store could derive from ``key`` or from its table, as lock keys."""
    return [
        f"{{{key}}}:fence", f"{{{key}}}:waiting", f"{{{key}}}:wake", f"{key}:fence", f"{key}:waiting",
        f"{key}:wake", f"{table}_fence", f"{table}_count", f"{table}_freed", f"{table}_turns",
        f"{table}_woken", "lease_lock_fences", "lease_lock_counters",
    ]


def _waits_and_releases(make_locker: Callable[[], Locker], key: str, rounds: int = 3) -> None:
    """A holder and a waiter in separate lockers hand ``key`` over ``rounds`` times."""
    holder, waiter = make_locker(), make_locker()
    try:
        hand_over(holder, waiter, key, rounds)
    finally:
        holder.close()
        waiter.close()


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def backend_maker(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[Callable[[], Backend], str]]:
    """A factory of backends on one store, and the store's table name (for derived names)."""
    made: list[Backend] = []
    if request.param == "memory":
        shared = MemoryBackend()
        yield (lambda: shared), "lease_lock"
        return
    if request.param == "sqlite":
        path = tmp_path / "locks.db"

        def sqlite() -> Backend:
            made.append(SqliteBackend(path))
            return made[-1]

        yield sqlite, "lease_lock"
    else:
        server: PostgresServer = request.getfixturevalue("postgres_server")
        table = f"names_{uuid.uuid4().hex[:12]}"

        def postgres() -> Backend:
            made.append(PostgresBackend.from_url(server.url, table=table))
            return made[-1]

        yield postgres, table
    for backend in made:
        backend.close()


def test_a_lock_named_like_a_derived_structure_survives_waits_and_releases_of_its_key(
    backend_maker: tuple[Callable[[], Backend], str],
) -> None:
    make, table = backend_maker
    key = f"names:{uuid.uuid4().hex}"
    squatter = Locker(make(), ttl=60)
    held = {name: squatter.acquire(name) for name in _names_beside(key, table)}
    try:
        _waits_and_releases(lambda: Locker(make(), ttl=30), key)
        for name, lock in held.items():
            assert lock.state == "held", name
            state = squatter.backend.inspect(name)
            assert state.held and state.owner == squatter.owner, name
    finally:
        for lock in held.values():
            lock.release()
        squatter.close()


def test_the_service_refuses_keys_its_store_keeps_for_itself(redis_server: RedisServer, tmp_path: Path) -> None:
    # A key prefix with a hash tag puts every store key of the service in one Cluster slot, and
    # makes "<key>:fence" the store name of the fence counter of "<key>": a lock there would
    # break every fenced grant of "<key>". Such keys are refused (400) before anything is written.
    keys_file = tmp_path / "keys.toml"
    keys = make_keys(keys_file)
    backend = RedisBackend.from_url(redis_server.url)
    app = create_app(backend, keys_file, rate_limit=1000, key_prefix="{locks}/")
    key = f"job{uuid.uuid4().hex[:8]}"
    try:
        with ThreadedServer(app) as server, requests.Session() as session:
            session.headers["Authorization"] = f"Bearer {keys['alpha']}"

            def acquire(name: str) -> requests.Response:
                return session.post(
                    f"{server.url}/locks/{name}/lease",
                    json={"ttl_seconds": 30},
                    headers={"X-Volcano-Lock-Token": str(uuid.uuid4())},
                    timeout=10,
                )

            for suffix in (":fence", ":waiting", ":wake"):
                answer = acquire(key + suffix)
                assert answer.status_code == 400 and answer.json()["code"] == "invalid_key", answer.text
                assert not backend.inspect(f"{{locks}}/alpha/{key}{suffix}").held
            # The key itself and names that only look similar stay usable.
            for name in (key, f"{key}:fence:1", f"{key}-wake"):
                assert acquire(name).status_code == 201, name
    finally:
        app.close()
        backend.close()
