"""The core's side of counting leases (``limit=N``) on the memory backend: the option's rules,
the Locker's default, what a lock and ``get()`` report, and what stays exclusive whatever the
limit. The store's side is the contract suite's ``test_counting_*`` on every backend."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, ClassVar

import pytest
from lease_lock import Holder, Locker, LockHeldError, MemoryBackend, ValidationError
from lease_lock.backends.base import Capabilities


class ExclusiveOnly(MemoryBackend):
    """A store that grants no counting leases (as a third-party backend may not)."""

    capabilities: ClassVar[Capabilities] = dataclasses.replace(MemoryBackend.capabilities, counting=False)


@pytest.mark.parametrize("limit", [0, -1, 1.5, "3", True, None, 10**7])
def test_a_bad_limit_is_refused_naming_it(limit: Any) -> None:
    backend = MemoryBackend()
    with Locker(backend) as locker:
        for call in (locker.lock, locker.acquire, locker.try_acquire):
            if limit is None:
                continue  # None is every call's "the Locker's default"
            with pytest.raises(ValidationError, match="limit"):
                call("k", limit=limit)
        with pytest.raises(ValidationError, match="limit"):
            locker.locked("k", limit=limit if limit is not None else 0)
    with pytest.raises(ValidationError, match="limit"):
        Locker(backend, limit=limit)
    assert not backend.inspect("k").held


def test_a_store_that_cannot_count_is_refused_before_anything_is_written() -> None:
    backend = ExclusiveOnly()
    with pytest.raises(ValidationError, match="ExclusiveOnly"):
        Locker(backend, limit=2)
    with Locker(backend) as locker:
        with pytest.raises(ValidationError, match=r"limit=2.*ExclusiveOnly"):
            locker.try_acquire("k", limit=2)
        assert not backend.inspect("k").held
        with locker.lock("k", limit=1) as lock:
            assert lock.limit == 1


def test_the_lockers_limit_is_every_locks_default() -> None:
    with Locker(MemoryBackend(), limit=2) as locker:
        assert locker.limit == 2
        first, second = locker.acquire("k"), locker.acquire("k")
        assert first.limit == second.limit == 2
        assert locker.try_acquire("k") is None
        state = locker.get("k")
        assert state.limit == 2 and [holder.fence for holder in state.holders] == [first.fence, second.fence]
        assert all(isinstance(holder, Holder) and holder.owner == locker.owner for holder in state.holders)
        # A call's own limit wins over the default, and must agree with the live holders'.
        with pytest.raises(ValidationError, match=r"limit=1.*limit=2"):
            locker.try_acquire("k", limit=1)
        first.release()
        second.release()
        with locker.lock("k", limit=1) as exclusive:
            assert exclusive.limit == 1 and locker.get("k").limit == 1


def test_a_counting_lease_carries_its_fence_without_fencing() -> None:
    with Locker(MemoryBackend()) as locker, locker.lock("k", limit=2) as counted, locker.lock("other") as plain:
        assert counted.fence is not None and plain.fence is None


def test_a_waiter_beyond_the_limit_times_out_as_a_contended_acquire() -> None:
    with Locker(MemoryBackend(), limit=1) as locker:
        held = [locker.acquire("k", limit=2) for _ in range(2)]
        with pytest.raises(LockHeldError) as raised:
            locker.acquire("k", limit=2, timeout=0.2)
        assert raised.value.reason == "timeout"
        for lock in held:
            lock.release()


def test_a_reentrant_acquire_joins_the_threads_own_place() -> None:
    with Locker(MemoryBackend(), reentrant=True, limit=2) as locker, locker.lock("k") as outer:
        with locker.lock("k") as inner:
            assert inner.token == outer.token and outer.holds == 2
        assert len(locker.get("k").holders) == 1


def test_leadership_stays_exclusive_on_a_counting_locker() -> None:
    backend = MemoryBackend()
    with Locker(backend, limit=3) as first, Locker(backend, limit=3) as second:
        elected = [threading.Event(), threading.Event()]
        campaigns = [
            locker.elect("leader", on_elected=lambda _lock, event=event: event.set())
            for locker, event in zip((first, second), elected)
        ]
        assert elected[0].wait(10) or elected[1].wait(10)
        state = first.get("leader")
        assert state.limit == 1 and len(state.holders) == 1
        for campaign in campaigns:
            campaign.resign()
