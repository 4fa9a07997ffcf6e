"""The acquire loop's parts: one attempt and its outcome, the pause picker, and the loop that
joins them, on fake time (waits sleep on the fake clock; latency is counted in attempts)."""

from __future__ import annotations

import contextlib
import math
import threading
from typing import ContextManager, Iterator, Optional

import pytest
from lease_lock import BackendUnavailableError, Locker, LockHeldError, MemoryBackend, RateLimitedError, Retry
from lease_lock._acquisition import (
    GRANTED,
    HELD,
    LATE,
    RATE_LIMITED,
    UNREACHABLE,
    Acquisition,
    Attempts,
    Outcome,
    pick_pause,
)
from lease_lock._lease import local_end
from lease_lock.backends.base import WaitingLine
from lease_lock.backends.service import RequestIdCarrier, SlowDown, ask_grant
from lease_lock.clock import QUIET_PAUSE
from lease_lock.lock import Lock
from lease_lock.retry import DEFAULT_RETRY, RetryState

from .fakes import EventLog, FakeClock, RecordingBackend, SilentBackend

OTHER = "o" * 32


class SlowingBackend(SilentBackend):
    """Answers the first ``refusals`` acquisitions with a rate limit asking for ``retry_after``."""

    def __init__(self, clock: FakeClock, refusals: int, retry_after: float) -> None:
        super().__init__(clock=clock)
        self.refusals = refusals
        self.retry_after = retry_after

    def acquire(self, key: str, token: str, ttl: float, owner: str) -> bool:
        if len(self.called("acquire")) < self.refusals:
            self.calls.append(("acquire", key, ttl))
            raise RateLimitedError("slow down (test)", retry_after=self.retry_after)
        return super().acquire(key, token, ttl, owner)


def acquisition(backend: MemoryBackend, clock: FakeClock, *, fencing: bool = False) -> Acquisition:
    return Acquisition(
        backend, clock, retry=DEFAULT_RETRY, max_hold=3600.0, fencing=fencing, owner="me", reentrant=False,
        on_event=None,
    )


def tries(clock: FakeClock, *, retries: float = 5, policy: Retry = DEFAULT_RETRY) -> Attempts:
    return Attempts(policy, retries, 10.0, 30.0, None, clock())


@pytest.fixture
def lock(backend: RecordingBackend, clock: FakeClock) -> Iterator[Lock]:
    """An unheld lock on key ``k`` (its key and token are all an attempt reads)."""
    locker = Locker(backend, clock=clock, heartbeat_thread=False, ttl=30.0)
    yield locker.lock("k")
    locker.close()


# -- one attempt, one outcome ------------------------------------------------------------------


def test_a_free_key_is_granted_with_its_local_end(backend: RecordingBackend, clock: FakeClock, lock: Lock) -> None:
    state = tries(clock)
    assert acquisition(backend, clock).attempt(lock, state) == GRANTED
    assert state.attempts == 1
    assert state.end == local_end(state.sent, 30.0, state.received)
    assert state.fence is None
    assert backend.called("acquire") == [("acquire", "k", 30.0)]


def test_a_fenced_grant_carries_the_stores_fence(backend: RecordingBackend, clock: FakeClock, lock: Lock) -> None:
    state = tries(clock)
    assert acquisition(backend, clock, fencing=True).attempt(lock, state) == GRANTED
    assert state.fence == backend.inspect("k").fence
    assert len(backend.called("acquire_fenced")) == 1


def test_a_key_held_by_another_is_held(backend: RecordingBackend, clock: FakeClock, lock: Lock) -> None:
    backend.acquire("k", OTHER, 3600.0, "other")
    state = tries(clock)
    assert acquisition(backend, clock).attempt(lock, state) == HELD
    assert state.attempts == 1


def test_a_grant_answered_after_the_lease_ended_is_late(
    backend: RecordingBackend, clock: FakeClock, lock: Lock
) -> None:
    backend.hooks["acquire"] = lambda: clock.advance(30.0)
    state = tries(clock)
    assert acquisition(backend, clock).attempt(lock, state) == LATE
    assert state.received - state.sent == 30.0


