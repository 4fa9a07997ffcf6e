"""lease_lock.compat.redis_py.Lock against a real redis-server.

The behaviours redis-py's own lock suite checks, restated for the shim (where a lease differs,
the test says how), then a mixed fleet: redis-py's real Lock in one process and the shim in
another, on the same name.
"""

from __future__ import annotations

import gc
import threading
from typing import Any

import pytest
import redis
from lease_lock.compat import redis_py
from lease_lock.compat._store import heartbeat_locker
from lease_lock.compat.redis_py import Lock
from lease_lock.testing import wait_until
from redis.exceptions import LockError, LockNotOwnedError

from tests.compat.fleet import EVENT_WAIT, Worker, run_loops
from tests.support.redis_server import RedisServer


def make(r: Any, name: str, **kwargs: Any) -> Lock:
    lock = r.lock(name, lock_class=Lock, **kwargs)
    assert isinstance(lock, Lock)
    return lock


class FakeTime:
    """Stands in for the module's ``time``: records sleeps instead of sleeping."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def fake_time(monkeypatch: pytest.MonkeyPatch) -> FakeTime:
    fake = FakeTime()
    monkeypatch.setattr(redis_py, "time", fake)
    return fake


def test_value_is_the_token_and_release_deletes(r: Any, name: str) -> None:
    lock = make(r, name, timeout=10)
    assert lock.acquire(blocking=False)
    assert r.get(name) == lock.local.token
    lock.release()
    assert r.get(name) is None


def test_no_timeout_is_a_heartbeat_lease(r: Any, name: str) -> None:
    # redis-py leaves such a key without expiry (TTL -1); the shim holds a lease it renews.
    lock = Lock(r, name, lease_ttl=1.0)
    assert lock.acquire(blocking=False)
    assert 0 < r.pttl(name) <= 1000
    lease = lock.lease
    assert lease is not None
    # Three lease lengths later the key is still ours: the heartbeat renewed it.
    assert not lease.lost.wait(3.0)
    assert r.get(name) == lock.local.token
    lock.release()
    assert r.get(name) is None
    assert lock.lease is None


def test_given_token(r: Any, name: str) -> None:
    lock = make(r, name, timeout=10)
    assert lock.acquire(blocking=False, token="test")  # noqa: S106 - a lock token, not a password
    assert r.get(name) == b"test"
    assert lock.local.token == b"test"
    lock.release()
    assert r.get(name) is None
    assert lock.local.token is None


def test_given_short_token_without_timeout(r: Any, name: str) -> None:
    lock = make(r, name, thread_local=False)
    assert lock.acquire(blocking=False, token="test")  # noqa: S106 - a lock token, not a password
    assert r.get(name) == b"test"
    lock.release()
    assert r.get(name) is None


def test_token_too_long_for_a_lease_fails_before_writing(r: Any, name: str) -> None:
    lock = make(r, name)
    with pytest.raises(ValueError, match="at most 56 bytes"):
        lock.acquire(blocking=False, token="x" * 57)
    assert r.get(name) is None


def test_locked(r: Any, name: str) -> None:
    lock = make(r, name)
    assert lock.locked() is False
    lock.acquire(blocking=False)
    assert lock.locked() is True
    lock.release()
    assert lock.locked() is False


@pytest.mark.parametrize("decoded", [False, True])
def test_owned(r: Any, r_decoded: Any, name: str, decoded: bool) -> None:
    client = r_decoded if decoded else r
    lock = make(client, name, timeout=10)
    assert lock.owned() is False
    lock.acquire(blocking=False)
    assert lock.owned() is True
    lock.release()
    assert lock.owned() is False
    other = make(client, name, timeout=10)
    assert other.acquire(blocking=False)
    assert lock.owned() is False
    assert other.owned() is True
    other.release()
    assert other.owned() is False


def test_competing_locks(r: Any, name: str) -> None:
    first = make(r, name)
    second = make(r, name)
    assert first.acquire(blocking=False)
    assert not second.acquire(blocking=False)
    first.release()
    assert second.acquire(blocking=False)
    assert not first.acquire(blocking=False)
    second.release()


def test_timeout_sets_the_expiry(r: Any, name: str) -> None:
    lock = make(r, name, timeout=10)
    assert lock.acquire(blocking=False)
    assert 8 < r.ttl(name) <= 10
    lock.release()


def test_float_timeout(r: Any, name: str) -> None:
    lock = make(r, name, timeout=9.5)
    assert lock.acquire(blocking=False)
    assert 8000 < r.pttl(name) <= 9500
    lock.release()


def test_blocking_timeout_stops_trying(r: Any, name: str, fake_time: FakeTime) -> None:
    holder = make(r, name)
    assert holder.acquire(blocking=False)
    waiter = make(r, name, sleep=0.05, blocking_timeout=0.4)
    assert not waiter.acquire()
    assert fake_time.now == pytest.approx(0.4)
    assert fake_time.sleeps == [0.05] * 8
    holder.release()


def test_high_sleep_small_blocking_timeout(r: Any, name: str, fake_time: FakeTime) -> None:
    holder = make(r, name)
    assert holder.acquire(blocking=False)
    waiter = make(r, name, sleep=1, blocking_timeout=0.5)
    assert not waiter.acquire()
    assert fake_time.sleeps == []
    holder.release()


def test_blocking_waiter_gets_the_lock_after_release(r: Any, name: str) -> None:
    holder = make(r, name)
    assert holder.acquire(blocking=False)
    waiter = make(r, name, sleep=0.01, blocking_timeout=EVENT_WAIT, thread_local=False)
    started = threading.Event()
    result: list[bool] = []

    def wait() -> None:
        started.set()
        result.append(waiter.acquire())

    thread = threading.Thread(target=wait)
    thread.start()
    assert started.wait(EVENT_WAIT)
    holder.release()
    thread.join(EVENT_WAIT)
    assert result == [True]
    waiter.release()


def test_context_manager(r: Any, name: str) -> None:
    with make(r, name, blocking_timeout=0.2) as lock:
        assert r.get(name) == lock.local.token
    assert r.get(name) is None


def test_context_manager_raises_when_not_acquired(r: Any, name: str) -> None:
    r.set(name, "other")
    with pytest.raises(LockError) as caught, make(r, name, blocking_timeout=0.1):
        pass
    assert getattr(caught.value, "lock_name", name) == name


def expire_now(r: Any, name: str) -> None:
    """Wait until the key of a short-timeout lock has expired on the server."""
    assert wait_until(lambda: r.get(name) is None, EVENT_WAIT)


def test_release_error_of_context_manager_can_be_logged(r: Any, name: str, caplog: pytest.LogCaptureFixture) -> None:
    with make(r, name, timeout=0.1, raise_on_release_error=False):
        expire_now(r, name)
    assert "no longer owned" in caplog.text
    with pytest.raises(LockNotOwnedError), make(r, name, timeout=0.1, raise_on_release_error=True):
        expire_now(r, name)


def test_release_error_of_context_manager_after_manual_release(r: Any, name: str) -> None:
    with make(r, name, timeout=10, raise_on_release_error=False) as lock:
        lock.release()
    with pytest.raises(LockError), make(r, name, timeout=10) as lock:
        lock.release()


def test_releasing_unlocked_lock_raises(r: Any, name: str) -> None:
    with pytest.raises(LockError):
        make(r, name).release()


@pytest.mark.parametrize("timeout", [10, None])
def test_releasing_lock_no_longer_owned_raises(r: Any, name: str, timeout: Any) -> None:
    lock = make(r, name, timeout=timeout)
    lock.acquire(blocking=False)
    r.set(name, "a")
    with pytest.raises(LockNotOwnedError):
        lock.release()
    assert lock.local.token is None
    assert r.get(name) == b"a"


def test_extend_adds_time(r: Any, name: str) -> None:
    lock = make(r, name, timeout=10)
    assert lock.acquire(blocking=False)
    assert 8000 < r.pttl(name) <= 10000
    assert lock.extend(10)
    assert 16000 < r.pttl(name) <= 20000
    lock.release()


def test_extend_replace_ttl(r: Any, name: str) -> None:
    lock = make(r, name, timeout=10)
    assert lock.acquire(blocking=False)
    assert lock.extend(10, replace_ttl=True)
    assert 8000 < r.pttl(name) <= 10000
    lock.release()


def test_extend_float(r: Any, name: str) -> None:
    lock = make(r, name, timeout=10.5)
    assert lock.acquire(blocking=False)
    old = r.pttl(name)
    assert lock.extend(10.5)
    assert old + 10000 < r.pttl(name) <= old + 10500
    lock.release()


def test_extend_errors(r: Any, name: str) -> None:
    with pytest.raises(LockError):
        make(r, name, timeout=10).extend(10)
    no_timeout = make(r, name)
    assert no_timeout.acquire(blocking=False)
    with pytest.raises(LockError):
        no_timeout.extend(10)
    no_timeout.release()
    lock = make(r, name, timeout=10)
    assert lock.acquire(blocking=False)
    r.set(name, "a")
    with pytest.raises(LockNotOwnedError):
        lock.extend(10)


def test_reacquire(r: Any, name: str) -> None:
    lock = make(r, name, timeout=10)
    assert lock.acquire(blocking=False)
    assert r.pexpire(name, 5000)
    assert r.pttl(name) <= 5000
    assert lock.reacquire()
    assert 8000 < r.pttl(name) <= 10000
    lock.release()


def test_reacquire_errors(r: Any, name: str) -> None:
    with pytest.raises(LockError):
        make(r, name, timeout=10).reacquire()
    with make(r, name, timeout=None, blocking=False) as lock, pytest.raises(LockError):
        lock.reacquire()
    lock = make(r, name, timeout=10)
    assert lock.acquire(blocking=False)
    r.set(name, "a")
    with pytest.raises(LockNotOwnedError):
        lock.reacquire()


def test_context_manager_reports_a_stolen_lock(r: Any, name: str) -> None:
    with pytest.raises(LockNotOwnedError), make(r, name, timeout=10, blocking=False):
        r.set(name, "a")


def test_thread_local_tokens(r: Any, name: str) -> None:
    lock = make(r, name, timeout=10)
    assert lock.acquire(blocking=False)
    seen: list[Any] = []
    thread = threading.Thread(target=lambda: seen.append(lock.local.token))
    thread.start()
    thread.join(EVENT_WAIT)
    assert seen == [None]
    shared = make(r, name + ":shared", timeout=10, thread_local=False)
    assert shared.acquire(blocking=False)
    thread = threading.Thread(target=shared.release)
    thread.start()
    thread.join(EVENT_WAIT)
    assert r.get(name + ":shared") is None
    lock.release()


def test_strict_redis_is_redis() -> None:
    # Both spellings of the client class accept lock_class.
    assert redis.StrictRedis is redis.Redis


# -- a mixed fleet: redis-py's Lock and the shim on one name -----------------------------------


def test_mixed_fleet_one_holder_at_a_time(redis_server: RedisServer, r: Any, name: str) -> None:
    run_loops(redis_server.url, "redis_py", name, 100)
    assert r.get(f"{name}:total") == b"200"
    assert r.get(f"{name}:overlaps") is None


@pytest.mark.parametrize(("holder_impl", "waiter_impl"), [("shim", "real"), ("real", "shim")])
def test_mixed_fleet_hand_off(redis_server: RedisServer, name: str, holder_impl: str, waiter_impl: str) -> None:
    holder = Worker("hold", "redis_py", holder_impl, redis_server.url, name)
    waiter = None
    try:
        holder.expect("held")
        waiter = Worker("wait", "redis_py", waiter_impl, redis_server.url, name)
        waiter.expect("waiting")
        holder.send()
        holder.expect("released")
        waiter.expect("acquired")
        holder.finish()
        waiter.finish()
    finally:
        holder.kill()
        if waiter is not None:
            waiter.kill()


def test_a_dropped_client_takes_its_heartbeat_with_it(redis_server: RedisServer, name: str) -> None:
    client = redis_server.client()
    lock = Lock(client, name, lease_ttl=5.0)
    assert lock.acquire(blocking=False)
    locker = heartbeat_locker(client)
    thread = locker._heartbeat.thread
    assert thread is not None and thread.is_alive()
    lock.release()
    client.close()
    del lock, client
    gc.collect()
    # The cache of heartbeat lockers holds the client weakly: its locker is closed with it.
    assert wait_until(lambda: locker.closed and not thread.is_alive(), EVENT_WAIT)
