"""How the core treats the HTTP service's 429 (RateLimitedError) during acquisition."""

from __future__ import annotations

import math
import time

import pytest
from lease_lock import Locker, MemoryBackend, RateLimitedError, Retry
from lease_lock.errors import LockHeldError


class RateLimitedBackend(MemoryBackend):
    """Answers the first ``refusals`` acquisitions with a 429 asking to wait ``retry_after``."""

    def __init__(self, refusals: float, retry_after: float) -> None:
        super().__init__()
        self.refusals = refusals
        self.retry_after = retry_after
        self.calls: list[float] = []

    def acquire(self, key: str, token: str, ttl: float, owner: str) -> bool:
        self.calls.append(time.monotonic())
        if len(self.calls) <= self.refusals:
            raise RateLimitedError("slow down", retry_after=self.retry_after)
        return super().acquire(key, token, ttl, owner)


def test_blocking_acquire_waits_retry_after_and_counts_an_attempt() -> None:
    backend = RateLimitedBackend(refusals=2, retry_after=0.2)
    events = []
    locker = Locker(backend, retry=Retry(delay=0.01), on_event=events.append)
    lock = locker.acquire("k", timeout=30)
    assert lock.state == "held"
    acquired = [event for event in events if event.type == "acquired"]
    assert acquired[0].attempts == 3
    gaps = [later - earlier for earlier, later in zip(backend.calls, backend.calls[1:])]
    # Each refusal was waited out in full (the retry delay alone would be 0.01 s).
    assert all(gap >= 0.19 for gap in gaps)
    locker.close()


def test_try_acquire_raises_rate_limited() -> None:
    backend = RateLimitedBackend(refusals=1, retry_after=7)
    locker = Locker(backend)
    with pytest.raises(RateLimitedError) as caught:
        locker.try_acquire("k")
    assert caught.value.retry_after == 7
    assert not backend.inspect("k").held
    locker.close()


def test_rate_limit_wait_is_cut_by_the_timeout() -> None:
    backend = RateLimitedBackend(refusals=math.inf, retry_after=60)
    locker = Locker(backend)
    started = time.monotonic()
    with pytest.raises(LockHeldError) as caught:
        locker.acquire("k", timeout=0.3)
    assert caught.value.reason == "timeout"
    assert time.monotonic() - started < 30  # the 60 s Retry-After was cut to the budget
    assert len(backend.calls) == 1
    locker.close()


def test_exhausted_retries_raise_the_rate_limit() -> None:
    backend = RateLimitedBackend(refusals=5, retry_after=0.01)
    locker = Locker(backend, retry=Retry(retries=1))
    with pytest.raises(RateLimitedError):
        locker.acquire("k")
    assert len(backend.calls) == 2
    locker.close()
