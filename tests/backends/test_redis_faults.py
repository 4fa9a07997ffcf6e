"""The Redis backend under the Locker, on private servers a test may restart or cut off."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import lease_lock
import pytest
from benchmarks.chaos_harness.proxy import TcpProxy
from lease_lock.backends.redis import RedisBackend
from lease_lock.locker import Locker
from lease_lock.testing import wait_until
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.support.events import Recorder
from tests.support.redis_server import RedisServer


@pytest.fixture
def key() -> str:
    return f"fault:{uuid.uuid4().hex}"


def quick_client(port: int) -> Any:
    """A client that fails within a second instead of retrying for seconds (redis-py >= 6)."""
    import redis

    return redis.Redis(
        host="127.0.0.1",
        port=port,
        socket_timeout=1.0,
        socket_connect_timeout=1.0,
        retry=Retry(NoBackoff(), 0),
    )


def test_handoff_wakes_the_waiter_at_the_release(redis_server: RedisServer, key: str) -> None:
    # Counted, not timed. Unwoken, a waiter looks again after the holder's remaining lease or
    # its retry delay, whichever is shorter; with both past the waiter's 20 s timeout, only
    # the release can bring its second attempt, which must then take the key.
    holder = lease_lock.connect(redis_server.url, ttl=30)
    events = Recorder()
    waiter = lease_lock.connect(
        redis_server.url, ttl=30, on_event=events, retry=lease_lock.Retry(delay=60, timeout=20)
    )
    try:
        lock = holder.acquire(key)
        thread = threading.Thread(target=lambda: waiter.acquire(key, timeout=20).release())
        thread.start()
        # Release only once the waiter has tried and is waiting on the holder's lease.
        assert events.wait_for("contended")
        assert lock.release()
        thread.join(60)
        assert events.wait_for("acquired"), f"the waiter never acquired: {events.types()}"
        acquired = [event for event in events.events if event.type == "acquired"]
        assert [event.attempts for event in acquired] == [2], events.types()
        assert events.types().count("contended") == 1
    finally:
        holder.close()
        waiter.close()


def test_expiry_without_release_wakes_the_waiter_by_the_lease_end(
    redis_server: RedisServer, key: str
) -> None:
    holder = lease_lock.connect(redis_server.url)
    waiter = lease_lock.connect(redis_server.url)
    try:
        holder.acquire(key, ttl=0.6, auto_extend=False)
        start = time.monotonic()
        with waiter.acquire(key, timeout=20) as lock:
            assert lock.state == "held"
        assert time.monotonic() - start < 5
    finally:
        holder.close()
        waiter.close()


def test_restart_without_persistence(private_redis_server: RedisServer, key: str) -> None:
    events = Recorder()
    holder = Locker(RedisBackend(quick_client(private_redis_server.port)), fencing=True, on_event=events)
    other = Locker(RedisBackend(quick_client(private_redis_server.port)), fencing=True)
    try:
        lock = holder.acquire(key, ttl=3)
        first = lock.fence
        private_redis_server.restart()
        # The next heartbeat finds the key gone: the holder reads lost within its lease.
        assert lock.lost.wait(3)
        assert lock.lost_reason in {"extend", "extend-failed", "late-extend"}
        second = other.acquire(key, ttl=30)
        assert first is not None and second.fence is not None and second.fence > first
        second.release()
    finally:
        holder.close()
        other.close()


def test_connection_cut_mid_extension_then_recovery(
    private_redis_server: RedisServer, key: str
) -> None:
    proxy = TcpProxy("127.0.0.1", private_redis_server.port)
    events = Recorder()
    locker = Locker(RedisBackend(quick_client(proxy.port)), on_event=events)
    try:
        lock = locker.acquire(key, ttl=6, extend_interval=1)
        # Hold every byte, then reset the connection: the extension in flight fails, and the
        # retries time out on a silent network until it flows again.
        proxy.stall()
        proxy.cut()
        assert events.wait_for("extend_failed", timeout=10), events.types()
        assert lock.state == "held"
        proxy.resume()
        extended = sum(kind == "extended" for kind in events.types())
        assert events.wait_for("extended", count=extended + 1, timeout=10), events.types()
        assert lock.state == "held"
        assert RedisBackend(private_redis_server.client()).is_held(key, lock.token)
        assert lock.release()
    finally:
        locker.close()
        proxy.close()


def test_watcher_reconnects_after_a_restart(private_redis_server: RedisServer, key: str) -> None:
    backend = RedisBackend(quick_client(private_redis_server.port))
    heard: list[str] = []
    watcher = backend.watch_releases(heard.append)
    try:
        assert wait_until(lambda: watcher.active, 30)
        private_redis_server.stop()
        assert wait_until(lambda: not watcher.active, 30)
        private_redis_server.start()
        assert wait_until(lambda: watcher.active, 30)
        assert backend.acquire(key, "t" * 32, 30, "o")
        assert backend.force_release(key)
        assert wait_until(lambda: heard == [key], 30)
    finally:
        backend.close()


class BatchRecorder(RedisBackend):
    """Records the size of every batch the heartbeat sends."""

    def __init__(self, client: Any) -> None:
        super().__init__(client)
        self.batches: list[int] = []

    def extend_many(self, requests: Any) -> list[bool]:
        self.batches.append(len(requests))
        return super().extend_many(requests)


def test_heartbeat_batches_extensions(redis_server: RedisServer, key: str) -> None:
    backend = BatchRecorder(redis_server.client())
    locker = Locker(backend)
    try:
        locks = [locker.acquire(f"{key}:{index}", ttl=1.5) for index in range(200)]
        # Outlive the lease twice over: only extensions keep the locks.
        time.sleep(3)
        assert all(lock.state == "held" for lock in locks)
        assert all(backend.is_held(lock.key, lock.token) for lock in locks)
        assert backend.batches and max(backend.batches) > 1
        assert sum(backend.batches) >= 400
    finally:
        locker.close()
        backend.client.close()