def test_a_rate_limit_is_an_outcome_while_attempts_may_follow(clock: FakeClock, lock: Lock) -> None:
    backend = SlowingBackend(clock, refusals=1, retry_after=7.0)
    state = tries(clock, retries=1)
    assert acquisition(backend, clock).attempt(lock, state) == RATE_LIMITED
    assert state.asked == 7.0


def test_a_rate_limit_on_the_last_attempt_raises_the_stores_error(clock: FakeClock, lock: Lock) -> None:
    backend = SlowingBackend(clock, refusals=1, retry_after=7.0)
    with pytest.raises(RateLimitedError) as caught:
        acquisition(backend, clock).attempt(lock, tries(clock, retries=0))
    assert caught.value.retry_after == 7.0


def test_an_outage_is_an_outcome_until_an_answer_ends_it(
    backend: RecordingBackend, clock: FakeClock, lock: Lock
) -> None:
    down = BackendUnavailableError("down (test)", backend="memory")
    backend.failures["acquire"] = down
    acquiring, state = acquisition(backend, clock), tries(clock)
    assert acquiring.attempt(lock, state) == UNREACHABLE
    assert (state.unreachable, state.outage) == (True, down)
    del backend.failures["acquire"]
    assert acquiring.attempt(lock, state) == GRANTED
    assert (state.attempts, state.unreachable, state.outage) == (2, False, None)


def test_a_single_attempt_raises_an_outage(backend: RecordingBackend, clock: FakeClock, lock: Lock) -> None:
    down = BackendUnavailableError("down (test)", backend="memory")
    backend.failures["acquire"] = down
    with pytest.raises(BackendUnavailableError) as caught:
        acquisition(backend, clock).attempt(lock, tries(clock, retries=0))
    assert caught.value is down


def test_each_attempt_after_the_first_is_timed_from_its_own_sending(
    backend: RecordingBackend, clock: FakeClock, lock: Lock
) -> None:
    backend.acquire("k", OTHER, 3600.0, "other")
    acquiring, state = acquisition(backend, clock), tries(clock)
    acquiring.attempt(lock, state)
    clock.advance(2.0)
    acquiring.attempt(lock, state)
    assert (state.start, state.sent, state.attempts) == (clock() - 2.0, clock(), 2)


# -- the backend's side: request ids and rate limits ---------------------------------------------


class CarryingBackend(MemoryBackend, RequestIdCarrier):
    """Records the request id in scope when each acquisition arrives."""

    def __init__(self) -> None:
        super().__init__()
        self.current: Optional[str] = None
        self.seen: list[Optional[str]] = []

    def request_id_scope(self, request_id: Optional[str]) -> ContextManager[None]:
        return self._scope(request_id)

    @contextlib.contextmanager
    def _scope(self, request_id: Optional[str]) -> Iterator[None]:
        self.current = request_id
        try:
            yield
        finally:
            self.current = None

    def acquire_fenced(self, key: str, token: str, ttl: float, owner: str) -> Optional[int]:
        self.seen.append(self.current)
        return super().acquire_fenced(key, token, ttl, owner)


def test_ask_grant_carries_the_request_id_to_a_backend_that_takes_one() -> None:
    backend = CarryingBackend()
    assert ask_grant(backend, "k", "t" * 32, 5.0, "me", True, "req-1") == backend.inspect("k").fence
    assert ask_grant(backend, "j", "t" * 32, 5.0, "me", True, None) is not None
    assert backend.seen == ["req-1", None]


def test_ask_grant_answers_an_unfenced_grant_with_zero_and_a_refusal_with_none() -> None:
    backend = MemoryBackend()
    assert ask_grant(backend, "k", "t" * 32, 5.0, "me", False, "ignored without a carrier") == 0
    assert ask_grant(backend, "k", OTHER, 5.0, "me", False, None) is None


