"""Races and edge cases a review of the core found; each test failed before its fix."""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import timedelta
from typing import ClassVar

import pytest
from lease_lock import (
    Capabilities,
    Locker,
    LockHeldError,
    LockStateError,
    MemoryBackend,
    Retry,
    ValidationError,
    exponential_backoff,
)
from lease_lock._lease import BEATS
from lease_lock.backends.base import ExtendRequest

from .fakes import START, EventLog, FakeClock, RecordingBackend, SilentBackend

SECRET = "SECRET-token-0123456789abcdef"  # noqa: S105 - a test token, not a password


class UnbatchedBackend(RecordingBackend):
    """No extend_many: the heartbeat sends due extensions one after the other."""

    capabilities: ClassVar[Capabilities] = replace(MemoryBackend.capabilities, batch_extend=False)


def test_close_while_an_acquire_waits_ends_the_wait(backend: RecordingBackend, clock: FakeClock) -> None:
    holder = Locker(backend, clock=clock, heartbeat_thread=False)
    waiter_locker = Locker(backend, clock=clock, heartbeat_thread=False)
    held = holder.acquire("k")
    outcome: list[object] = []
    registered = threading.Event()
    backend.hooks["acquire"] = registered.set  # the waiter's first attempt failed: it now waits

    def wait() -> None:
        try:
            outcome.append(waiter_locker.acquire("k", timeout=60))
        except LockStateError as error:
            outcome.append(error)

    thread = threading.Thread(target=wait)
    thread.start()
    assert registered.wait(30)
    waiter_locker.close()
    held.release()  # the key is free now: a waiter that kept going would take it
    thread.join(30)
    assert not thread.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], LockStateError)
    assert not backend.inspect("k").held
    holder.close()


def test_concurrent_releases_answer_once(clock: FakeClock) -> None:
    gate = threading.Event()
    entered = threading.Event()

    class SlowRelease(RecordingBackend):
        def release(self, key: str, token: str) -> bool:
            entered.set()
            assert gate.wait(30)
            return super().release(key, token)

    events = EventLog()
    locker = Locker(SlowRelease(clock=clock), clock=clock, heartbeat_thread=False, on_event=events)
    lock = locker.acquire("k")
    answers: list[bool] = []
    first = threading.Thread(target=lambda: answers.append(lock.release()))
    first.start()
    assert entered.wait(30)
    assert lock.release() is False  # the other release is in flight: it answers
    gate.set()
    first.join(30)
    assert answers == [True]
    assert lock.state == "released"
    assert events.types() == ["acquired", "released"]
    locker.close()


def test_extensions_sent_late_in_a_beat_stay_within_max_hold(clock: FakeClock) -> None:
    backend = UnbatchedBackend(clock=clock)
    locker = Locker(backend, clock=clock, heartbeat_thread=False, ttl=10, max_hold=12)
    locks = [locker.acquire(name) for name in ("a", "b")]
    backend.hooks["extend"] = lambda: clock.advance(0.5)  # each extension takes half a second
    deadline = START + 12
    while clock() < deadline + 0.2:
        clock.advance(0.25)
        locker.run_heartbeat()
    for lock in locks:
        assert lock.state == "lost" and lock.lost_reason == "max-hold"
        assert not backend.inspect(lock.key).held, "the store lease must not outlive the deadline"
    locker.close()


def test_a_lapse_check_racing_an_extension_does_not_lose_the_lock(locker: Locker, clock: FakeClock) -> None:
    lock = locker.acquire("k")
    old_end = lock._lease_end
    # The heartbeat extends in time; a reader that saw the old end only then tries to mark it.
    sent = clock.advance(10)
    with lock._mutex:
        lock._in_flight += 1
    assert BEATS.answered(lock, sent, clock(), 30.0, True)
    clock.set(old_end + 0.001)
    assert lock._mark_lost(None, lapsed=True) is False
    assert lock.state == "held"


def test_try_acquire_with_a_set_cancel_event_is_not_contention(locker: Locker) -> None:
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(LockHeldError) as caught:
        locker.try_acquire("k", cancel=cancel)
    assert caught.value.reason == "cancelled"


