"""The Lock object: states, release, extend, is_held, check and misuse."""

from __future__ import annotations

import threading

import pytest
from lease_lock import Lock, Locker, LockHeldError, LockLostError, LockStateError, ValidationError

from .fakes import START, EventLog, FakeClock, RecordingBackend, SilentBackend, advance_to_beat

OTHER = "o" * 32


class Broken(ConnectionError):
    """A driver error raised by the test backend."""


def test_a_fresh_lock_is_unlocked_and_touches_nothing(locker: Locker, backend: RecordingBackend) -> None:
    lock = locker.lock("k")
    assert (lock.state, lock.lost_reason, lock.fence, lock.held_for, lock.expires_in) == (
        "unlocked", None, None, 0.0, 0.0,
    )
    assert not lock.lost.is_set()
    assert lock.is_held() is False
    assert backend.calls == []


def test_acquire_hold_and_release(locker: Locker, backend: RecordingBackend, clock: FakeClock) -> None:
    lock = locker.lock("k", ttl=20.0)
    assert lock.acquire() is True
    assert (lock.state, lock.ttl) == ("held", 20.0)
    assert lock.expires_in == pytest.approx(19.8)
    clock.advance(5.0)
    assert lock.held_for == 5.0
    assert lock.is_held() is True
    assert lock.release() is True
    assert lock.state == "released"
    assert not backend.inspect("k").held
    clock.advance(5.0)
    assert lock.held_for == 5.0, "held_for stops at the release"
    assert lock.expires_in == 0.0
    # Every later call answers False and changes nothing.
    assert lock.release() is False
    assert backend.called("release") == [("release", "k", None)]


def test_acquire_non_blocking_returns_false_and_may_be_tried_again(
    locker: Locker, backend: RecordingBackend
) -> None:
    backend.acquire("k", OTHER, 60.0, "other")
    lock = locker.lock("k")
    assert lock.acquire(blocking=False) is False
    assert lock.state == "unlocked"
    backend.release("k", OTHER)
    assert lock.acquire(blocking=False) is True
    assert lock.state == "held"


def test_acquire_explicit_timeout_overrides_the_lock_options(clock: FakeClock, sleeps: list[float]) -> None:
    backend = SilentBackend(clock=clock)
    backend.acquire("k", OTHER, 3600.0, "other")
    locker = Locker(backend, clock=clock, heartbeat_thread=False)
    lock = locker.lock("k", blocking=False)
    assert lock.acquire(blocking=True, timeout=0.5) is False
    assert sum(sleeps) == 0.5
    locker.close()


def test_acquiring_a_lock_twice_is_misuse(locker: Locker, backend: RecordingBackend) -> None:
    lock = locker.acquire("k")
    with pytest.raises(LockStateError):
        lock.acquire()
    lock.release()
    with pytest.raises(LockStateError):
        lock.acquire()
    assert len(backend.called("acquire")) == 1


def test_concurrent_acquire_of_one_lock_object_is_misuse(locker: Locker, backend: RecordingBackend) -> None:
    lock = locker.lock("k")
    inner: list[BaseException] = []

    def reenter() -> None:
        try:
            lock.acquire()
        except LockStateError as error:
            inner.append(error)

    backend.hooks["acquire"] = reenter
    assert lock.acquire() is True
    assert len(inner) == 1


def test_release_of_an_unlocked_lock_is_misuse(locker: Locker) -> None:
    with pytest.raises(LockStateError):
        locker.lock("k").release()


def test_extend_and_check_misuse(locker: Locker) -> None:
    lock = locker.lock("k")
    with pytest.raises(LockStateError):
        lock.extend()
    with pytest.raises(LockStateError):
        lock.check()
    lock.acquire()
    lock.check()
    lock.release()
    with pytest.raises(LockStateError):
        lock.extend()
    with pytest.raises(LockStateError):
        lock.check()


def test_loss_signal_belongs_to_the_library(locker: Locker) -> None:
    lock = locker.acquire("k")
    with pytest.raises(LockStateError):
        lock.lost.set()
    with pytest.raises(LockStateError):
        lock.lost.clear()
    assert not lock.lost.is_set()


def test_extend_replaces_the_lease(locker: Locker, backend: RecordingBackend, clock: FakeClock) -> None:
    lock = locker.acquire("k", auto_extend=False)
    clock.advance(20.0)
    lock.extend(5.0)
    assert lock.ttl == 5.0
    assert lock.expires_in == pytest.approx(4.95)
    assert backend.inspect("k").expires_in == 5.0
    lock.extend()
    assert backend.called("extend") == [("extend", "k", 5.0), ("extend", "k", 5.0)]


def test_extend_of_a_key_no_longer_ours_raises_lost_extend(
    locker: Locker, backend: RecordingBackend, events: EventLog
) -> None:
    lock = locker.acquire("k")
    backend.force_release("k")
    with pytest.raises(LockLostError) as caught:
        lock.extend()
    assert caught.value.reason == "extend"
    assert lock.lost_reason == "extend"
    assert events.types() == ["acquired", "lost"]
    with pytest.raises(LockLostError):
        lock.extend()


