"""The waiting rule on the stores that announce releases (Redis, PostgreSQL, etcd; with and
without the direct line): with the retry delay left unset, a waiter pauses until the release
or the holder's lease end, never polling. Counted in attempts (the ``contended`` and
``acquired`` events), never timed."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any, Callable

import pytest
from lease_lock import Locker, LockEvent, connect

from tests.support.postgres_server import PostgresServer

#: Makes a Locker on the store under test (every call: another holder of the same store).
Lockers = Callable[..., Locker]


@pytest.fixture(params=["redis", "postgres", "postgres-direct", "etcd", "etcd-direct"])
def lockers(request: pytest.FixtureRequest) -> Iterator[Lockers]:
    name = request.param
    if name == "redis":
        url = request.getfixturevalue("redis_server").url
    elif name.startswith("postgres"):
        server: PostgresServer = request.getfixturevalue("postgres_server")
        url = f"{server.url}?table=rule_{uuid.uuid4().hex[:12]}"
    else:
        url = request.getfixturevalue("etcd_server").url
    if name.endswith("-direct"):
        url += ("&" if "?" in url else "?") + "direct_handoff=true"
    made: list[Locker] = []

    def make(**options: Any) -> Locker:
        locker = connect(url, **options)
        made.append(locker)
        return locker

    yield make
    for locker in made:
        locker.close()


class Attempts:
    """The attempts one waiter's events report."""

    def __init__(self) -> None:
        self.events: list[LockEvent] = []
        self.contended = threading.Event()

    def __call__(self, event: LockEvent) -> None:
        self.events.append(event)
        if event.type == "contended":
            self.contended.set()

    def of(self, kind: str) -> list[LockEvent]:
        return [event for event in self.events if event.type == kind]


def test_a_default_waiter_asks_at_most_three_times_while_a_two_second_lease_runs_out(lockers: Lockers) -> None:
    key = f"rule-{uuid.uuid4().hex}"
    holder = lockers()
    attempts = Attempts()
    waiter = lockers(on_event=attempts)
    held = holder.acquire(key, ttl=2, auto_extend=False)
    lock = waiter.acquire(key, timeout=30)
    assert lock.state == "held"
    assert held.state != "held"
    # The refused first attempt, then the one the lease end brings (and at most one more).
    assert len(attempts.of("contended")) <= 2, [event.attempt for event in attempts.of("contended")]
    assert [event.attempts <= 3 for event in attempts.of("acquired")] == [True]
    lock.release()


def test_a_default_waiter_gets_the_key_at_the_release(lockers: Lockers) -> None:
    key = f"rule-{uuid.uuid4().hex}"
    holder = lockers()
    attempts = Attempts()
    waiter = lockers(on_event=attempts)
    held = holder.acquire(key, ttl=60)
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.append(waiter.acquire(key, timeout=30)))
    thread.start()
    assert attempts.contended.wait(30)
    held.release()
    thread.join(60)
    assert [lock.state for lock in got] == ["held"]
    # Not the lease end (a minute away) nor the timeout: the release brought the key.
    assert [event.attempts for event in attempts.of("acquired")] == [2]
    got[0].release()
