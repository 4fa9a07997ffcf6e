"""Re-entrant holds: a nested acquire of a key the same thread holds through the same Locker
joins that lease with ``reentrant=True``; without it, it contends and its error says why.

Run on the recording memory backend (every store call counted); the same on real SQLite and Redis
is in ``tests/integration/test_core_real_stores.py``.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

import pytest
from lease_lock import DroppedLockWarning, Locker, LockHeldError, LockLostError, LockStateError, ValidationError

from ..support.polling import wait_until
from .fakes import EventLog, RecordingBackend

GRANTS = ("acquire", "acquire_fenced")


def grants(backend: RecordingBackend) -> int:
    return sum(len(backend.called(method)) for method in GRANTS)


def test_nested_with_one_grant_one_release_at_the_end(
    locker: Locker, backend: RecordingBackend, events: EventLog
) -> None:
    with locker.lock("k", reentrant=True) as outer:
        assert outer.holds == 1
        with locker.lock("k", reentrant=True) as inner:
            assert (inner.token, inner.fence, inner.state) == (outer.token, outer.fence, "held")
            assert outer.holds == inner.holds == 2
            with locker.lock("k", reentrant=True) as innermost:
                assert outer.holds == 3
                innermost.check()
            assert outer.holds == 2
            assert backend.called("release") == []
        assert outer.holds == 1 and backend.called("release") == []
        assert inner.state == "held", "a joined handle reads the shared lease"
    assert grants(backend) == 1
    assert backend.called("release") == [("release", "k", None)]
    assert events.types() == ["acquired", "released"]
    assert outer.state == inner.state == "released" and outer.holds == 0


def test_locker_option_and_every_acquire_form(backend: RecordingBackend, clock: Any) -> None:
    locker = Locker(backend, clock=clock, heartbeat_thread=False, reentrant=True)
    try:
        outer = locker.acquire("k")
        again = locker.acquire("k")
        tried = locker.try_acquire("k")
        handle = locker.lock("k")
        assert handle.acquire() is True
        assert tried is not None and outer.holds == 4

        @locker.locked("k")
        def nested() -> int:
            return outer.holds

        assert nested() == 5
        assert grants(backend) == 1
        # Released out of order: the key goes back with the last hold, whichever it is.
        assert outer.release() is True
        assert outer.release() is False, "a hold is given up once"
        assert handle.release() is True and tried.release() is True
        assert backend.called("release") == []
        assert again.release() is True
        assert backend.called("release") == [("release", "k", None)]
        assert again.release() is False and outer.state == "released"
        with pytest.raises(LockStateError):
            handle.acquire()
        # A per-call False overrides the locker's True.
        with locker.lock("k"):
            assert locker.try_acquire("k", reentrant=False) is None
    finally:
        locker.close()


def test_another_thread_still_waits(backend: RecordingBackend) -> None:
    locker = Locker(backend, reentrant=True, ttl=30.0)
    try:
        outcome: list[object] = []
        started = threading.Event()

        def other() -> None:
            started.set()
            lock = locker.acquire("k", timeout=30.0)
            outcome.append(lock.holds)
            lock.release()

        with locker.lock("k") as outer:
            with locker.lock("k"):
                worker = threading.Thread(target=other)
                worker.start()
                assert started.wait(30)
                wait_until(lambda: len(backend.called("acquire")) >= 2, "the other thread's attempt")
                assert outcome == []
            assert outer.holds == 1 and outcome == []
            # Nor does another thread join this thread's hold through try_acquire.
            result: list[object] = []
            probe = threading.Thread(target=lambda: result.append(locker.try_acquire("k")))
            probe.start()
            probe.join(30)
            assert result == [None]
        worker.join(30)
        assert outcome == [1], "the other thread got its own lease once the key was released"
    finally:
        locker.close()


def test_a_lost_lease_is_lost_for_every_hold(locker: Locker, backend: RecordingBackend) -> None:
    def nested() -> None:
        with locker.lock("k", reentrant=True) as outer, locker.lock("k", reentrant=True) as inner:
            locker.force_release("k")
            assert inner.is_held() is False
            assert outer.state == "lost"

    with pytest.raises(LockLostError) as raised:
        nested()
    assert raised.value.completed and raised.value.reason == "observed"


def test_no_join_after_the_outer_lease_ended(locker: Locker, backend: RecordingBackend) -> None:
    outer = locker.acquire("k")
    outer.release()
    again = locker.acquire("k", reentrant=True)
    assert again is not outer and again.holds == 1
    assert grants(backend) == 2
    again.release()


def test_bad_values_and_acquire_many(locker: Locker, backend: RecordingBackend) -> None:
    with pytest.raises(ValidationError, match="reentrant"):
        locker.lock("k", reentrant="yes")
    with pytest.raises(ValidationError, match="reentrant"):
        Locker(backend, reentrant=1)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="acquire_many"):
        locker.acquire_many(["a", "b"], reentrant=True)
    with locker.lock("a"), pytest.raises(LockHeldError, match="this very thread"):
        locker.acquire_many(["a", "b"], blocking=False)


# -- real backends -----------------------------------------------------------------------------


def test_the_hold_index_forgets_collected_locks(locker: Locker) -> None:
    # Once the index is in use (here from the first look-up on), every grant is noted for its
    # thread; entries of locks that are gone are swept, so a program locking ever new keys does
    # not grow the index without bound.
    holds = locker._acquisition.holds
    assert holds.find("absent") is None
    for index in range(5000):
        locker.acquire(f"key-{index}").release()
    assert len(holds._entries) <= 1024
    kept = [locker.acquire(f"kept-{index}") for index in range(1500)]
    for index in range(1500):
        locker.acquire(f"more-{index}").release()
    # Live holds survive every sweep and are still found by their thread.
    assert all(holds.find(lock.key) is lock for lock in kept)
    for lock in kept:
        lock.release()


def test_a_reentrant_acquire_joins_a_hold_taken_before_anyone_asked(
    locker: Locker, backend: RecordingBackend
) -> None:
    # The thread's holds are indexed only once something asks: holds taken before (here
    # without reentrant) are found all the same, and so are the ones taken after.
    earlier = [locker.acquire(f"k{index}") for index in range(50)]
    with locker.lock("k7", reentrant=True) as joined:
        assert joined.token == earlier[7].token and earlier[7].holds == 2
    later = locker.acquire("later")
    with locker.lock("later", reentrant=True) as joined:
        assert joined.token == later.token
    assert grants(backend) == 51
    # A lock of another thread on a key is not this thread's hold.
    other: list[Any] = []
    worker = threading.Thread(target=lambda: other.append(locker.acquire("theirs")))
    worker.start()
    worker.join(30)
    assert locker.try_acquire("theirs", reentrant=True) is None
    for lock in [*earlier, later, *other]:
        assert lock.release() is True


def test_the_granting_thread_is_recorded(locker: Locker) -> None:
    lock = locker.lock("k")
    assert lock.thread is None
    with lock:
        assert lock.thread is threading.current_thread()
        with locker.lock("k", reentrant=True) as joined:
            assert joined.thread is threading.current_thread(), "a joined hold shares the lease"


def test_closing_gives_back_what_is_held_even_after_many_were_dropped(
    backend: RecordingBackend, clock: Any
) -> None:
    locker = Locker(backend, clock=clock, heartbeat_thread=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DroppedLockWarning)
        for index in range(3000):
            locker.acquire(f"dropped-{index}")  # dropped while held: collected, queued to go back
    assert len(caught) == 3000
    kept = locker.acquire("kept")
    locker.close()
    assert kept.lost_reason == "closed"
    # The heartbeat of this fake clock never ran: closing gave back the kept lock and every
    # dropped one.
    assert sorted(call[1] for call in backend.called("release")) == sorted(
        ["kept", *(f"dropped-{index}" for index in range(3000))]
    )


def test_a_dropped_reentrant_handle_is_given_back_like_a_plain_one(backend: RecordingBackend, clock: Any) -> None:
    # `if locker.try_acquire(key):` inside a block that holds the key joins the outer lease and
    # drops the handle at once. Each such drop must give its hold back (with the warning a
    # dropped plain lock gives): the outer hold keeps the key, and when it ends another process
    # gets the key. Before, the count climbed 1, 2, 3, 4 and the key was never given back.
    locker = Locker(backend, clock=clock, heartbeat_thread=False, reentrant=True)
    elsewhere = Locker(backend, clock=clock, heartbeat_thread=False)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", DroppedLockWarning)
            for round_ in range(4):
                with locker.lock("k") as outer:
                    if locker.try_acquire("k"):
                        pass
                    locker.run_heartbeat()  # the library thread's turn
                    assert (outer.state, outer.holds) == ("held", 1), f"round {round_}: the outer hold keeps the key"
                    assert elsewhere.try_acquire("k") is None
                assert outer.state == "released"
                taken = elsewhere.try_acquire("k")
                assert taken is not None, f"round {round_}: another process gets the key after the block"
                taken.release()
        dropped = [warning for warning in caught if issubclass(warning.category, DroppedLockWarning)]
        assert len(dropped) == 4
        said = "'k' that Locker.try_acquire() returned was dropped while held"
        assert all(said in str(warning.message) for warning in dropped)
        # A joined handle released explicitly, then dropped, gives nothing back twice and warns not.
        with warnings.catch_warnings():
            warnings.simplefilter("error", DroppedLockWarning)
            with locker.lock("k") as outer:
                joined = locker.acquire("k")
                assert outer.holds == 2 and joined.release() is True
                del joined
                locker.run_heartbeat()
                assert (outer.state, outer.holds) == ("held", 1)
            assert outer.state == "released"
        # The last hold out being a dropped joined one: its drop gives the key back.
        outer = locker.acquire("k")
        joined = locker.try_acquire("k")
        assert outer.release() is True and outer.state == "held"
        with pytest.warns(DroppedLockWarning, match="dropped while held"):
            del joined
        locker.run_heartbeat()
        assert outer.state == "released"
        assert elsewhere.try_acquire("k") is not None
    finally:
        elsewhere.close()
        locker.close()
