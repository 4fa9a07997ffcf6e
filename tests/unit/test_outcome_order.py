"""What leaving a protected block raises, for ``with lock``, ``with lockset`` and
``@locker.locked``.

1. The block raised: that exception propagates; a release failure becomes ``release_failed``.
2. The block finished but the lock was lost, or the release found the key not ours:
   ``LockLostError(completed=True)``.
3. Otherwise the block's outcome stands; a release that raised becomes ``release_failed`` and
   the heartbeat stops.
"""

from __future__ import annotations

from typing import Callable, ContextManager, Optional

import pytest
from lease_lock import Locker, LockHeldError, LockLostError, LockStateError

from .fakes import START, EventLog, FakeClock, RecordingBackend, SilentBackend, advance_to_beat

OTHER = "o" * 32


class Boom(Exception):
    """What the protected block raises."""


class Broken(ConnectionError):
    """A driver error raised by the test backend."""


def inside(guard: ContextManager[object], body: Callable[[], object]) -> None:
    """Run ``body`` as the protected block of ``guard``."""
    with guard:
        body()


def take_key_away(backend: RecordingBackend, key: str = "k") -> None:
    backend.force_release(key)
    backend.acquire(key, OTHER, 60.0, "other")


# -- with lock ------------------------------------------------------------------------------------


def test_with_acquires_and_releases(locker: Locker, backend: RecordingBackend, events: EventLog) -> None:
    with locker.lock("k") as lock:
        assert lock.state == "held"
        assert backend.is_held("k", lock.token)
    assert lock.state == "released"
    assert events.types() == ["acquired", "released"]


def test_case1_block_error_propagates_even_if_the_lock_was_lost(
    locker: Locker, backend: RecordingBackend, clock: FakeClock, events: EventLog
) -> None:
    def body() -> None:
        clock.advance(40.0)
        raise Boom

    with pytest.raises(Boom):
        inside(locker.lock("k", auto_extend=False), body)
    assert events.types() == ["acquired", "lost"]


def test_case1_release_failure_after_a_block_error_is_an_event(
    locker: Locker, backend: RecordingBackend, events: EventLog
) -> None:
    failure = Broken("down")
    def body() -> None:
        backend.failures["release"] = failure
        raise Boom

    with pytest.raises(Boom):
        inside(locker.lock("k"), body)
    [event] = events.of("release_failed")
    assert event.error is failure and event.key == "k"


def test_case2_lost_during_the_block_raises_lock_lost_completed(
    locker: Locker, clock: FakeClock, events: EventLog
) -> None:
    with pytest.raises(LockLostError) as caught, locker.lock("k", auto_extend=False):
        clock.advance(40.0)
    error = caught.value
    assert (error.key, error.reason, error.completed, error.result) == ("k", "expired", True, None)
    assert events.types() == ["acquired", "lost"]


def test_case2_release_finding_the_key_not_ours(
    locker: Locker, backend: RecordingBackend, events: EventLog
) -> None:
    with pytest.raises(LockLostError) as caught, locker.lock("k"):
        take_key_away(backend)
    assert (caught.value.reason, caught.value.completed) == ("release", True)
    assert backend.is_held("k", OTHER)
    assert events.types() == ["acquired", "lost"]


def test_case2_loss_cause_is_chained(locker: Locker, backend: RecordingBackend, clock: FakeClock) -> None:
    failure = Broken("extensions keep failing")
    def body() -> None:
        backend.failures["extend"] = failure
        for beat in range(1, 31):
            advance_to_beat(clock, locker, START + beat)

    with pytest.raises(LockLostError) as caught:
        inside(locker.lock("k"), body)
    assert caught.value.reason == "extend-failed"
    assert caught.value.__cause__ is failure


def test_case2_lost_and_release_raising_is_lost_plus_an_event(
    locker: Locker, backend: RecordingBackend, clock: FakeClock, events: EventLog
) -> None:
    failure = Broken("down")
    def body() -> None:
        clock.advance(29.75)
        backend.failures["release"] = failure

    with pytest.raises(LockLostError) as caught:
        inside(locker.lock("k", auto_extend=False), body)
    assert caught.value.reason == "expired"
    assert events.types() == ["acquired", "lost", "release_failed"]
    assert events.of("release_failed")[0].error is failure


def test_case3_release_error_after_a_good_block_is_an_event_and_stops_the_heartbeat(
    locker: Locker, backend: RecordingBackend, clock: FakeClock, events: EventLog
) -> None:
    failure = Broken("down")
    with locker.lock("k") as lock:
        backend.failures["release"] = failure
    assert events.types() == ["acquired", "release_failed"]
    assert events.of("release_failed")[0].error is failure
    del backend.failures["release"]
    advance_to_beat(clock, locker, START + 10.0)
    advance_to_beat(clock, locker, START + 20.0)
    assert backend.called("extend") == [], "the heartbeat stopped: the key runs out on its own"
    assert backend.is_held("k", lock.token)


def test_released_inside_the_block_is_not_a_loss(locker: Locker, events: EventLog) -> None:
    with locker.lock("k") as lock:
        assert lock.release() is True
    assert lock.state == "released"
    assert events.types() == ["acquired", "released"]


def test_with_enters_a_held_lock_as_it_is(locker: Locker, backend: RecordingBackend) -> None:
    lock = locker.acquire("k")
    with lock as entered:
        assert entered is lock
    assert lock.state == "released"
    assert len(backend.called("acquire")) == 1


