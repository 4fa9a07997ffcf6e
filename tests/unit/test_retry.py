"""Retry and waiting: per-field merge, delays, the timeout, cancellation, late grants."""

from __future__ import annotations

import math
import random
import threading
from typing import Iterator

import pytest
from lease_lock import Locker, LockHeldError, Retry, RetryState, exponential_backoff
from lease_lock.retry import DEFAULT_RETRY

from .fakes import EventLog, FakeClock, RecordingBackend, SilentBackend

OTHER = "o" * 32


@pytest.fixture
def silent(clock: FakeClock) -> SilentBackend:
    """A backend without release notifications, so waiters pace by ``delay`` (on fake time)."""
    return SilentBackend(clock=clock)


@pytest.fixture
def paced(silent: SilentBackend, clock: FakeClock, events: EventLog, sleeps: list[float]) -> Iterator[Locker]:
    """A locker whose waits move the fake clock, on a key held by someone else."""
    silent.acquire("busy", OTHER, 3600.0, "other")
    silent.calls.clear()
    locker = Locker(silent, clock=clock, heartbeat_thread=False, on_event=events)
    yield locker
    locker.close()


def attempts_made(backend: RecordingBackend, key: str = "busy") -> int:
    return len([call for call in backend.calls if call[0].startswith("acquire") and call[1] == key])


# -- merging --------------------------------------------------------------------------------------


def test_builtin_default_waits_ten_seconds_with_the_delay_unset() -> None:
    # Unset, the delay follows the waiting rule: the line's announcement, or the quiet pause.
    assert Retry(retries=math.inf, delay=None, timeout=10.0) == DEFAULT_RETRY
    assert DEFAULT_RETRY.delay_for(RetryState(1, 0.0, None)) == 0.2


def test_a_store_that_announces_nothing_is_asked_every_fifth_of_a_second(
    silent: SilentBackend, clock: FakeClock, sleeps: list[float]
) -> None:
    silent.acquire("busy", OTHER, 3600.0, "other")
    locker = Locker(silent, clock=clock, retry=Retry(retries=3))
    with pytest.raises(LockHeldError):
        locker.acquire("busy")
    assert sleeps == pytest.approx([0.2, 0.2, 0.2])
    locker.close()


def test_fields_merge_one_by_one_builtin_then_locker_then_call(
    silent: SilentBackend, clock: FakeClock, sleeps: list[float]
) -> None:
    silent.acquire("busy", OTHER, 3600.0, "other")
    locker = Locker(silent, clock=clock, heartbeat_thread=False, retry=Retry(retries=3))
    assert locker.retry == Retry(retries=3, delay=None, timeout=10.0)
    with pytest.raises(LockHeldError) as caught:
        locker.acquire("busy", retry=Retry(delay=0.5))
    # retries from the locker, delay from the call, timeout from the built-in default.
    assert caught.value.attempts == 4
    assert caught.value.reason == "held"
    assert sleeps == [0.5, 0.5, 0.5]
    locker.close()


def test_timeout_keyword_is_shorthand_for_retry_timeout(paced: Locker, sleeps: list[float]) -> None:
    with pytest.raises(LockHeldError) as caught:
        paced.acquire("busy", retry=Retry(delay=0.25, timeout=100.0), timeout=0.5)
    assert caught.value.reason == "timeout"
    assert sum(sleeps) == 0.5


def test_merged_keeps_unset_fields_and_replaces_set_ones() -> None:
    base = Retry(retries=5, delay=1.0, timeout=20.0)
    assert base.merged(None) is base
    assert base.merged(Retry()) == base
    assert base.merged(Retry(timeout=math.inf)) == Retry(retries=5, delay=1.0, timeout=math.inf)
    assert base.merged(Retry(retries=0, delay=0)) == Retry(retries=0, delay=0, timeout=20.0)


# -- timeout --------------------------------------------------------------------------------------


def test_last_wait_is_cut_to_the_time_left_and_no_attempt_follows(
    paced: Locker, silent: SilentBackend, sleeps: list[float], events: EventLog
) -> None:
    with pytest.raises(LockHeldError) as caught:
        paced.acquire("busy", retry=Retry(delay=0.375, timeout=1.0))
    # Attempts at 0, 0.375 and 0.75; the last wait is cut to 0.25 and nothing starts at 1.0.
    assert sleeps == [0.375, 0.375, 0.25]
    assert attempts_made(silent) == 3
    error = caught.value
    assert (error.reason, error.attempts, error.elapsed, error.key) == ("timeout", 3, 1.0, "busy")
    assert [event.attempt for event in events.of("contended")] == [1, 2, 3]


def test_zero_timeout_makes_exactly_one_attempt(paced: Locker, silent: SilentBackend, sleeps: list[float]) -> None:
    with pytest.raises(LockHeldError) as caught:
        paced.acquire("busy", timeout=0)
    assert caught.value.reason == "timeout"
    assert attempts_made(silent) == 1
    assert sleeps == []


def test_retries_spent_before_the_timeout_reads_held(paced: Locker, sleeps: list[float]) -> None:
    with pytest.raises(LockHeldError) as caught:
        paced.acquire("busy", retry=Retry(retries=2, delay=0.25))
    assert (caught.value.reason, caught.value.attempts) == ("held", 3)
    assert sleeps == [0.25, 0.25]


def test_retries_zero_and_blocking_false_make_one_attempt(paced: Locker, silent: SilentBackend) -> None:
    with pytest.raises(LockHeldError):
        paced.acquire("busy", retry=Retry(retries=0))
    with pytest.raises(LockHeldError):
        paced.acquire("busy", blocking=False)
    assert attempts_made(silent) == 2