def test_extend_driver_error_propagates_and_the_lock_stays_held(
    locker: Locker, backend: RecordingBackend, events: EventLog
) -> None:
    lock = locker.acquire("k")
    error = Broken("down")

    def fail() -> None:
        raise error

    backend.hooks["extend"] = fail
    with pytest.raises(Broken) as caught:
        lock.extend()
    assert caught.value is error, "driver errors are never wrapped"
    assert lock.state == "held"
    assert events.of("extend_failed")[0].error is error


def test_is_held_false_marks_the_lock_lost_observed(
    locker: Locker, backend: RecordingBackend, events: EventLog
) -> None:
    lock = locker.acquire("k")
    backend.force_release("k")
    assert lock.is_held() is False
    assert (lock.state, lock.lost_reason) == ("lost", "observed")
    calls = len(backend.calls)
    assert lock.is_held() is False
    assert len(backend.calls) == calls, "no round trip once lost"
    assert events.of("lost")[0].reason == "observed"


def test_release_finding_another_holder_reads_lost_release(
    locker: Locker, backend: RecordingBackend, events: EventLog
) -> None:
    lock = locker.acquire("k")
    backend.force_release("k")
    backend.acquire("k", OTHER, 60.0, "other")
    assert lock.release() is False
    assert (lock.state, lock.lost_reason) == ("lost", "release")
    assert backend.is_held("k", OTHER), "another holder's key is never touched"
    assert events.types() == ["acquired", "lost"]


def test_release_of_a_lost_lock_still_gives_our_key_back(
    locker: Locker, backend: RecordingBackend, clock: FakeClock
) -> None:
    lock = locker.acquire("k", auto_extend=False)
    clock.set(START + 29.75)  # lost locally, still ours on the backend until 30 s
    assert lock.lost_reason == "expired"
    assert backend.is_held("k", lock.token)
    assert lock.release() is False
    assert not backend.inspect("k").held
    assert lock.release() is False
    assert len(backend.called("release")) == 1


def test_release_driver_error_keeps_the_lock_and_a_later_call_retries(
    locker: Locker, backend: RecordingBackend, clock: FakeClock, events: EventLog
) -> None:
    lock = locker.acquire("k")
    backend.failures["release"] = Broken("down")
    with pytest.raises(Broken):
        lock.release()
    assert lock.state == "held"
    del backend.failures["release"]
    # The heartbeat still runs for it.
    advance_to_beat(clock, locker, START + 10.0)
    assert backend.called("extend")
    assert lock.release() is True
    assert events.types() == ["acquired", "extended", "released"]


def test_locker_close_makes_held_locks_read_lost_closed(
    backend: RecordingBackend, clock: FakeClock, events: EventLog
) -> None:
    # With its heartbeat thread, which closing stops (the fake clock never moves here, so the
    # thread has no due work to race the test with).
    locker = Locker(backend, clock=clock, on_event=events)
    held = locker.acquire("a")
    released = locker.acquire("b")
    released.release()
    locker.close()
    assert (held.state, held.lost_reason) == ("lost", "closed")
    assert released.state == "released"
    assert not backend.inspect("a").held, "close gives the keys back"
    assert events.types("a") == ["acquired", "lost"]
    assert events.of("lost")[0].reason == "closed"
    assert held.release() is False
    thread = locker._heartbeat.thread
    assert thread is not None and not thread.is_alive()
    locker.close()  # idempotent
    assert locker.closed


def test_a_closed_locker_refuses_every_use(backend: RecordingBackend, clock: FakeClock) -> None:
    locker = Locker(backend, clock=clock, heartbeat_thread=False)
    unacquired = locker.lock("u")
    decorated = locker.locked("d")(lambda: 1)
    locker.close()
    backend.calls.clear()
    calls = [
        lambda: locker.lock("k"),
        lambda: locker.acquire("k"),
        lambda: locker.try_acquire("k"),
        lambda: locker.acquire_many(["a", "b"]),
        lambda: locker.get("k"),
        lambda: locker.list(),
        lambda: locker.force_release("k"),
        unacquired.acquire,
        decorated,
    ]
    for call in calls:
        with pytest.raises(LockStateError):
            call()
    assert backend.calls == []


def test_state_is_read_against_the_clock_from_any_thread(locker: Locker, clock: FakeClock) -> None:
    lock = locker.acquire("k", auto_extend=False)
    clock.set(START + 29.7)
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.append(lock.state))
    reader.start()
    reader.join(10)
    assert seen == ["lost"]


def test_repr_shows_at_most_four_characters_of_the_token(locker: Locker) -> None:
    token = "secret-token-0123456789"  # noqa: S105 - a test token
    lock = locker.acquire("k", token=token)
    text = repr(lock) + str(lock)
    assert "secr" in text and token not in text and token[:5] not in text


