"""A store that cannot be reached: waiting acquisitions ride it out, single attempts raise.

The backend here is a memory backend told to fail with ``BackendUnavailableError`` (a fake, for
speed and exact counting); the same behaviour against a real store that becomes unavailable is
in ``tests/backends/test_sqlite_outage.py`` and ``tests/backends/test_redis_waiting_outage.py``.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Optional

import pytest
from lease_lock import BackendUnavailableError, Locker, LockHeldError, LockStateError, Retry

from tests.support.cycles import collector_off

from .fakes import EventLog, FakeClock, SilentBackend


class FlakyBackend(SilentBackend):
    """Acquisitions raise ``BackendUnavailableError`` while ``down`` is above zero (each failed
    call counts it down; ``-1`` means down for ever)."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock=clock)
        self.down = 0
        self.raised: list[BackendUnavailableError] = []

    def _fail_if_down(self) -> None:
        if self.down:
            if self.down > 0:
                self.down -= 1
            # Raised from the list, not from a local: the error's traceback holds this frame,
            # which must not hold the error (see the test of a dropped lock after an outage).
            self.raised.append(BackendUnavailableError("memory store unreachable (test)", backend="memory"))
            raise self.raised[-1]

    def acquire(self, key: str, token: str, ttl: float, owner: str) -> bool:
        self._fail_if_down()
        return super().acquire(key, token, ttl, owner)

    def acquire_fenced(self, key: str, token: str, ttl: float, owner: str) -> Optional[int]:
        self._fail_if_down()
        return super().acquire_fenced(key, token, ttl, owner)


@pytest.fixture
def flaky(clock: FakeClock) -> FlakyBackend:
    return FlakyBackend(clock)


@pytest.fixture
def flaky_locker(flaky: FlakyBackend, clock: FakeClock, events: EventLog, sleeps: list[float]) -> Locker:
    return Locker(flaky, clock=clock, heartbeat_thread=False, on_event=events, retry=Retry(delay=0.5, timeout=10.0))


def test_a_waiting_acquire_rides_out_an_outage(
    flaky: FlakyBackend, flaky_locker: Locker, events: EventLog, caplog: pytest.LogCaptureFixture
) -> None:
    flaky.down = 3
    with caplog.at_level(logging.WARNING, logger="lease_lock"):
        lock = flaky_locker.acquire("k")
    assert lock.state == "held"
    failed = events.of("attempt_failed")
    assert [event.attempt for event in failed] == [1, 2, 3]
    assert all(event.reason == "unavailable" for event in failed)
    assert [event.error for event in failed] == flaky.raised
    assert events.of("acquired")[0].attempts == 4
    # One warning when the outage starts and one when it ends, not one per attempt.
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 2, messages
    assert "backend unavailable while acquiring 'k'" in messages[0]
    assert "reachable again" in messages[1]
    flaky_locker.close()


def test_an_outage_past_the_timeout_raises_the_outage_with_the_attempts_made(
    flaky: FlakyBackend, flaky_locker: Locker, sleeps: list[float], events: EventLog
) -> None:
    flaky.down = -1
    with pytest.raises(BackendUnavailableError) as caught:
        flaky_locker.acquire("k", timeout=3.0)
    # The last attempt could not reach the store, so the wait says that, not "held": how many
    # attempts over how long, the driver's reason, and its error as the cause.
    assert caught.value.backend == "memory"
    assert str(caught.value) == (
        "store unreachable while acquiring 'k': 6 attempt(s) over 3.000s, "
        "the last one failed: memory store unreachable (test)"
    )
    assert caught.value.__cause__ is flaky.raised[-1]
    # Every attempt followed the retry schedule (0.5 s apart, at 0 to 2.5 s); none starts at
    # the end of the 3 s budget.
    assert len(flaky.raised) == 6
    assert sum(sleeps) == pytest.approx(3.0)
    assert events.of("timed_out")[0].attempts == 6
    flaky_locker.close()