def test_ask_grant_turns_a_rate_limit_into_a_pause(clock: FakeClock) -> None:
    answer = ask_grant(SlowingBackend(clock, refusals=1, retry_after=3.0), "k", "t" * 32, 5.0, "me", False, None)
    assert isinstance(answer, SlowDown)
    assert answer.seconds == 3.0
    assert answer.error.retry_after == 3.0


# -- the pause picker --------------------------------------------------------------------------


class _Line(WaitingLine):
    """A line that is never woken: what pick_pause reads is only whether there is one."""

    def ask(self) -> Optional[int]:
        return None

    def wait(self, seconds: float) -> None:
        return None

    def leave(self, granted: bool) -> None:
        pass


def in_line(state: Attempts) -> Attempts:
    state.line = _Line()
    return state


def test_a_rate_limit_is_waited_in_full_and_spends_no_retry_delay(clock: FakeClock) -> None:
    asked: list[RetryState] = []
    state = in_line(tries(clock, policy=DEFAULT_RETRY.merged(Retry(delay=lambda retry: asked.append(retry) or 0.25))))
    state.asked = 7.0
    assert pick_pause(state, RATE_LIMITED, 1.0) == (7.0, False)
    assert (asked, state.previous_delay) == ([], None)


@pytest.mark.parametrize("outcome", [HELD, LATE, UNREACHABLE])
def test_without_a_line_the_retry_delay_is_the_pause(clock: FakeClock, outcome: Outcome) -> None:
    state = tries(clock, policy=DEFAULT_RETRY.merged(Retry(delay=0.5)))
    assert pick_pause(state, outcome, 1.0) == (0.5, False)
    assert state.previous_delay == 0.5


@pytest.mark.parametrize("outcome", [HELD, LATE, UNREACHABLE])
def test_without_a_line_and_a_delay_the_pause_is_the_quiet_one(clock: FakeClock, outcome: Outcome) -> None:
    assert DEFAULT_RETRY.delay is None
    assert pick_pause(tries(clock), outcome, 1.0) == (QUIET_PAUSE, False)


def test_the_retry_delay_hears_the_attempt_the_elapsed_time_and_the_previous_delay(clock: FakeClock) -> None:
    asked: list[RetryState] = []
    state = tries(clock, policy=DEFAULT_RETRY.merged(Retry(delay=lambda retry: asked.append(retry) or 0.25)))
    state.attempts = 1
    pick_pause(state, HELD, 0.5)
    state.attempts = 2
    pick_pause(in_line(state), HELD, 1.0)
    assert asked == [RetryState(1, 0.5, None), RetryState(2, 1.0, 0.25)]


@pytest.mark.parametrize(("outcome", "pause"), [(HELD, math.inf), (LATE, 0.0)])
def test_in_line_without_a_delay_the_line_alone_ends_the_pause(
    clock: FakeClock, outcome: Outcome, pause: float
) -> None:
    assert pick_pause(in_line(tries(clock)), outcome, 1.0) == (pause, True)


@pytest.mark.parametrize(("outcome", "pause"), [(HELD, 0.5), (LATE, 0.0)])
def test_in_line_a_set_delay_bounds_the_pause(clock: FakeClock, outcome: Outcome, pause: float) -> None:
    state = in_line(tries(clock, policy=DEFAULT_RETRY.merged(Retry(delay=0.5))))
    assert pick_pause(state, outcome, 1.0) == (pause, True)
    # The delay is what the next attempt's policy hears, not the shortened wait.
    assert state.previous_delay == 0.5


@pytest.mark.parametrize(("delay", "pause"), [(None, QUIET_PAUSE), (0.5, 0.5)])
def test_in_line_an_outage_waits_out_of_line(clock: FakeClock, delay: Optional[float], pause: float) -> None:
    state = in_line(tries(clock, policy=DEFAULT_RETRY.merged(Retry(delay=delay))))
    assert pick_pause(state, UNREACHABLE, 1.0) == (pause, False)


