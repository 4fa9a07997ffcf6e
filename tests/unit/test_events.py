"""Events and the ``lease_lock`` logger."""

from __future__ import annotations

import logging

import pytest
from lease_lock import Locker, LockEvent

from .fakes import START, EventLog, FakeClock, RecordingBackend, advance_to_beat

OTHER = "o" * 32

FIELDS = ("waited", "attempts", "attempt", "elapsed", "reason", "held_for", "error")
#: The fields each event type fills in; every other field is None.
EXPECTED_FIELDS = {
    "acquired": {"waited", "attempts"},
    "contended": {"attempt", "elapsed", "reason"},
    "extended": {"held_for"},
    "extend_failed": {"held_for", "error"},
    "released": {"held_for"},
    "lost": {"held_for", "reason"},
    "release_failed": {"held_for", "error"},
}


class Broken(ConnectionError):
    """A driver error raised by the test backend."""


def filled(event: LockEvent) -> set[str]:
    return {name for name in FIELDS if getattr(event, name) is not None}


def test_a_whole_life_in_order_with_the_fields_of_each_type(
    locker: Locker, backend: RecordingBackend, clock: FakeClock, events: EventLog
) -> None:
    backend.acquire("k", OTHER, 60.0, "other")

    def holder_leaves() -> None:
        # The first attempt finds the key busy; then the holder releases it, which wakes us.
        clock.advance(0.5)
        backend.hooks.clear()
        backend.release("k", OTHER)

    backend.hooks["acquire"] = holder_leaves
    lock = locker.acquire("k", ttl=30.0)
    backend.failures["extend"] = Broken("down")
    # The grant's request left at 0.5 s, so the beat is due at 10.5 s; its retry a third later.
    advance_to_beat(clock, locker, START + 10.5)
    del backend.failures["extend"]
    advance_to_beat(clock, locker, START + 10.5 + 10.0 / 3)
    backend.failures["release"] = Broken("down")
    with lock:
        pass
    del backend.failures["release"]
    assert lock.release() is True
    assert events.types() == [
        "contended", "acquired", "extend_failed", "extended", "release_failed", "released",
    ]
    for event in events:
        assert event.key == "k" and event.ttl == 30.0
        assert filled(event) == EXPECTED_FIELDS[event.type], event
    contended, acquired, failed, extended, release_failed, released = events
    assert (contended.attempt, contended.elapsed, contended.reason) == (1, 0.5, "held")
    assert (acquired.attempts, acquired.waited) == (2, 0.5)
    assert isinstance(failed.error, Broken) and failed.held_for == 10.0
    assert extended.held_for == pytest.approx(13.3333, abs=1e-3)
    assert isinstance(release_failed.error, Broken)
    assert released.held_for == extended.held_for


def test_lost_event_fields(locker: Locker, clock: FakeClock, events: EventLog) -> None:
    lock = locker.acquire("k", ttl=10.0, auto_extend=False)
    clock.set(START + 9.9)
    locker.run_heartbeat()
    [lost] = events.of("lost")
    assert (lost.reason, lost.held_for, lost.ttl) == ("expired", pytest.approx(9.9), 10.0)
    assert filled(lost) == EXPECTED_FIELDS["lost"]
    assert lock.lost_reason == "expired"


def test_late_contention_is_reported_as_late(
    locker: Locker, backend: RecordingBackend, clock: FakeClock, events: EventLog
) -> None:
    late = [True]
    backend.hooks["acquire"] = lambda: late and late.pop() and clock.advance(31.0)
    locker.acquire("k", timeout=60)
    assert [(event.type, event.reason) for event in events] == [("contended", "late"), ("acquired", None)]


def test_a_lock_reports_its_end_once(
    locker: Locker, backend: RecordingBackend, clock: FakeClock, events: EventLog
) -> None:
    lapsed = locker.acquire("lapsed", auto_extend=False)
    clock.set(START + 29.7)
    released = locker.acquire("released")
    # Everything that could notice the loss does: readers, the heartbeat, release, close.
    for _ in range(3):
        assert lapsed.state == "lost"
        assert lapsed.lost.is_set()
    locker.run_heartbeat()
    assert released.release() is True
    assert lapsed.release() is False
    assert released.release() is False
    assert lapsed.is_held() is False
    locker.close()
    assert events.types("lapsed") == ["acquired", "lost"]
    assert events.types("released") == ["acquired", "released"]


def test_lost_then_close_reports_once(locker: Locker, backend: RecordingBackend, events: EventLog) -> None:
    lock = locker.acquire("k")
    backend.force_release("k")
    lock.is_held()
    locker.close()
    assert events.types() == ["acquired", "lost"]
    assert events.of("lost")[0].reason == "observed"


def test_a_raising_hook_is_dropped(backend: RecordingBackend, clock: FakeClock) -> None:
    calls: list[str] = []

    def hook(event: LockEvent) -> None:
        calls.append(event.type)
        raise RuntimeError("broken hook")

    locker = Locker(backend, clock=clock, heartbeat_thread=False, on_event=hook)
    lock = locker.acquire("k")
    assert lock.release() is True
    assert calls == ["acquired", "released"]
    locker.close()


def test_the_logger_records_the_same_events_without_tokens(
    locker: Locker, caplog: pytest.LogCaptureFixture, events: EventLog, backend: RecordingBackend
) -> None:
    caplog.set_level(logging.DEBUG, logger="lease_lock")
    lock = locker.acquire("k")
    backend.force_release("k")
    lock.is_held()
    records = [record for record in caplog.records if record.pathname.endswith("events.py")]
    assert [record.levelno for record in records] == [logging.DEBUG, logging.WARNING]
    assert "acquired" in records[0].getMessage() and "'k'" in records[0].getMessage()
    assert "lost" in records[1].getMessage() and "observed" in records[1].getMessage()
    assert all(lock.token[:5] not in record.getMessage() for record in records)


def test_events_of_a_prefixed_locker_carry_the_full_key(backend: RecordingBackend, clock: FakeClock) -> None:
    events = EventLog()
    locker = Locker(backend, clock=clock, heartbeat_thread=False, key_prefix="app:", on_event=events)
    locker.acquire("k").release()
    assert {event.key for event in events} == {"app:k"}
    locker.close()
