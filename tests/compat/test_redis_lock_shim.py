"""lease_lock.compat.redis_lock against a real redis-server.

The behaviours python-redis-lock's own suite checks, restated for the shim (where a lease
differs, the test says how), then a mixed fleet: python-redis-lock in one process and the shim
in another, on the same name, each woken by the other's release through the signal list.
"""

from __future__ import annotations

import gc
import threading
from typing import Any

import pytest
from lease_lock.compat import redis_lock
from lease_lock.compat.redis_lock import (
    AlreadyAcquired,
    InvalidTimeout,
    Lock,
    NotAcquired,
    NotExpirable,
    TimeoutNotUsable,
    TimeoutTooLarge,
    reset_all,
)
from lease_lock.testing import wait_until

from tests.compat.fleet import EVENT_WAIT, Worker, blocked_in_blpop, run_loops, wait_for_blpop
from tests.support.redis_server import RedisServer


def test_storage_layout(r: Any, name: str) -> None:
    lock = Lock(r, name)
    assert r.get(f"lock:{name}") is None
    assert len(lock.id) == 24
    assert lock.acquire(blocking=False)
    assert r.get(f"lock:{name}") == lock.id.encode()
    lock.release()
    assert r.get(f"lock:{name}") is None
    assert r.lrange(f"lock-signal:{name}", 0, -1) == [b"1"]


def test_no_expire_is_a_heartbeat_lease(r: Any, name: str) -> None:
    # python-redis-lock leaves such a key without expiry; the shim holds a lease it renews.
    lock = Lock(r, name, lease_ttl=1.0)
    assert lock.acquire()
    assert 0 < r.pttl(f"lock:{name}") <= 1000
    lease = lock.lease
    assert lease is not None
    assert not lease.lost.wait(3.0)
    assert lock.get_owner_id() == lock.id
    lock.release()
    assert lock.locked() is False


def test_no_block(r: Any, name: str) -> None:
    with Lock(r, name):
        assert Lock(r, name).acquire(blocking=False) is False


def test_timeout_gives_up(r: Any, name: str) -> None:
    with Lock(r, name):
        assert Lock(r, name).acquire(timeout=1) is False


@pytest.mark.parametrize("timeout", [0, "0", "123"])
def test_timeout_int_conversion(r: Any, name: str, timeout: Any) -> None:
    lock = Lock(r, name)
    assert lock.acquire(blocking=True, timeout=timeout)
    lock.release()


def test_timeout_outlasts_a_short_expire(r: Any, name: str) -> None:
    Lock(r, name, expire=1).acquire()
    assert Lock(r, name).acquire(timeout=2)


def test_renewed_lock_outlasts_the_timeout(r: Any, name: str) -> None:
    with Lock(r, name, expire=1, auto_renewal=True):
        assert Lock(r, name).acquire(timeout=2) is False


def test_timeout_argument_errors(r: Any, name: str) -> None:
    lock = Lock(r, name)
    with pytest.raises(TimeoutNotUsable):
        lock.acquire(blocking=False, timeout=1)
    with pytest.raises(InvalidTimeout):
        lock.acquire(blocking=True, timeout=-1)
    with pytest.raises(ValueError, match="invalid literal"):
        lock.acquire(blocking=True, timeout="foobar")
    with pytest.raises(TimeoutTooLarge):
        Lock(r, name, expire=1).acquire(blocking=True, timeout=2)
    renewed = Lock(r, name, expire=1, auto_renewal=True)
    assert renewed.acquire(blocking=True, timeout=2)
    renewed.release()


def test_expire_conversion_and_errors() -> None:
    client = object()
    assert Lock(client, "x", strict=False, expire=1)._expire == 1
    assert Lock(client, "x", strict=False, expire=0)._expire is None
    assert Lock(client, "x", strict=False, expire="123")._expire == 123
    for bad in (-1, -123, "-1"):
        with pytest.raises(ValueError, match="negative"):
            Lock(client, "x", strict=False, expire=bad)
        with pytest.raises(ValueError, match="negative"):
            Lock(client, "x", strict=False).extend(expire=bad)


def test_strict_check() -> None:
    with pytest.raises(ValueError, match="StrictRedis"):
        Lock(object(), "x")
    Lock(object(), "x", strict=False)


def test_expire_frees_the_name(r: Any, name: str) -> None:
    first = Lock(r, name, expire=2)
    second = Lock(r, name, expire=1)
    assert first.acquire()
    assert second.acquire(blocking=False) is False
    assert second.acquire() is True
    second.release()


def test_extend(r: Any, name: str) -> None:
    with Lock(r, name, expire=100) as lock:
        assert r.ttl(f"lock:{name}") <= 100
        lock.extend(expire=1000)
        assert r.ttl(f"lock:{name}") > 100


