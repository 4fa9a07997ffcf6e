"""The rate limiter takes its budget from the store in slices: never more than the limit across
processes, at most the documented slack under it, and one store round trip per slice."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from lease_lock.backends.memory import MemoryBackend
from lease_lock.backends.redis import RedisBackend
from lease_lock.server.ratelimit import RateLimiter, slice_of

from tests.support.redis_server import RedisServer


class CountingStore(MemoryBackend):
    """A memory store that counts the counter calls that reach it."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.calls = 0

    def count_in_window(self, name: str, window: float, amount: int = 1) -> tuple[int, float]:
        self.calls += 1
        return super().count_in_window(name, window, amount)


def test_slices_are_exact_below_128_and_at_most_a_64th() -> None:
    assert [slice_of(limit) for limit in (1, 30, 127)] == [1, 1, 1]
    assert slice_of(600) == 9
    assert slice_of(10**9) == 64


def test_one_process_gets_exactly_the_limit_in_few_round_trips() -> None:
    store = CountingStore(clock=lambda: 30.0)
    limiter = RateLimiter(store, limit=600, window=60, clock=lambda: 0.0)
    answers = [limiter.hit("p/acquire").allowed for _ in range(700)]
    assert answers == [True] * 600 + [False] * 100
    # 600 / 9 slices rounded up, and refusals are answered from the spent-out share.
    assert store.calls == 67
    assert limiter.hit("p/acquire").retry_after == 30
    assert limiter.hit("q/acquire").allowed  # budgets are per name


def test_a_new_window_brings_a_new_budget() -> None:
    now = [0.0]
    store = MemoryBackend(clock=lambda: 100.0 + now[0])
    limiter = RateLimiter(store, limit=200, window=60, clock=lambda: now[0])
    assert sum(limiter.hit("p").allowed for _ in range(250)) == 200
    now[0] = 21.0  # the store's window 60..120 ended at local time 20
    assert sum(limiter.hit("p").allowed for _ in range(250)) == 200


def _spend_together(limiters: list[RateLimiter], requests: int) -> int:
    allowed = [0] * len(limiters)

    def spend(index: int) -> None:
        for _ in range(requests):
            allowed[index] += limiters[index].hit("team/acquire").allowed

    threads = [threading.Thread(target=spend, args=(index,)) for index in range(len(limiters))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return sum(allowed)


def test_processes_sharing_a_store_never_pass_the_limit() -> None:
    store = MemoryBackend(clock=lambda: 10.0)
    limiters = [RateLimiter(store, limit=640, window=3600, clock=lambda: 0.0) for _ in range(3)]
    total = _spend_together(limiters, 400)
    tolerance = (len(limiters) - 1) * (slice_of(640) - 1)
    assert 640 - tolerance <= total <= 640


@pytest.fixture
def redis_store(redis_server: RedisServer) -> Iterator[RedisBackend]:
    backend = RedisBackend.from_url(redis_server.url)
    yield backend
    backend.close()


def test_server_processes_on_redis_never_pass_the_limit(redis_store: RedisBackend) -> None:
    # Each limiter stands for one server process; all count in one Redis. A window of a day
    # keeps a window boundary out of the run.
    namespace = f"rate-test-{uuid.uuid4().hex}/"
    limiters = [RateLimiter(redis_store, limit=1000, window=86400, namespace=namespace) for _ in range(2)]
    total = _spend_together(limiters, 700)
    assert 1000 - (slice_of(1000) - 1) <= total <= 1000
