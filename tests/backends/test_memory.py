"""The backend contract on the in-process memory backend."""

from __future__ import annotations

from typing import Iterator

import pytest
from lease_lock.backends.memory import MemoryBackend
from lease_lock.testing import BackendContract, ServiceStoreContract


class TestMemoryBackend(BackendContract, ServiceStoreContract):
    @pytest.fixture
    def backend(self) -> Iterator[MemoryBackend]:
        backend = MemoryBackend()
        yield backend
        backend.close()


def test_clear_keeps_fence_counter() -> None:
    backend = MemoryBackend()
    first = backend.acquire_fenced("k", "a" * 32, 30, "o")
    backend.clear()
    assert not backend.inspect("k").held
    second = backend.acquire_fenced("k", "b" * 32, 30, "o")
    assert first is not None and second is not None and second > first


def test_injected_clock_judges_expiry() -> None:
    now = [100.0]
    backend = MemoryBackend(clock=lambda: now[0])
    assert backend.acquire("k", "a" * 32, 5, "o")
    now[0] += 4.9
    assert backend.is_held("k", "a" * 32)
    now[0] += 0.2
    assert not backend.is_held("k", "a" * 32)
    assert backend.acquire("k", "b" * 32, 5, "o")


def test_count_in_window_resets_each_window() -> None:
    now = [120.0]
    backend = MemoryBackend(clock=lambda: now[0])
    assert backend.count_in_window("p", 60) == (1, 60.0)
    now[0] += 30
    assert backend.count_in_window("p", 60) == (2, 30.0)
    assert backend.count_in_window("q", 60)[0] == 1
    now[0] += 30
    assert backend.count_in_window("p", 60) == (1, 60.0)


def test_fences_keep_rising_in_a_new_process_store() -> None:
    # Regression: each MemoryBackend started its counters at 1, so a restarted
    # `lease-lock serve --url memory://` handed out fences it had already used (found in review).
    first = MemoryBackend().acquire_fenced("k", "a" * 32, 30, "o")
    second = MemoryBackend().acquire_fenced("k", "b" * 32, 30, "o")
    assert first is not None and second is not None
    assert second > first
    assert second < 2**53