# -- delay functions ------------------------------------------------------------------------------


def test_delay_callable_gets_attempt_elapsed_and_previous_delay(paced: Locker, sleeps: list[float]) -> None:
    seen: list[RetryState] = []

    def delay(state: RetryState) -> float:
        seen.append(state)
        return 0.25 * state.attempt

    with pytest.raises(LockHeldError):
        paced.acquire("busy", retry=Retry(retries=3, delay=delay))
    assert seen == [
        RetryState(attempt=1, elapsed=0.0, previous_delay=None),
        RetryState(attempt=2, elapsed=0.25, previous_delay=0.25),
        RetryState(attempt=3, elapsed=0.75, previous_delay=0.5),
    ]
    assert sleeps == [0.25, 0.5, 0.75]


def test_exponential_backoff_without_jitter_doubles_up_to_max() -> None:
    delay = exponential_backoff(base=0.1, max=1.0, jitter=False)
    values = [delay(RetryState(attempt, 0.0, None)) for attempt in range(1, 7)]
    assert values == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    # A huge attempt count stays at the ceiling instead of overflowing.
    assert delay(RetryState(10_000, 0.0, None)) == 1.0


def test_exponential_backoff_jitter_is_uniform_below_the_step() -> None:
    random.seed(7)
    delay = exponential_backoff()
    samples = [delay(RetryState(3, 0.0, None)) for _ in range(2000)]
    assert all(0.0 <= sample <= 0.4 for sample in samples)
    # Spread over the whole range, not clustered at one end.
    assert min(samples) < 0.04 and max(samples) > 0.36
    assert 0.17 < sum(samples) / len(samples) < 0.23


def test_exponential_backoff_defaults() -> None:
    delay = exponential_backoff(jitter=False)
    assert delay(RetryState(1, 0.0, None)) == pytest.approx(0.1)
    assert delay(RetryState(100, 0.0, None)) == 5.0


def test_exponential_backoff_drives_the_waits(paced: Locker, sleeps: list[float]) -> None:
    with pytest.raises(LockHeldError):
        paced.acquire("busy", retry=Retry(retries=4, delay=exponential_backoff(base=0.25, max=1.0, jitter=False)))
    assert sleeps == [0.25, 0.5, 1.0, 1.0]


# -- cancellation ---------------------------------------------------------------------------------


def test_cancel_set_before_the_call_makes_no_attempt(paced: Locker, silent: SilentBackend) -> None:
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(LockHeldError) as caught:
        paced.acquire("free", cancel=cancel)
    assert (caught.value.reason, caught.value.attempts) == ("cancelled", 0)
    assert silent.calls == []


def test_cancel_during_the_wait_stops_it(paced: Locker, sleeps: list[float]) -> None:
    cancel = threading.Event()

    def delay(state: RetryState) -> float:
        if state.attempt == 2:
            cancel.set()
        return 0.25

    with pytest.raises(LockHeldError) as caught:
        paced.acquire("busy", cancel=cancel, retry=Retry(delay=delay))
    assert (caught.value.reason, caught.value.attempts) == ("cancelled", 2)


def test_grant_won_while_cancelling_is_given_back(
    locker: Locker, backend: RecordingBackend, events: EventLog
) -> None:
    cancel = threading.Event()
    backend.hooks["acquire"] = cancel.set
    with pytest.raises(LockHeldError) as caught:
        locker.acquire("k", cancel=cancel)
    assert caught.value.reason == "cancelled"
    assert not backend.inspect("k").held
    assert backend.called("release") == [("release", "k", None)]
    assert "acquired" not in events.types()


# -- late grants ----------------------------------------------------------------------------------


def test_try_acquire_late_grant_raises_late_acquire(
    locker: Locker, backend: RecordingBackend, clock: FakeClock, events: EventLog
) -> None:
    backend.hooks["acquire"] = lambda: clock.advance(29.75)  # beyond 99% of the 30 s lease
    with pytest.raises(LockHeldError) as caught:
        locker.try_acquire("k")
    assert (caught.value.reason, caught.value.attempts) == ("late-acquire", 1)
    assert not backend.inspect("k").held, "the late lease must be given back"
    assert [(event.type, event.reason, event.attempt) for event in events] == [("contended", "late", 1)]


def test_reply_just_inside_the_lease_is_a_grant(locker: Locker, backend: RecordingBackend, clock: FakeClock) -> None:
    backend.hooks["acquire"] = lambda: clock.advance(29.5)
    lock = locker.try_acquire("k")
    assert lock is not None and lock.state == "held"
    assert lock.expires_in == pytest.approx(30 * 0.99 - 29.5)


def test_blocking_acquire_counts_a_late_grant_as_a_failed_attempt(
    locker: Locker, backend: RecordingBackend, clock: FakeClock, events: EventLog
) -> None:
    slow = [True]

    def first_reply_late() -> None:
        if slow.pop() if slow else False:
            clock.advance(31.0)

    backend.hooks["acquire"] = first_reply_late
    lock = locker.acquire("k", timeout=60)
    assert lock.state == "held"
    assert [(event.type, event.reason) for event in events] == [("contended", "late"), ("acquired", None)]
    assert events.of("acquired")[0].attempts == 2


def test_every_grant_late_ends_with_late_acquire(locker: Locker, backend: RecordingBackend, clock: FakeClock) -> None:
    backend.hooks["acquire"] = lambda: clock.advance(40.0)
    with pytest.raises(LockHeldError) as caught:
        locker.acquire("k", retry=Retry(retries=2, timeout=math.inf))
    assert (caught.value.reason, caught.value.attempts) == ("late-acquire", 3)
    assert not backend.inspect("k").held