def test_lockset_signal_hears_every_member(locker: Locker, backend: RecordingBackend) -> None:
    both = locker.acquire_many(["a", "b"])
    backend.force_release("b")
    assert both.locks[1].is_held() is False
    # The member told the set: its own flag is up, so a waiter wakes at once.
    assert threading.Event.is_set(both.lost)
    assert both.lost.wait(0)


def test_acquire_many_whose_first_lease_ran_out_is_contention(clock: FakeClock, sleeps: list[float]) -> None:
    backend = SilentBackend(clock=clock)
    holder = Locker(backend, clock=clock, heartbeat_thread=False)
    locker = Locker(backend, clock=clock, heartbeat_thread=False, retry=Retry(delay=0.5))
    # "a" (ttl 2, not extended) is taken first; "b" is busy for 5 s, so "a" lapses meanwhile.
    blocker = holder.acquire("b", ttl=5, auto_extend=False)
    with pytest.raises(LockHeldError) as caught:
        locker.acquire_many(["a", "b"], ttl=2, auto_extend=False, timeout=60)
    assert caught.value.reason == "late-acquire"
    assert not backend.inspect("a").held
    blocker.release()
    holder.close()
    locker.close()


def test_failed_manual_extension_does_not_start_auto_extension(
    backend: RecordingBackend, clock: FakeClock, locker: Locker
) -> None:
    lock = locker.acquire("k", auto_extend=False)
    backend.failures["extend"] = ConnectionError("network down")
    with pytest.raises(ConnectionError):
        lock.extend()
    del backend.failures["extend"]
    for _ in range(10):
        clock.advance(2)
        locker.run_heartbeat()
    assert len(backend.called("extend")) == 1


def test_release_failure_on_exit_still_reports_the_end(
    backend: RecordingBackend, clock: FakeClock, locker: Locker, events: EventLog
) -> None:
    backend.failures["release"] = ConnectionError("network down")
    with locker.lock("k"):
        pass
    assert events.types() == ["acquired", "release_failed"]
    clock.advance(31)
    locker.run_heartbeat()  # nobody reads the lock: the heartbeat reports its end
    assert events.types() == ["acquired", "release_failed", "lost"]


def test_timedelta_retry_delay_works_in_an_acquisition(sleeps: list[float], clock: FakeClock) -> None:
    backend = SilentBackend(clock=clock)
    holder = Locker(backend, clock=clock, heartbeat_thread=False)
    locker = Locker(
        backend, clock=clock, heartbeat_thread=False, retry=Retry(delay=timedelta(milliseconds=250), timeout=1)
    )
    holder.acquire("k")
    with pytest.raises(LockHeldError):
        locker.acquire("k")
    assert sleeps[0] == 0.25
    holder.close()
    locker.close()


def test_tokens_stay_out_of_reprs(locker: Locker) -> None:
    lock = locker.lock("k", token=SECRET)
    for text in (repr(lock), repr(lock._options), repr(ExtendRequest("k", SECRET, 30.0))):
        assert SECRET not in text


@pytest.mark.parametrize(
    "call",
    [
        lambda locker: locker.lock("k", ttl=10**400),
        lambda locker: locker.acquire("k", timeout=10**400),
        lambda locker: Retry(timeout=10**400),
        lambda locker: exponential_backoff(jitter="no"),
        lambda locker: list(locker.list("bad\x00prefix")),
        lambda locker: list(locker.list("p" * 2000)),
    ],
    ids=["huge ttl", "huge timeout", "huge retry timeout", "jitter not a bool", "NUL prefix", "long prefix"],
)
def test_more_bad_input_is_a_validation_error(locker: Locker, backend: RecordingBackend, call: object) -> None:
    with pytest.raises(ValidationError):
        call(locker)  # type: ignore[operator]
    assert backend.calls == []


def test_decorating_with_a_closed_locker_fails_at_once(locker: Locker) -> None:
    locker.close()
    with pytest.raises(LockStateError):
        locker.locked("k")
