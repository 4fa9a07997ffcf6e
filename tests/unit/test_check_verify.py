"""``lock.check()`` reads the local lease; ``lock.check(verify=True)`` also asks the store."""

from __future__ import annotations

import pytest
from lease_lock import Locker, LockLostError, LockStateError

from .fakes import EventLog, RecordingBackend

OTHER = "o" * 32


def test_check_is_local_and_misses_a_force_release(locker: Locker, backend: RecordingBackend) -> None:
    lock = locker.acquire("k")
    backend.calls.clear()
    locker.force_release("k")
    lock.check()
    assert lock.state == "held", "the local lease alone cannot see a force-release"
    assert backend.called("is_held") == []


def test_check_verify_sees_a_force_release_at_once(
    locker: Locker, backend: RecordingBackend, events: EventLog
) -> None:
    lock = locker.acquire("k")
    backend.calls.clear()
    lock.check(verify=True)
    assert backend.called("is_held") == [("is_held", "k", None)], "one round trip while held"
    locker.force_release("k")
    with pytest.raises(LockLostError) as raised:
        lock.check(verify=True)
    assert raised.value.reason == "observed"
    assert (lock.state, lock.lost_reason) == ("lost", "observed")
    assert lock.lost.is_set()
    assert [event.reason for event in events.of("lost")] == ["observed"]


def test_check_verify_sees_another_holder(locker: Locker, backend: RecordingBackend) -> None:
    lock = locker.acquire("k")
    locker.force_release("k")
    backend.acquire("k", OTHER, 60.0, "other")
    with pytest.raises(LockLostError, match="observed"):
        lock.check(verify=True)


def test_check_verify_on_a_lock_not_held_makes_no_round_trip(locker: Locker, backend: RecordingBackend) -> None:
    lock = locker.lock("k")
    with pytest.raises(LockStateError):
        lock.check(verify=True)
    lock.acquire()
    lock.release()
    backend.calls.clear()
    with pytest.raises(LockStateError):
        lock.check(verify=True)
    assert backend.calls == []


def test_lock_set_check_verify(locker: Locker) -> None:
    locks = locker.acquire_many(["a", "b"])
    locks.check(verify=True)
    locker.force_release("b")
    locks.check()
    with pytest.raises(LockLostError, match="'b'"):
        locks.check(verify=True)
    assert locks.state == "lost"