# -- the loop that joins them ------------------------------------------------------------------


def test_a_waiting_acquire_sleeps_each_rate_limit_out_and_counts_it_as_an_attempt(
    clock: FakeClock, sleeps: list[float], events: EventLog
) -> None:
    backend = SlowingBackend(clock, refusals=2, retry_after=3.0)
    locker = Locker(backend, clock=clock, heartbeat_thread=False, on_event=events, retry=Retry(delay=0.25))
    lock = locker.acquire("k", timeout=30.0)
    assert lock.state == "held"
    assert sleeps == [3.0, 3.0]
    assert events.of("acquired")[0].attempts == 3
    assert events.of("contended") == []
    locker.close()


def test_a_rate_limit_longer_than_the_time_left_is_cut_to_it(
    clock: FakeClock, sleeps: list[float], events: EventLog
) -> None:
    backend = SlowingBackend(clock, refusals=100, retry_after=60.0)
    locker = Locker(backend, clock=clock, heartbeat_thread=False, on_event=events)
    with pytest.raises(LockHeldError) as caught:
        locker.acquire("k", timeout=2.0)
    assert (caught.value.reason, caught.value.attempts) == ("timeout", 1)
    assert sleeps == [2.0]
    assert len(backend.called("acquire")) == 1
    assert [event.attempts for event in events.of("timed_out")] == [1]
    locker.close()


def test_a_try_acquire_raises_the_rate_limit_after_its_one_attempt(clock: FakeClock, sleeps: list[float]) -> None:
    backend = SlowingBackend(clock, refusals=1, retry_after=7.0)
    locker = Locker(backend, clock=clock, heartbeat_thread=False)
    with pytest.raises(RateLimitedError):
        locker.try_acquire("k")
    assert sleeps == []
    assert not backend.inspect("k").held
    locker.close()


def test_the_spent_retries_raise_the_last_rate_limit(clock: FakeClock, sleeps: list[float]) -> None:
    backend = SlowingBackend(clock, refusals=100, retry_after=1.0)
    locker = Locker(backend, clock=clock, heartbeat_thread=False, retry=Retry(retries=2))
    with pytest.raises(RateLimitedError):
        locker.acquire("k")
    assert sleeps == [1.0, 1.0]
    assert len(backend.called("acquire")) == 3
    locker.close()


def test_a_cancel_ends_the_wait_in_cancel_slices_of_the_fake_clock(clock: FakeClock, sleeps: list[float]) -> None:
    backend = SilentBackend(clock=clock)
    backend.acquire("k", OTHER, 3600.0, "other")
    backend.calls.clear()
    cancel = threading.Event()
    locker = Locker(backend, clock=clock, heartbeat_thread=False, retry=Retry(delay=1.0))
    backend.hooks["acquire"] = lambda: cancel.set() if len(backend.called("acquire")) == 3 else None
    with pytest.raises(LockHeldError) as caught:
        locker.acquire("k", cancel=cancel, timeout=30.0)
    assert (caught.value.reason, caught.value.attempts) == ("cancelled", 3)
    # Two full delays, then the third wait stopped at its first look at the cancel event.
    assert sum(sleeps) == pytest.approx(2.0)
    assert max(sleeps) == pytest.approx(0.05)
    locker.close()


def test_a_notified_wait_on_injected_time_spends_the_timeout_on_the_fake_clock(
    backend: RecordingBackend, clock: FakeClock, sleeps: list[float]
) -> None:
    backend.acquire("k", OTHER, 3600.0, "other")
    locker = Locker(backend, clock=clock, heartbeat_thread=False, retry=Retry(delay=0.25))
    with pytest.raises(LockHeldError) as caught:
        locker.acquire("k", timeout=1.0)
    assert (caught.value.reason, caught.value.attempts) == ("timeout", 4)
    assert sleeps == [0.25, 0.25, 0.25, 0.25]
    locker.close()