def test_extend_default_expire(r: Any, name: str) -> None:
    with Lock(r, name, expire=1000) as lock:
        r.expire(f"lock:{name}", 500)
        lock.extend()
        assert 997 < r.ttl(f"lock:{name}") <= 1000


def test_extend_without_expire_fails(r: Any, name: str) -> None:
    with Lock(r, name) as lock:
        with pytest.raises(NotExpirable):
            lock.extend(expire=1000)
        with pytest.raises(TypeError):
            lock.extend()


def test_extend_of_an_old_lock_without_expiry(r: Any, name: str) -> None:
    r.set(f"lock:{name}", "old")
    with pytest.raises(NotExpirable):
        Lock(r, name, id="old").extend(10)


def test_extend_from_another_instance(r: Any, name: str) -> None:
    lock = Lock(r, name, expire=100)
    lock.acquire()
    Lock(r, name, id=lock.id).extend(1000)
    assert r.ttl(f"lock:{name}") > 100
    other = Lock(r, name)
    with pytest.raises(NotAcquired):
        other.extend(5000)
    assert r.ttl(f"lock:{name}") <= 1000
    lock.release()


def test_extend_of_a_renewed_lock_changes_its_lease(r: Any, name: str) -> None:
    lock = Lock(r, name, expire=10, auto_renewal=True)
    assert lock.acquire()
    lock.extend(100)
    assert 90 < r.ttl(f"lock:{name}") <= 100
    assert lock.lease is not None and lock.lease.ttl == 100
    lock.release()


def test_double_acquire(r: Any, name: str) -> None:
    lock = Lock(r, name)
    with lock:
        with pytest.raises(AlreadyAcquired):
            lock.acquire()
        assert issubclass(AlreadyAcquired, RuntimeError)


def test_enter_held_lock_without_blocking(r: Any, name: str) -> None:
    holder = Lock(r, name)
    assert holder.acquire()
    with pytest.raises(NotAcquired), Lock(r, name, blocking=False):
        pass
    holder.release()


def test_reset(r: Any, name: str) -> None:
    lock = Lock(r, name)
    lock.reset()
    other = Lock(r, name)
    assert other.acquire(blocking=False)
    other.release()
    with pytest.raises(NotAcquired):
        lock.release()


def test_reset_of_a_held_lock_frees_it(r: Any, name: str) -> None:
    holder = Lock(r, name, expire=100)
    assert holder.acquire()
    Lock(r, name).reset()
    assert not holder.locked()
    with pytest.raises(NotAcquired):
        holder.release()


def test_reset_all(r: Any, name: str) -> None:
    first, second = Lock(r, name + "1"), Lock(r, name + "2")
    assert first.acquire(blocking=False) and second.acquire(blocking=False)
    reset_all(r)
    first, second = Lock(r, name + "1"), Lock(r, name + "2")
    assert first.acquire(blocking=False) and second.acquire(blocking=False)
    first.release()
    second.release()


def test_owner_id(r: Any, name: str) -> None:
    assert Lock(r, name, id="foobar-identifier").id == "foobar-identifier"
    lock = Lock(r, name)
    lock.acquire()
    assert lock.get_owner_id() == lock.id
    lock.release()
    assert lock.get_owner_id() is None


def test_bogus_release_and_release_by_id(r: Any, name: str) -> None:
    lock = Lock(r, name)
    with pytest.raises(NotAcquired):
        lock.release()
    lock.acquire()
    Lock(r, name, id=lock.id).release()
    assert not lock.locked()
    # The holder learns it on its own release, and its heartbeat stops.
    with pytest.raises(NotAcquired):
        lock.release()


def test_release_leaves_one_signal(r: Any, name: str) -> None:
    for _ in range(10):
        lock = Lock(r, name)
        lock.acquire(blocking=False)
        lock.release()
        assert r.llen(f"lock-signal:{name}") == 1


def test_auto_renewal_bad_values(r: Any, name: str) -> None:
    with pytest.raises(ValueError, match="auto_renewal"):
        Lock(r, name, expire=None, auto_renewal=True)


def test_no_auto_renewal_is_a_plain_expiry(r: Any, name: str) -> None:
    lock = Lock(r, name, expire=3, auto_renewal=False)
    assert lock.acquire()
    assert lock.lease is None
    lock.release()


def test_auto_renewal_keeps_the_lock(r: Any, name: str) -> None:
    lock = Lock(r, name, expire=1, auto_renewal=True)
    assert lock.acquire()
    assert lock.lease is not None
    assert not lock.lease.lost.wait(3.0)
    assert r.get(f"lock:{name}") == lock.id.encode()
    lock.release()
    assert lock.lease is None


