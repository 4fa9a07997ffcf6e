"""Durations above ``MAX_DURATION`` are refused before anything is written.

Regression: ``ttl=1e15`` was granted on SQLite and memory, after which ``get()`` and ``list()``
raised ``OverflowError`` for every reader of the key.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import pytest
from lease_lock import Locker, Retry, ValidationError, connect
from lease_lock.validation import MAX_DURATION

from .fakes import RecordingBackend

HUGE = 1e15


@pytest.fixture(params=["memory", "sqlite"])
def real_locker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Locker]:
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 'locks.db'}"
    locker = connect(url)
    yield locker
    locker.close()


@pytest.mark.parametrize(
    "call",
    [
        lambda locker: locker.acquire("k", ttl=HUGE, auto_extend=False),
        lambda locker: locker.acquire("k", ttl=timedelta(days=400), auto_extend=False),
        lambda locker: locker.try_acquire("k", ttl=HUGE),
        lambda locker: locker.acquire("k", max_hold=HUGE),
        lambda locker: locker.acquire("k", timeout=HUGE),
        lambda locker: locker.acquire("k", retry=Retry(timeout=HUGE)),
        lambda locker: locker.acquire("k", retry=Retry(delay=HUGE)),
        lambda locker: locker.acquire_many(["a", "b"], ttl=HUGE),
        lambda locker: locker.lock("k", ttl=MAX_DURATION + 1),
    ],
)
def test_huge_durations_are_refused_before_the_backend_is_asked(
    call: Callable[[Locker], Any], backend: RecordingBackend, locker: Locker
) -> None:
    with pytest.raises(ValidationError, match="at most 31536000 seconds"):
        call(locker)
    assert backend.calls == []


def test_huge_locker_settings_are_refused() -> None:
    for settings in ({"ttl": HUGE}, {"max_hold": HUGE}):
        with pytest.raises(ValidationError, match="at most"):
            connect("memory://", **settings)
    with pytest.raises(ValidationError, match="at most"):
        Retry(timeout=HUGE)


def test_a_huge_extension_is_refused_and_the_lease_kept(real_locker: Locker) -> None:
    lock = real_locker.acquire("k", ttl=30, auto_extend=False)
    with pytest.raises(ValidationError):
        lock.extend(HUGE)
    assert lock.state == "held"
    assert 0 < lock.expires_in <= 30
    state = real_locker.get("k")
    assert state.held and state.expires_in is not None and state.expires_in <= 30
    lock.release()


def test_the_longest_lease_is_stored_and_read_back(real_locker: Locker) -> None:
    lock = real_locker.acquire("k", ttl=MAX_DURATION, auto_extend=False)
    state = real_locker.get("k")
    assert state.held and state.expires_at is not None
    assert state.expires_in is not None and MAX_DURATION - 60 < state.expires_in <= MAX_DURATION
    assert [listed.key for listed in real_locker.list()] == ["k"]
    lock.release()


def test_infinity_still_means_no_limit_where_allowed(real_locker: Locker) -> None:
    lock = real_locker.acquire("k", ttl=30, max_hold=math.inf, timeout=math.inf)
    assert lock.state == "held"
    lock.release()
