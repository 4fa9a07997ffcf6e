"""What every backend shares through a real store: the retry policy bounds a wait, a release
notification only brings the next attempt sooner, and a held lock that is dropped is warned
about and given back by the library.

Each test runs on memory, SQLite, a private redis-server, PostgreSQL, MongoDB and a
``lease-lock serve`` child, through ``connect()`` as a program would, with two Lockers (two
holders) on one store.
"""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest
from lease_lock import DroppedLockWarning, Locker, LockEvent, LockHeldError, MemoryBackend, Retry, RetryState, connect

from tests.support.http_server import ServiceInfo
from tests.support.mongo_server import MongoServer
from tests.support.postgres_server import PostgresServer

#: How long a test waits for anything that should happen within a second or so.
DEADLINE = 30.0

#: Makes a Locker on the store under test (every call: another holder of the same store).
Lockers = Callable[..., Locker]


@pytest.fixture(params=["memory", "sqlite", "redis", "postgres", "mongodb", "http"])
def lockers(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Lockers]:
    made: list[Locker] = []
    name = request.param
    if name == "memory":
        store = MemoryBackend()

        def make(**options: Any) -> Locker:
            return Locker(store, **options)

    else:
        if name == "sqlite":
            url, backend_options = f"sqlite:///{tmp_path / 'locks.db'}", {}
        elif name == "redis":
            url, backend_options = request.getfixturevalue("redis_server").url, {}
        elif name == "postgres":
            server: PostgresServer = request.getfixturevalue("postgres_server")
            url, backend_options = f"{server.url}?table=every_{uuid.uuid4().hex[:12]}", {}
        elif name == "mongodb":
            mongo: MongoServer = request.getfixturevalue("mongo_server")
            url, backend_options = mongo.url(request.getfixturevalue("mongo_database")), {}
        else:
            service: ServiceInfo = request.getfixturevalue("lock_service")
            url, backend_options = service.url, {"api_key": service.keys["alpha"]}

        def make(**options: Any) -> Locker:
            return connect(url, **backend_options, **options)

    def tracked(**options: Any) -> Locker:
        locker = make(**options)
        made.append(locker)
        return locker

    yield tracked
    for locker in made:
        locker.close()


def _key() -> str:
    return f"every-{uuid.uuid4().hex}"


class CountingDelay:
    """A delay function that records each call (by attempt number) and waits ``seconds``."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.attempts: list[int] = []

    def __call__(self, state: RetryState) -> float:
        self.attempts.append(state.attempt)
        return self.seconds


def test_retries_and_the_delay_function_bound_a_wait_for_a_held_key(lockers: Lockers) -> None:
    key = _key()
    holder, waiter = lockers(), lockers()
    held = holder.acquire(key, ttl=30)
    delay = CountingDelay(0.05)
    with pytest.raises(LockHeldError) as caught:
        waiter.acquire(key, retry=Retry(retries=3, delay=delay, timeout=60))
    # Four attempts, three waits, each one asked of the delay function: the retry count ended
    # the wait, not a notification-paced sleep nor the timeout.
    assert caught.value.reason == "held"
    assert caught.value.attempts == 4
    assert delay.attempts == [1, 2, 3]
    assert held.state == "held"
    held.release()


def test_the_lock_exposes_the_policy_merged_with_the_lockers(lockers: Lockers) -> None:
    delay = CountingDelay(0.05)
    locker = lockers(retry=Retry(retries=2, timeout=60))
    lock = locker.lock(_key(), retry=Retry(delay=delay))
    assert lock.retry == Retry(retries=2, delay=delay, timeout=60)
    # The policy shown is the one followed: two retries, each wait asked of the delay.
    held = lockers().acquire(lock.key, ttl=30)
    assert lock.acquire() is False
    assert delay.attempts == [1, 2]
    held.release()


def test_a_release_only_brings_the_next_attempt_sooner(lockers: Lockers) -> None:
    key = _key()
    holder = lockers()
    contended = threading.Event()
    acquired: list[LockEvent] = []

    def on_event(event: LockEvent) -> None:
        if event.type == "contended":
            contended.set()
        elif event.type == "acquired":
            acquired.append(event)

    waiter = lockers(on_event=on_event)
    held = holder.acquire(key, ttl=30)
    delay = CountingDelay(2.0)
    outcome: dict[str, object] = {}

    def wait() -> None:
        try:
            outcome["lock"] = waiter.acquire(key, retry=Retry(delay=delay, timeout=DEADLINE))
        except Exception as error:  # noqa: BLE001 - handed to the test thread
            outcome["error"] = error

    thread = threading.Thread(target=wait)
    thread.start()
    assert contended.wait(DEADLINE)
    held.release()
    thread.join(DEADLINE)
    assert not thread.is_alive()
    assert "error" not in outcome, outcome
    assert getattr(outcome["lock"], "state", None) == "held"
    # Every wait before the grant was one the policy allowed: one delay call per failed
    # attempt, whether a notification ended the wait early or not.
    assert acquired[0].attempts == len(delay.attempts) + 1
    assert delay.attempts == list(range(1, acquired[0].attempts))


def test_a_held_lock_that_is_dropped_is_warned_about_and_given_back(lockers: Lockers) -> None:
    key = _key()
    holder, other = lockers(), lockers()
    # The pattern the warning is for: the Lock that try_acquire() returned is dropped at once.
    said = re.escape(f"{key!r} that Locker.try_acquire() returned was dropped while held")
    with pytest.warns(DroppedLockWarning, match=said):
        assert holder.try_acquire(key, ttl=600)
    # Given back by the library (a 600 s lease cannot have run out): another holder takes it
    # well within the wait it is given.
    taken = other.acquire(key, timeout=DEADLINE)
    assert taken.state == "held"
    taken.release()


def test_closing_gives_back_a_dropped_held_lock(lockers: Lockers) -> None:
    key = _key()
    holder, other = lockers(), lockers()
    with pytest.warns(DroppedLockWarning, match=re.escape(repr(key))):
        assert holder.try_acquire(key, ttl=600) is not None
    holder.close()
    assert not other.get(key).held


def test_a_dropped_held_lock_is_given_back_on_the_heartbeat_thread() -> None:
    # On the memory store, whose calls can be watched: the release comes from the library's
    # heartbeat thread, never from the thread that dropped the lock (inside the collector).
    releases: list[str] = []

    class Watched(MemoryBackend):
        def release(self, key: str, token: str) -> bool:
            releases.append(threading.current_thread().name)
            return super().release(key, token)

    backend = Watched()
    with Locker(backend) as holder, Locker(backend) as other:
        with pytest.warns(DroppedLockWarning, match="'job'"):
            assert holder.try_acquire("job", ttl=600) is not None
        # Released by the library, not left to run out: the other holder gets it at once.
        lock = other.acquire("job", timeout=30)
        assert releases == ["lease-lock-heartbeat"]
        lock.release()