def test_with_refuses_a_released_or_lost_lock(locker: Locker, backend: RecordingBackend) -> None:
    released = locker.acquire("a")
    released.release()
    lost = locker.acquire("b")
    backend.force_release("b")
    lost.is_held()
    for lock in (released, lost):
        with pytest.raises(LockStateError), lock:
            pytest.fail("the block must not run")


# -- with lockset ---------------------------------------------------------------------------------


def test_lockset_case1_block_error_propagates(
    locker: Locker, backend: RecordingBackend, clock: FakeClock, events: EventLog
) -> None:
    def body() -> None:
        clock.advance(40.0)
        backend.failures["release"] = Broken("down")
        raise Boom

    with pytest.raises(Boom):
        inside(locker.acquire_many(["a", "b"], auto_extend=False), body)
    assert len(events.of("release_failed")) == 2


def test_lockset_case2_one_lost_lock_raises_for_the_set(
    locker: Locker, backend: RecordingBackend, events: EventLog
) -> None:
    with pytest.raises(LockLostError) as caught, locker.acquire_many(["a", "b"]) as locks:
        take_key_away(backend, "b")
    assert (caught.value.key, caught.value.reason, caught.value.completed) == ("b", "release", True)
    # The other lock was still released normally.
    assert locks.locks[0].state == "released"
    assert not backend.inspect("a").held


def test_lockset_case3_release_error_is_an_event(
    locker: Locker, backend: RecordingBackend, events: EventLog
) -> None:
    with locker.acquire_many(["a", "b"]) as locks:
        backend.failures["release"] = Broken("down")
    assert len(events.of("release_failed")) == 2
    assert locks.state == "held"


def test_lockset_released_inside_the_block_is_not_a_loss(locker: Locker) -> None:
    with locker.acquire_many(["a", "b"]) as locks:
        assert locks.release() is True
    assert locks.state == "released"


def test_lockset_refuses_with_once_released(locker: Locker) -> None:
    locks = locker.acquire_many(["a", "b"])
    locks.release()
    with pytest.raises(LockStateError), locks:
        pytest.fail("the block must not run")


# -- @locker.locked -------------------------------------------------------------------------------


def test_locked_runs_under_a_fresh_lock_per_call(
    locker: Locker, backend: RecordingBackend, events: EventLog
) -> None:
    seen: list[Optional[str]] = []

    @locker.locked("job")
    def job(value: int) -> int:
        seen.append(locker.get("job").owner)
        return value * 2

    assert job(21) == 42
    assert job(1) == 2
    assert seen == [locker.owner, locker.owner]
    assert events.types() == ["acquired", "released"] * 2
    assert job.__name__ == "job"


def test_locked_key_callable_receives_the_call_arguments(locker: Locker, backend: RecordingBackend) -> None:
    @locker.locked(lambda order_id, **_: f"order:{order_id}")
    def settle(order_id: int, *, amount: int) -> int:
        assert backend.inspect(f"order:{order_id}").held
        return amount

    assert settle(7, amount=3) == 3
    assert backend.called("acquire")[0][1] == "order:7"


def test_locked_block_error_propagates(locker: Locker, backend: RecordingBackend) -> None:
    @locker.locked("job")
    def job() -> None:
        raise Boom

    with pytest.raises(Boom):
        job()
    assert not backend.inspect("job").held


def test_locked_loss_carries_the_result(locker: Locker, clock: FakeClock) -> None:
    @locker.locked("job", auto_extend=False)
    def job() -> str:
        clock.advance(40.0)
        return "done"

    with pytest.raises(LockLostError) as caught:
        job()
    assert (caught.value.completed, caught.value.result, caught.value.reason) == (True, "done", "expired")


def test_locked_release_error_keeps_the_result(
    locker: Locker, backend: RecordingBackend, events: EventLog
) -> None:
    @locker.locked("job")
    def job() -> str:
        backend.failures["release"] = Broken("down")
        return "done"

    assert job() == "done"
    assert events.types()[-1] == "release_failed"


def test_locked_contention_raises_without_running(locker: Locker, backend: RecordingBackend) -> None:
    backend.acquire("job", OTHER, 60.0, "other")
    ran: list[int] = []
    job: Callable[[], int] = locker.locked("job", blocking=False)(lambda: ran.append(1) or 1)
    with pytest.raises(LockHeldError):
        job()
    assert ran == []


def test_locked_skip_returns_none_after_one_attempt(locker: Locker, backend: RecordingBackend) -> None:
    backend.acquire("job", OTHER, 60.0, "other")
    backend.calls.clear()
    ran: list[int] = []

    @locker.locked("job", skip=True)
    def job() -> int:
        ran.append(1)
        return 1

    assert job() is None
    assert ran == []
    assert len(backend.called("acquire")) == 1
    backend.release("job", OTHER)
    assert job() == 1


def test_locked_skip_with_timeout_waits_first(
    clock: FakeClock, sleeps: list[float]
) -> None:
    backend = SilentBackend(clock=clock)
    backend.acquire("job", OTHER, 3600.0, "other")
    locker = Locker(backend, clock=clock, heartbeat_thread=False)
    job = locker.locked("job", skip=True, timeout=1.0)(lambda: 1)
    assert job() is None
    assert sum(sleeps) == 1.0
    assert len(backend.called("acquire")) > 2
    locker.close()