def test_contention_on_with_raises_lock_held(locker: Locker, backend: RecordingBackend) -> None:
    backend.acquire("k", OTHER, 60.0, "other")
    with pytest.raises(LockHeldError) as caught, locker.lock("k", blocking=False):
        pytest.fail("the block must not run")
    assert caught.value.reason == "held" and caught.value.key == "k"


# -- cancelling a renewal ------------------------------------------------------------------------


def _lease(lock: Lock, locker: Locker) -> tuple[object, ...]:
    """What a cancelled renewal must leave as it was: state, TTL, local lease, pending timers."""
    return (lock.state, lock.ttl, lock.expires_in, locker._heartbeat.pending())


def _extend_cancelled(lock: Lock, locker: Locker, cancel: threading.Event) -> LockHeldError:
    """``lock.extend(60.0, cancel=cancel)`` must fail as cancelled and leave the lease as it was."""
    before = _lease(lock, locker)
    with pytest.raises(LockHeldError) as caught:
        lock.extend(60.0, cancel=cancel)
    assert caught.value.reason == "cancelled"
    assert _lease(lock, locker) == before
    return caught.value


def test_a_renewal_cancelled_before_it_starts_sends_nothing(
    locker: Locker, backend: RecordingBackend, clock: FakeClock
) -> None:
    lock = locker.acquire("k", ttl=6.0)
    clock.advance(1.0)
    cancel = threading.Event()
    cancel.set()
    error = _extend_cancelled(lock, locker, cancel)
    assert error.attempts == 0
    assert "was not extended: the renewal was cancelled" in str(error)
    assert backend.called("extend") == []
    # The heartbeat still extends it on its old schedule (a third of the 6 s TTL).
    advance_to_beat(clock, locker, START + 2.0)
    assert backend.called("extend") == [("extend", "k", 6.0)]
    assert lock.state == "held"


def test_a_renewal_cancelled_during_its_request_is_not_applied(
    locker: Locker, backend: RecordingBackend, clock: FakeClock
) -> None:
    lock = locker.acquire("k", ttl=6.0)
    clock.advance(1.0)
    cancel = threading.Event()
    backend.hooks["extend"] = cancel.set
    assert _extend_cancelled(lock, locker, cancel).attempts == 1
    assert backend.called("extend") == [("extend", "k", 60.0)]
    del backend.hooks["extend"]
    # A later renewal without a cancel applies as usual.
    lock.extend(60.0)
    assert (lock.ttl, lock.expires_in) == (60.0, pytest.approx(60.0 * 0.99))


def test_a_cancelled_renewal_that_granted_less_time_shortens_the_local_lease(
    locker: Locker, backend: RecordingBackend, clock: FakeClock
) -> None:
    lock = locker.acquire("k", ttl=30.0)
    cancel = threading.Event()
    backend.hooks["extend"] = cancel.set
    with pytest.raises(LockHeldError, match="cancelled"):
        lock.extend(5.0, cancel=cancel)
    # The store's lease now ends in 5 s: the local one may not outlast it.
    assert lock.expires_in == pytest.approx(5.0 * 0.99)
    assert (lock.state, lock.ttl) == ("held", 30.0)


def test_a_driver_error_of_a_cancelled_renewal_leaves_the_heartbeat_alone(
    locker: Locker, backend: RecordingBackend, clock: FakeClock, events: EventLog
) -> None:
    lock = locker.acquire("k", ttl=6.0)
    before = _lease(lock, locker)
    cancel = threading.Event()

    def cancel_then_fail() -> None:
        cancel.set()
        raise Broken("reset")

    backend.hooks["extend"] = cancel_then_fail
    with pytest.raises(LockHeldError, match="cancelled") as caught:
        lock.extend(cancel=cancel)
    assert isinstance(caught.value.__cause__, Broken)
    assert _lease(lock, locker) == before
    assert events.of("extend_failed") == []


def test_extend_checks_cancel_and_request_id_before_sending(locker: Locker, backend: RecordingBackend) -> None:
    lock = locker.acquire("k")
    with pytest.raises(ValidationError, match=r"cancel must be a threading\.Event"):
        lock.extend(cancel=True)  # type: ignore[arg-type]
    for call in (
        lambda: lock.extend(request_id=""),
        lambda: lock.release(request_id=7),  # type: ignore[arg-type]
        lambda: locker.get("k", request_id="x" * 129),
        lambda: locker.force_release("k", request_id=""),
    ):
        with pytest.raises(ValidationError, match="request_id must be a non-empty str"):
            call()
    assert backend.called("extend") == backend.called("release") == backend.called("force_release") == []
    assert backend.called("inspect") == []


def test_backends_without_request_ids_accept_and_ignore_them(locker: Locker, backend: RecordingBackend) -> None:
    lock = locker.acquire("k", request_id="req-1")
    lock.extend(request_id="req-2")
    assert locker.get("k", request_id="req-3").held
    assert lock.release(request_id="req-4") is True
    assert locker.force_release("k", request_id="req-5") is False
