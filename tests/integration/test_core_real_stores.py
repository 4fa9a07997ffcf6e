"""The core's ``check(verify=True)`` and re-entrant holds on real SQLite files and a real Redis
server, beside their unit tests on the recording memory backend in ``tests/unit``."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from lease_lock import Locker, LockHeldError, LockLostError, connect
from lease_lock.backends.base import Backend


@pytest.fixture(params=["sqlite", "redis"])
def real_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'locks.db'}"
    return str(request.getfixturevalue("redis_server").url)


def test_real_backend_force_release_seen_by_verify_only(real_url: str) -> None:
    key = f"verify-{uuid.uuid4().hex}"
    with connect(real_url) as holder, connect(real_url) as operator:
        lock = holder.acquire(key)
        lock.check(verify=True)
        assert operator.force_release(key)
        lock.check()
        with pytest.raises(LockLostError) as raised:
            lock.check(verify=True)
        assert raised.value.reason == "observed" and lock.lost_reason == "observed"


class CountingBackend:
    """Wraps a real backend's grant and release calls to count them."""

    def __init__(self, backend: Backend) -> None:
        self.counts = {"acquire": 0, "release": 0}
        for name in self.counts:
            original: Callable[..., Any] = getattr(backend, name)

            def counted(*args: Any, _name: str = name, _original: Callable[..., Any] = original) -> Any:
                self.counts[_name] += 1
                return _original(*args)

            setattr(backend, name, counted)


@pytest.fixture(params=["sqlite", "redis"])
def real_locker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Locker]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'locks.db'}"
    else:
        url = request.getfixturevalue("redis_server").url
    locker = connect(url, reentrant=True, ttl=10.0)
    yield locker
    locker.close()


def test_real_backend_nested_with_one_grant_one_release(real_locker: Locker, request: Any) -> None:
    key = f"reentrant-{request.node.name}"
    counter = CountingBackend(real_locker.backend)
    with real_locker.lock(key) as outer:
        with real_locker.lock(key) as inner:
            assert inner.holds == 2 and inner.token == outer.token
            assert real_locker.get(key).held
        assert real_locker.get(key).held
    assert counter.counts == {"acquire": 1, "release": 1}
    assert not real_locker.get(key).held


def test_real_backend_without_reentrant_names_this_thread(real_locker: Locker, request: Any) -> None:
    key = f"plain-{request.node.name}"
    with real_locker.lock(key, reentrant=False):
        with pytest.raises(LockHeldError, match=r"this very thread.*reentrant=True"):
            real_locker.acquire(key, reentrant=False, timeout=0.3)
        assert real_locker.try_acquire(key, reentrant=False) is None