def test_renewal_stops_when_the_lock_is_garbage_collected(r: Any, name: str) -> None:
    lock = Lock(r, name, expire=1, auto_renewal=True)
    assert lock.acquire()
    del lock
    gc.collect()
    # Nobody renews it any more: the key runs out on the server.
    assert wait_until(lambda: not r.exists(f"lock:{name}"), EVENT_WAIT)


@pytest.mark.parametrize("signal_expire", [1000, 1500])
@pytest.mark.parametrize("method", ["release", "reset_all"])
def test_signal_expires(r: Any, name: str, signal_expire: int, method: str) -> None:
    lock = Lock(r, name, signal_expire=signal_expire)
    lock.acquire()
    if method == "release":
        lock.release()
    else:
        reset_all(r)
    pttl = r.pttl(f"lock-signal:{name}")
    assert 0 < pttl <= signal_expire
    assert wait_until(lambda: not r.exists(f"lock-signal:{name}"), EVENT_WAIT)


@pytest.mark.parametrize("method", ["reset", "reset_all", "release_by_id"])
def test_resets_wake_waiters(r: Any, name: str, method: str) -> None:
    holder = Lock(r, name)
    assert holder.acquire()
    waiter = Lock(r, name, lease_ttl=EVENT_WAIT * 4)
    acquired = threading.Event()

    def wait() -> None:
        if waiter.acquire():
            acquired.set()

    thread = threading.Thread(target=wait)
    thread.start()
    assert wait_until(lambda: blocked_in_blpop(r), EVENT_WAIT)
    if method == "reset":
        Lock(r, name).reset()
    elif method == "reset_all":
        reset_all(r)
    else:
        Lock(r, name, id=holder.id).release()
    # The waiter re-checks the key only every lease_ttl (two minutes) unless woken.
    assert acquired.wait(EVENT_WAIT)
    thread.join(EVENT_WAIT)
    waiter.release()
    with pytest.raises(NotAcquired):
        holder.release()


def test_given_id(r: Any, name: str) -> None:
    orig = Lock(r, name, expire=100, id=b"a")
    orig.acquire()
    with pytest.raises(TypeError):
        Lock(r, name, id=object())  # type: ignore[arg-type]
    lock = Lock(r, name, id=b"a")
    with pytest.raises(AlreadyAcquired):
        lock.acquire()
    lock.extend(100)
    lock.release()
    with pytest.raises(NotAcquired):
        orig.release()
    assert r.ttl(f"lock:{name}") == -2


def test_binary_id_is_base64(r: Any, name: str) -> None:
    assert Lock(r, name, id=b"\xff\x00").id == "/wA="


def test_locked(r: Any, name: str) -> None:
    lock = Lock(r, name, id="first")
    other = Lock(r, name, id="another")
    assert lock.locked() is False and other.locked() is False
    assert lock.acquire() is True
    assert lock.locked() is True and other.locked() is True
    lock.release()


def test_already_started_is_kept_for_except_clauses() -> None:
    assert issubclass(redis_lock.AlreadyStarted, RuntimeError)


# -- a mixed fleet: python-redis-lock and the shim on one name ---------------------------------


def test_mixed_fleet_one_holder_at_a_time(redis_server: RedisServer, r: Any, name: str) -> None:
    run_loops(redis_server.url, "redis_lock", name, 100)
    assert r.get(f"{name}:total") == b"200"
    assert r.get(f"{name}:overlaps") is None


def test_old_waiter_is_woken_by_a_shim_release(redis_server: RedisServer, r: Any, name: str) -> None:
    holder = Lock(r, name)
    assert holder.acquire()
    # python-redis-lock without expire or timeout waits in BLPOP with no time limit: only a
    # push to the signal list can wake it.
    waiter = Worker("wait", "redis_lock", "real", redis_server.url, name)
    try:
        waiter.expect("waiting")
        wait_for_blpop(r)
        holder.release()
        waiter.expect("acquired")
        waiter.finish()
    finally:
        waiter.kill()


def test_shim_waiter_is_woken_by_an_old_release(redis_server: RedisServer, r: Any, name: str) -> None:
    holder = Worker("hold", "redis_lock", "real", redis_server.url, name)
    try:
        holder.expect("held")
        # The shim's waiter re-checks the key only every lease_ttl unless woken.
        waiter = Lock(r, name, lease_ttl=EVENT_WAIT * 4)
        acquired = threading.Event()
        thread = threading.Thread(target=lambda: waiter.acquire() and acquired.set())
        thread.start()
        wait_for_blpop(r)
        holder.send()
        holder.expect("released")
        assert acquired.wait(EVENT_WAIT)
        thread.join(EVENT_WAIT)
        waiter.release()
        holder.finish()
    finally:
        holder.kill()
