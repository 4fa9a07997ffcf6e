"""Listing, ``lease-lock ls`` and prefix force-release see lock keys only, under nested prefixes.

Two Lockers share a store, one under ``locks:`` and one under ``locks:eu:`` (inside the first).
While keys of both are held, waiters stand in line for them (PostgreSQL's direct hand-off keeps
places and burst rows, the lock service holds waiting requests) and counters count: the outer
listing shows exactly the held keys of both, the inner one only its own, and a prefix release
drops the inner keys and nothing the store keeps beside them. Runs on memory, SQLite,
PostgreSQL (with and without the direct hand-off) and the lock service over memory and over
PostgreSQL with the direct hand-off.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest
from lease_lock import Locker, MemoryBackend, connect
from lease_lock.admin import held_locks, release_prefix
from lease_lock.errors import LockHeldError
from lease_lock.testing import wait_until

from tests.support.events import Recorder
from tests.support.http_server import ServiceInfo, make_keys, start_serve, stop_serve
from tests.support.postgres_server import PostgresServer

Lockers = Callable[..., Locker]


@pytest.fixture(params=["memory", "sqlite", "postgres", "postgres-line", "http", "http-postgres-line"])
def lockers(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Lockers]:
    """Makes a Locker on the store under test with the given ``key_prefix`` (every call: another
    holder of the same store)."""
    made: list[Locker] = []
    name = request.param
    memory = MemoryBackend()
    options: dict[str, Any] = {}
    serving = None
    if name == "sqlite":
        url = f"sqlite:///{tmp_path / 'locks.db'}"
    elif name.startswith("postgres"):
        server: PostgresServer = request.getfixturevalue("postgres_server")
        url = f"{server.url}?table=nest_{uuid.uuid4().hex[:12]}"
        if name == "postgres-line":
            url += "&direct_handoff=true"
    elif name == "http":
        service: ServiceInfo = request.getfixturevalue("lock_service")
        url, options = service.url, {"api_key": service.keys["alpha"]}
    elif name == "http-postgres-line":
        server = request.getfixturevalue("postgres_server")
        keys_file = tmp_path / "keys.toml"
        store = f"{server.url}?table=nest_{uuid.uuid4().hex[:12]}&direct_handoff=true"
        options = {"api_key": make_keys(keys_file)["alpha"]}
        serving, url, _log = start_serve(tmp_path, store, keys_file, "--rate-limit", "1000000")
    else:
        url = ""

    def make(key_prefix: str, **more: Any) -> Locker:
        settings = dict(key_prefix=key_prefix, ttl=30, **more)
        locker = Locker(memory, **settings) if not url else connect(url, **settings, **options)
        made.append(locker)
        return locker

    try:
        yield make
    finally:
        for locker in made:
            locker.close()
        if serving is not None:
            stop_serve(serving)


def _keys(states: Iterator[Any]) -> list[str]:
    """The keys listed (``Locker.list`` names them with the locker's ``key_prefix``)."""
    return sorted(state.key for state in states)


def test_listing_and_prefix_release_see_only_lock_keys_under_nested_prefixes(lockers: Lockers) -> None:
    outer, inner = lockers("locks:"), lockers("locks:eu:")
    events = Recorder()
    waiters = [lockers("locks:", on_event=events), lockers("locks:eu:", on_event=events)]
    held = [outer.acquire("a"), inner.acquire("b"), inner.acquire("c")]
    # Waiters stand in line for a key of each namespace, and the first holder hands its key on
    # (a burst on the direct hand-off's stores).
    results: list[Any] = []

    def wait(locker: Locker, key: str) -> None:
        try:
            lock = locker.acquire(key, timeout=60)
        except LockHeldError as error:
            results.append(error)
            return
        results.append(lock)

    threads = [threading.Thread(target=wait, args=(locker, key)) for locker, key in zip(waiters, "ab")]
    for thread in threads:
        thread.start()
    try:
        assert events.wait_for("contended", 2)  # both wait (in line, where the store keeps one)
        count = getattr(outer.backend, "count_in_window", None)
        if count is not None:  # a counter named like a key of the outer namespace
            count("locks:n", 60)
        assert _keys(outer.list()) == ["locks:a", "locks:eu:b", "locks:eu:c"]
        assert _keys(inner.list()) == ["locks:eu:b", "locks:eu:c"]
        held[0].release()
        assert wait_until(lambda: len(results) == 1, 30)
        assert _keys(outer.list()) == ["locks:a", "locks:eu:b", "locks:eu:c"]
        assert [state.key for state in held_locks(outer)] == ["a", "eu:b", "eu:c"]
        assert [state.key for state in held_locks(outer, "eu:")] == ["eu:b", "eu:c"]
        assert [state.key for state in held_locks(inner)] == ["b", "c"]
        # Forcing the inner namespace's keys free drops them and nothing else (the waiter for
        # "b" then takes it: a held lock again, of the inner namespace).
        lines: list[str] = []
        assert release_prefix(outer, "eu:", confirm=None, write=lines.append) == 2
        assert wait_until(lambda: len(results) == 2, 30)
        assert _keys(outer.list()) == ["locks:a", "locks:eu:b"]
        assert [state.key for state in held_locks(inner)] == ["b"]
    finally:
        for item in results:
            if not isinstance(item, LockHeldError):
                item.release()
        for lock in held:
            if lock.state == "held":
                lock.release()
        for thread in threads:
            thread.join(60)
    assert _keys(outer.list()) == []
