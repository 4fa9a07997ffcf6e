"""``wait_for_replicas`` against a real primary and a real replica (``--replicaof``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from lease_lock.backends.redis import RedisBackend
from lease_lock.errors import ReplicationError
from lease_lock.locker import Locker
from lease_lock.testing import wait_until

from tests.backends.test_redis_faults import Recorder
from tests.support.redis_server import RedisFactory, RedisServer

TOKEN = "r" * 32


@pytest.fixture(scope="module")
def pair(redis_factory: RedisFactory) -> tuple[RedisServer, RedisServer]:
    primary = redis_factory.server()
    return primary, redis_factory.replica(primary)


@pytest.fixture
def key() -> str:
    return f"replica:{uuid.uuid4().hex}"


@pytest.fixture
def replicated(pair: tuple[RedisServer, RedisServer]) -> Iterator[RedisBackend]:
    backend = RedisBackend.from_url(pair[0].url, wait_for_replicas=(1, 5.0))
    yield backend
    backend.close()


@pytest.fixture
def too_many(pair: tuple[RedisServer, RedisServer]) -> Iterator[RedisBackend]:
    # Two replicas asked for, one running: WAIT times out with one acknowledgement.
    backend = RedisBackend.from_url(f"{pair[0].url}?wait_for_replicas=2,100ms")
    yield backend
    backend.close()


def test_acquire_and_extend_reach_the_replica(
    pair: tuple[RedisServer, RedisServer], replicated: RedisBackend, key: str
) -> None:
    replica = pair[1].client()
    try:
        fence = replicated.acquire_fenced(key, TOKEN, 30, "o")
        assert fence is not None
        # WAIT returned only after the replica had the grant: it is there at once.
        assert replica.get(key) == f"{TOKEN}|{fence}|o".encode()
        assert replicated.extend(key, TOKEN, 120)
        assert replica.pttl(key) > 60_000
        assert replicated.extend_many([]) == []
    finally:
        replica.close()


def test_too_few_replicas_gives_the_acquisition_back(too_many: RedisBackend, key: str) -> None:
    with pytest.raises(ReplicationError) as caught:
        too_many.acquire(key, TOKEN, 30, "o")
    assert caught.value.replicas == 2 and caught.value.acknowledged == 1
    assert caught.value.code == "LOCK_REPLICATION"
    assert not too_many.inspect(key).held


def test_too_few_replicas_keeps_the_extended_lock(
    replicated: RedisBackend, too_many: RedisBackend, key: str
) -> None:
    assert replicated.acquire(key, TOKEN, 5, "o")
    with pytest.raises(ReplicationError):
        too_many.extend(key, TOKEN, 60)
    # The write itself went through; only its durability is in doubt.
    state = too_many.inspect(key)
    assert state.held and state.expires_in is not None and state.expires_in > 30
    assert too_many.is_held(key, TOKEN)


def test_heartbeat_reports_replication_failures(
    pair: tuple[RedisServer, RedisServer], replicated: RedisBackend, key: str
) -> None:
    events = Recorder()
    locker = Locker(replicated, on_event=events)
    lock = locker.acquire(key, ttl=3, extend_interval=0.5)
    replica = pair[1].client()
    try:
        # Stop the replica from acknowledging: the heartbeat's WAIT now times out.
        replica.execute_command("CLIENT", "PAUSE", 1500, "ALL")
        replicated.wait_for_replicas = (1, 0.2)
        assert events.wait_for("extend_failed", timeout=10), events.types()
        failed = next(event for event in events.events if event.type == "extend_failed")
        assert isinstance(failed.error, ReplicationError)
        assert lock.state == "held"
        # Once the replica answers again the heartbeat's retries succeed.
        assert wait_until(
            lambda: events.types()[-1] == "extended" and lock.state == "held", 10
        ), events.types()
        assert lock.release()
    finally:
        replica.close()
        locker.close()