def test_the_outages_driver_error_is_the_cause(clock: FakeClock, sleeps: list[float]) -> None:
    class DriverDown(SilentBackend):
        def acquire(self, key: str, token: str, ttl: float, owner: str) -> bool:
            try:
                raise ConnectionRefusedError(111, "Connection refused")
            except ConnectionRefusedError as driver:
                raise BackendUnavailableError("down: Connection refused", backend="fake") from driver

    with Locker(
        DriverDown(clock=clock), clock=clock, heartbeat_thread=False, retry=Retry(delay=0.5)
    ) as locker, pytest.raises(BackendUnavailableError) as caught:
        locker.acquire("k", timeout=1.0)
    assert "2 attempt(s) over 1.000s" in str(caught.value)
    assert "down: Connection refused" in str(caught.value)
    assert isinstance(caught.value.__cause__, ConnectionRefusedError)


def test_single_attempts_raise_the_outage_at_once(flaky: FlakyBackend, flaky_locker: Locker) -> None:
    flaky.down = -1
    with pytest.raises(BackendUnavailableError):
        flaky_locker.try_acquire("k")
    with pytest.raises(BackendUnavailableError):
        flaky_locker.acquire("k", blocking=False)
    with pytest.raises(BackendUnavailableError):
        flaky_locker.lock("k").acquire(blocking=False)
    assert len(flaky.raised) == 3
    flaky_locker.close()


def test_a_spent_retry_count_raises_the_outage_not_held(flaky: FlakyBackend, flaky_locker: Locker) -> None:
    flaky.down = -1
    with pytest.raises(BackendUnavailableError) as caught:
        flaky_locker.acquire("k", retry=Retry(retries=2))
    assert "3 attempt(s)" in str(caught.value)
    assert caught.value.__cause__ is flaky.raised[-1]
    assert len(flaky.raised) == 3
    flaky_locker.close()


def test_an_answered_attempt_after_an_outage_is_plain_contention(
    flaky: FlakyBackend, flaky_locker: Locker, clock: FakeClock
) -> None:
    holder = Locker(flaky, clock=clock, heartbeat_thread=False)
    holder.acquire("k", ttl=100)
    flaky.down = 2
    with pytest.raises(LockHeldError) as caught:
        flaky_locker.acquire("k", timeout=3.0)
    assert caught.value.reason == "timeout"
    # The last attempts were answered ("held"): the outage is over and is not the cause.
    assert caught.value.__cause__ is None
    holder.close()
    flaky_locker.close()


def test_a_cancelled_wait_during_an_outage(flaky: FlakyBackend, flaky_locker: Locker) -> None:
    flaky.down = -1
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(LockHeldError) as caught:
        flaky_locker.acquire("k", cancel=cancel)
    assert caught.value.reason == "cancelled"
    flaky_locker.close()


def test_lockset_run_on_a_set_that_is_not_held_does_not_call(locker: Locker) -> None:
    calls: list[str] = []
    released = locker.acquire_many(["a", "b"])
    released.release()
    with pytest.raises(LockStateError):
        released.run(calls.append, "released")
    lost = locker.acquire_many(["c", "d"])
    locker.force_release("c")
    assert not lost.locks[0].is_held()
    with pytest.raises(LockStateError):
        lost.run(calls.append, "lost")
    assert calls == []
    held = locker.acquire_many(["e", "f"])
    assert held.run(lambda: "ran") == "ran"
    assert held.state == "released"


@pytest.mark.parametrize("down", [1, 3], ids=["first-try", "later-tries"])
def test_a_lock_granted_after_an_outage_goes_as_soon_as_it_is_dropped(
    flaky: FlakyBackend, clock: FakeClock, sleeps: list[float], down: int
) -> None:
    # An outage's error kept by a frame it passed through makes a reference cycle (the error's
    # traceback holds that frame, and every frame it was called from, locals and all), which
    # only the cyclic collector frees: the lock in those frames, dropped by its holder, would
    # live on until a collection ran, and so would its lease. (No event hook and no log capture
    # here: a hook or a log handler that keeps the errors it is given keeps them alive itself.)
    flaky.down = down
    logging.disable(logging.CRITICAL)
    try:
        retry = Retry(delay=0.5, timeout=10.0)
        with collector_off(), Locker(flaky, clock=clock, heartbeat_thread=False, retry=retry) as locker:
            lock = locker.acquire("k")
            assert len(flaky.raised) == down and len(sleeps) == down  # an outage ridden out
            flaky.raised.clear()  # the test's own record of the errors
            dropped = weakref.ref(lock)
            del lock
            assert dropped() is None
    finally:
        logging.disable(logging.NOTSET)
