"""The heartbeat: when it extends, what it asks for, how each loss reads.

The fixtures' locker uses ttl 30 s, so the heartbeat fires every 10 s; the local lease ends 1%
early (at 29.7 s). Fake time starts at START.
"""

from __future__ import annotations

import gc
import re
import threading
import warnings
import weakref
from typing import Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lease_lock import DroppedLockWarning, Locker, LockEvent, LockLostError, MemoryBackend, ValidationError
from lease_lock.heartbeat import LANES, Heartbeat, Timer

from .fakes import START, EventLog, FakeClock, RecordingBackend, advance_to_beat


class Flaky(ConnectionError):
    """A driver error raised by the test backend."""


def raise_flaky() -> None:
    raise Flaky("backend unreachable")


def extends(backend: RecordingBackend) -> list[float]:
    """The TTL of every extension asked for so far."""
    return [ttl for _, _, ttl in backend.called("extend") if ttl is not None]


def test_tick_fires_an_interval_after_the_request_left(
    locker: Locker, backend: RecordingBackend, clock: FakeClock
) -> None:
    # The grant's reply takes 1 s: the beat is timed from the request, not from the reply.
    backend.hooks["acquire"] = lambda: clock.advance(1.0)
    lock = locker.acquire("k")
    del backend.hooks["acquire"]
    advance_to_beat(clock, locker, START + 9.75)
    assert extends(backend) == []
    advance_to_beat(clock, locker, START + 10.0)
    assert extends(backend) == [30.0]
    assert lock.state == "held"
    assert lock.expires_in == pytest.approx(29.7)


def test_extensions_keep_the_lock_held_and_report_extended(
    locker: Locker, backend: RecordingBackend, clock: FakeClock, events: EventLog
) -> None:
    lock = locker.acquire("k")
    for beat in range(1, 10):
        advance_to_beat(clock, locker, START + 10.0 * beat)
    assert lock.state == "held"
    assert extends(backend) == [30.0] * 9
    extended = events.of("extended")
    assert len(extended) == 9
    assert [event.held_for for event in extended] == [10.0 * beat for beat in range(1, 10)]
    assert all(event.ttl == 30.0 for event in extended)


def test_custom_extend_interval(locker: Locker, backend: RecordingBackend, clock: FakeClock) -> None:
    lock = locker.acquire("k", ttl=12.0, extend_interval=2.0)
    advance_to_beat(clock, locker, START + 1.75)
    assert extends(backend) == []
    advance_to_beat(clock, locker, START + 2.0)
    advance_to_beat(clock, locker, START + 4.0)
    assert extends(backend) == [12.0, 12.0]
    assert lock.state == "held"


def test_interval_follows_the_latest_ttl(locker: Locker, backend: RecordingBackend, clock: FakeClock) -> None:
    lock = locker.acquire("k")
    clock.advance(1.0)
    lock.extend(ttl=6.0)
    assert lock.ttl == 6.0
    # The next beat is 2 s (a third of 6 s) after the manual extension left.
    advance_to_beat(clock, locker, START + 2.75)
    assert extends(backend) == [6.0]
    advance_to_beat(clock, locker, START + 3.0)
    assert extends(backend) == [6.0, 6.0]


def test_auto_extend_false_runs_out_as_expired(
    locker: Locker, backend: RecordingBackend, clock: FakeClock, events: EventLog
) -> None:
    lock = locker.acquire("k", ttl=10.0, auto_extend=False)
    clock.set(START + 9.875)
    assert lock.state == "held"
    clock.set(START + 9.9)
    # Read lost at once, with no heartbeat run: the properties consult the clock.
    assert lock.lost.is_set()
    assert (lock.state, lock.lost_reason) == ("lost", "expired")
    assert lock.held_for == pytest.approx(9.9)
    clock.advance(5.0)
    assert lock.held_for == pytest.approx(9.9), "held_for stops counting at the loss"
    assert extends(backend) == []
    [lost] = events.of("lost")
    assert (lost.reason, lost.key) == ("expired", "k")


def test_backend_saying_not_ours_reads_lost_extend(
    locker: Locker, backend: RecordingBackend, clock: FakeClock, events: EventLog
) -> None:
    lock = locker.acquire("k")
    backend.force_release("k")
    advance_to_beat(clock, locker, START + 10.0)
    assert (lock.state, lock.lost_reason) == ("lost", "extend")
    with pytest.raises(LockLostError) as caught:
        lock.check()
    assert caught.value.reason == "extend" and caught.value.completed is False
    assert events.types() == ["acquired", "lost"]


def test_failed_extension_keeps_the_lock_and_retries_after_a_third_of_the_interval(
    locker: Locker, backend: RecordingBackend, clock: FakeClock, events: EventLog
) -> None:
    lock = locker.acquire("k", ttl=30.0, extend_interval=9.0)
    backend.hooks["extend"] = raise_flaky
    advance_to_beat(clock, locker, START + 9.0)
    assert lock.state == "held"
    [failed] = events.of("extend_failed")
    assert isinstance(failed.error, Flaky) and failed.held_for == 9.0
    advance_to_beat(clock, locker, START + 11.875)
    assert len(extends(backend)) == 1
    advance_to_beat(clock, locker, START + 12.0)
    assert len(extends(backend)) == 2
    # The backend recovers: the next retry extends and the lock goes on as before.
    del backend.hooks["extend"]
    advance_to_beat(clock, locker, START + 15.0)
    assert len(extends(backend)) == 3
    assert lock.state == "held" and lock.expires_in == pytest.approx(29.7)
    assert events.types() == ["acquired", "extend_failed", "extend_failed", "extended"]
    advance_to_beat(clock, locker, START + 24.0)
    assert len(extends(backend)) == 4


def test_lease_running_out_while_extensions_fail_reads_extend_failed_with_the_last_error(
    locker: Locker, backend: RecordingBackend, clock: FakeClock, events: EventLog
) -> None:
    lock = locker.acquire("k")
    errors: list[Flaky] = []

    def fail() -> None:
        errors.append(Flaky(f"failure {len(errors) + 1}"))
        raise errors[-1]

    backend.hooks["extend"] = fail
    beat = START + 10.0
    while clock() < START + 29.7:
        advance_to_beat(clock, locker, min(beat, START + 29.7))
        beat += 10.0 / 3
    assert (lock.state, lock.lost_reason) == ("lost", "extend-failed")
    assert len(errors) >= 5
    with pytest.raises(LockLostError) as caught:
        lock.check()
    assert caught.value.reason == "extend-failed"
    assert caught.value.__cause__ is errors[-1]
    lost = events.of("lost")
    assert len(lost) == 1 and lost[0].reason == "extend-failed" and lost[0].error is errors[-1]
    assert len(events.of("extend_failed")) == len(errors)


def test_reply_after_the_lease_ran_out_reads_late_extend_and_is_given_back(
    locker: Locker, backend: RecordingBackend, clock: FakeClock, events: EventLog
) -> None:
    lock = locker.acquire("k")
    seen_in_flight: list[tuple[str, str | None]] = []

    def slow_reply() -> None:
        # The current lease (ending at 29.7 s) runs out while the extension is in flight.
        clock.advance(20.0)
        seen_in_flight.append((lock.state, lock.lost_reason))

    backend.hooks["extend"] = slow_reply
    advance_to_beat(clock, locker, START + 10.0)
    assert seen_in_flight == [("lost", "late-extend")]
    assert (lock.state, lock.lost_reason) == ("lost", "late-extend")
    assert not backend.is_held("k", lock.token), "the late lease must be given back"
    assert events.types() == ["acquired", "lost"]


def test_reply_later_than_its_own_lease_reads_late_extend(
    locker: Locker, backend: RecordingBackend, clock: FakeClock
) -> None:
    lock = locker.acquire("k", ttl=30.0, extend_interval=1.0)
    # At 1 s the extension asks for 30 s; its answer takes 29.75 s, beyond 99% of that lease.
    backend.hooks["extend"] = lambda: clock.advance(29.75)
    clock.set(START + 1.0)
    locker.run_heartbeat()
    assert lock.lost_reason == "late-extend"
    assert not backend.inspect("k").held


def test_manual_extend_answered_late_raises_and_gives_back(
    locker: Locker, backend: RecordingBackend, clock: FakeClock
) -> None:
    lock = locker.acquire("k")
    backend.hooks["extend"] = lambda: clock.advance(35.0)
    with pytest.raises(LockLostError) as caught:
        lock.extend()
    assert caught.value.reason == "late-extend"
    assert not backend.inspect("k").held


def test_max_hold_clamps_every_request_and_ends_at_the_deadline(
    backend: RecordingBackend, clock: FakeClock, events: EventLog
) -> None:
    locker = Locker(backend, clock=clock, heartbeat_thread=False, on_event=events, ttl=8.0, max_hold=25.0)
    lock = locker.acquire("k", extend_interval=2.0)
    deadline = START + 25.0
    for beat in range(1, 13):
        advance_to_beat(clock, locker, START + 2.0 * beat)
    # Beats at 2..16 s ask for 8 s; at 18 s only 7 s are left before the deadline, and a
    # clamped lease is not extended again.
    assert extends(backend) == [8.0] * 8 + [7.0]
    assert lock.state == "held"
    # The local lease ends 1% early: at 18 + 6.93 s, just before the deadline.
    advance_to_beat(clock, locker, START + 24.875)
    assert lock.state == "held"
    advance_to_beat(clock, locker, START + 24.9375)
    assert lock.lost_reason == "max-hold"
    assert clock() < deadline
    # The key is not deleted at the deadline: the backend lease runs out on its own.
    assert backend.is_held("k", lock.token)
    assert backend.called("release") == []
    assert backend.inspect("k").expires_in == pytest.approx(deadline - clock())
    assert events.types().count("lost") == 1 and events.of("lost")[0].reason == "max-hold"
    locker.close()


def test_requested_lease_never_passes_the_deadline(backend: RecordingBackend, clock: FakeClock) -> None:
    locker = Locker(backend, clock=clock, heartbeat_thread=False, ttl=10.0, max_hold=12.0)
    lock = locker.acquire("k")
    requests: list[tuple[float, float]] = []
    original = backend.extend

    def spy(key: str, token: str, ttl: float) -> bool:
        requests.append((clock(), ttl))
        return original(key, token, ttl)

    backend.extend = spy  # type: ignore[method-assign]
    for when in (3.5, 7.0, 10.5):
        advance_to_beat(clock, locker, START + when)
    lock.extend(ttl=100.0)
    assert requests
    assert all(sent + ttl <= START + 12.0 for sent, ttl in requests)
    assert requests[-1] == (START + 10.5, pytest.approx(1.5))
    locker.close()


def test_max_hold_shorter_than_ttl_clamps_the_acquisition(
    locker: Locker, backend: RecordingBackend, clock: FakeClock
) -> None:
    lock = locker.acquire("k", ttl=10.0, max_hold=4.0)
    assert backend.called("acquire") == [("acquire", "k", 4.0)]
    advance_to_beat(clock, locker, START + 3.875)
    assert lock.state == "held" and extends(backend) == []
    advance_to_beat(clock, locker, START + 3.96)
    assert lock.lost_reason == "max-hold"
    assert backend.is_held("k", lock.token)


def test_a_lockers_ttl_above_its_max_hold_is_cut_to_it(backend: RecordingBackend, clock: FakeClock) -> None:
    # Deliberate (docs/concepts.md): ttl=30000, milliseconds meant, holds a key an hour at most.
    locker = Locker(backend, clock=clock, heartbeat_thread=False, ttl=30000)
    locker.acquire("k")
    assert backend.called("acquire") == [("acquire", "k", 3600.0)]
    locker.close()


def test_without_auto_extend_there_is_no_deadline_unless_asked(
    locker: Locker, backend: RecordingBackend, clock: FakeClock
) -> None:
    free = locker.acquire("a", ttl=10.0, auto_extend=False)
    assert backend.called("acquire")[-1] == ("acquire", "a", 10.0)
    bounded = locker.acquire("b", ttl=10.0, auto_extend=False, max_hold=4.0)
    assert backend.called("acquire")[-1] == ("acquire", "b", 4.0)
    clock.set(START + 3.96)
    assert (free.state, bounded.lost_reason) == ("held", "max-hold")


def test_due_extensions_go_to_the_backend_as_one_batch(
    locker: Locker, backend: RecordingBackend, clock: FakeClock, events: EventLog
) -> None:
    locks = [locker.acquire(f"k{index}") for index in range(20)]
    advance_to_beat(clock, locker, START + 10.0)
    assert backend.batches == [20]
    assert all(lock.state == "held" for lock in locks)
    assert len(events.of("extended")) == 20


def test_failed_batch_is_a_failed_extension_for_each_lock(
    locker: Locker, backend: RecordingBackend, clock: FakeClock, events: EventLog
) -> None:
    locks = [locker.acquire(f"k{index}") for index in range(3)]
    backend.hooks["extend"] = raise_flaky
    advance_to_beat(clock, locker, START + 10.0)
    assert all(lock.state == "held" for lock in locks)
    assert len(events.of("extend_failed")) == 3


def test_garbage_collected_lock_stops_being_extended_and_is_given_back_by_the_heartbeat(
    locker: Locker, backend: RecordingBackend, clock: FakeClock
) -> None:
    lock = locker.acquire("k")
    reference = weakref.ref(lock)
    lost_signal = lock.lost  # callers often keep the event; it must not keep the lock alive
    with pytest.warns(DroppedLockWarning, match=re.escape("'k' that Locker.acquire() returned was dropped while held")):
        del lock
    gc.collect()
    assert reference() is None
    # Collecting it only queued the lease: nothing reached the store inside the collector.
    assert backend.called("release") == []
    assert backend.inspect("k").held
    advance_to_beat(clock, locker, START + 10.0)
    assert backend.called("release") == [("release", "k", None)]
    assert not backend.inspect("k").held
    advance_to_beat(clock, locker, START + 20.0)
    assert extends(backend) == []
    assert not lost_signal.is_set()


def test_a_released_or_lost_lock_that_is_dropped_is_no_drop(
    locker: Locker, backend: RecordingBackend, clock: FakeClock
) -> None:
    released = locker.acquire("a")
    released.release()
    lost = locker.acquire("b", ttl=1.0, auto_extend=False)
    clock.advance(2.0)
    assert lost.state == "lost"
    with warnings.catch_warnings():
        warnings.simplefilter("error", DroppedLockWarning)
        del released, lost
        gc.collect()
    locker.run_heartbeat()
    assert backend.called("release") == [("release", "a", None)]


def test_closing_gives_back_dropped_leases_the_heartbeat_has_not(
    locker: Locker, backend: RecordingBackend
) -> None:
    with pytest.warns(DroppedLockWarning, match="'k'"):
        assert locker.try_acquire("k") is not None
    assert backend.called("release") == []
    locker.close()
    assert backend.called("release") == [("release", "k", None)]
    assert not backend.inspect("k").held


def test_one_heartbeat_thread_per_locker_whatever_the_lock_count() -> None:
    backend = MemoryBackend()
    before = {thread.ident for thread in threading.enumerate()}
    first = Locker(backend)
    second = Locker(backend)
    held = [first.acquire(f"a{index}") for index in range(100)]
    held += [second.acquire(f"b{index}") for index in range(100)]
    started = [thread for thread in threading.enumerate() if thread.ident not in before]
    assert len(started) == 2
    assert all(thread.daemon and thread.name == "lease-lock-heartbeat" for thread in started)
    assert {first._heartbeat.thread, second._heartbeat.thread} == set(started)
    for locker in (first, second):
        locker.close()
    assert all(lock.lost_reason == "closed" for lock in held)
    for thread in started:
        thread.join(10)
        assert not thread.is_alive()


def test_lost_wait_wakes_on_a_loss_found_by_another_thread(locker: Locker, backend: RecordingBackend) -> None:
    lock = locker.acquire("k")
    woke = threading.Event()
    waiter = threading.Thread(target=lambda: lock.lost.wait(30) and woke.set())
    waiter.start()
    backend.force_release("k")
    assert lock.is_held() is False
    waiter.join(30)
    assert woke.is_set()


def test_clamped_grant_is_not_lost_to_a_sliver_extension(
    locker: Locker, backend: RecordingBackend, clock: FakeClock
) -> None:
    # Were the clamped grant extended, the beat at 3.875 s would ask for 0.125 s, a reply taking
    # 0.25 s would come back late, and the lock would read "late-extend" with its key deleted.
    backend.hooks["extend"] = lambda: clock.advance(0.25)
    lock = locker.acquire("k", ttl=10.0, max_hold=4.0)
    advance_to_beat(clock, locker, START + 3.875)
    advance_to_beat(clock, locker, START + 3.96)
    assert lock.lost_reason == "max-hold"
    assert backend.is_held("k", lock.token)


def test_slowly_applied_batch_answers_are_not_late(backend: RecordingBackend, clock: FakeClock) -> None:
    # Regression: lateness was judged by when the loop applied each answer of a batch, not by
    # when the batch came back, so the last locks of a large batch applied slowly read
    # "late-extend" although the store had extended them in time. Here each applied answer
    # costs 10 s of fake time (an event hook), so the third is applied after its old lease end.
    seen: list[tuple[str, object]] = []

    def slow_hook(event: LockEvent) -> None:
        seen.append((event.type, event.reason))
        if event.type == "extended":
            clock.advance(10.0)

    locker = Locker(backend, clock=clock, heartbeat_thread=False, on_event=slow_hook, ttl=30.0)
    locks = [locker.acquire(f"batch:{index}") for index in range(3)]
    clock.advance(10.0)  # every lock's beat falls due together
    locker.run_heartbeat()
    assert backend.batches == [3]
    # Every answer arrived 10 s into a 30 s lease: all three were extended in time.
    assert [kind for kind, _ in seen if kind in ("extended", "lost")] == ["extended"] * 3
    assert len(locks) == 3  # held by this list all along: collected locks are not extended
    locker.close()


# -- the timer queues -------------------------------------------------------------------------


class Beat:
    """A stand-in lock that records when its timer fired."""

    def __init__(self, name: str) -> None:
        self.key = name
        self.token = "beat-token"  # noqa: S105 - a test value
        self.fired: list[float] = []


class Recorder:
    """The heartbeat's calls into its locks: each fired timer is recorded, no extension asked."""

    def due(self, lock: Beat, now: float, timer: Timer) -> Optional[float]:
        lock.fired.append(now)
        return None

    def sending(self, lock: Beat, requested: float, sent: float) -> Optional[float]:
        raise AssertionError("no extension was asked for")

    def answered(self, lock: Beat, sent: float, received: float, requested: float, granted: bool) -> bool:
        raise AssertionError("no extension was asked for")

    def failed(self, lock: Beat, error: BaseException) -> None:
        raise AssertionError("no extension was asked for")

    def arrived(self, lock: Beat) -> None:
        raise AssertionError("scheduled directly, never through the arrivals")


@settings(deadline=None, max_examples=150)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("schedule"), st.integers(0, 40), st.sampled_from([1, 2, 3, 5, 7, 11, 13, 17, 19, 23])),
            st.tuples(st.just("cancel"), st.integers(0, 60), st.just(0)),
            st.tuples(st.just("run"), st.integers(0, 10), st.just(0)),
        ),
        max_size=60,
    )
)
def test_every_live_timer_fires_once_on_time_whatever_its_lane(ops: list[tuple[str, int, int]]) -> None:
    # Timers of many lanes (more than the heartbeat keeps), scheduled out of order within a
    # lane, cancelled or not: each live timer fires exactly once, at the first run at or after
    # its time, and a cancelled one never does. Times are whole seconds of a fake clock.
    now = [0.0]
    heartbeat = Heartbeat(MemoryBackend(), lambda: now[0], Recorder())
    heartbeat._run = lambda: None  # type: ignore[method-assign]  # the test runs the due work
    beats: list[tuple[Beat, Timer, float]] = []
    cancelled: set[int] = set()
    try:
        for op, amount, lane in ops:
            if op == "schedule":
                beat = Beat(f"b{len(beats)}")
                when = now[0] + amount
                beats.append((beat, heartbeat.schedule(weakref.ref(beat), when, float(lane)), when))
            elif op == "cancel" and beats:
                index = amount % len(beats)
                heartbeat.cancel(beats[index][1])
                if not beats[index][0].fired:
                    cancelled.add(index)
            elif op == "run":
                now[0] += amount
                heartbeat.run_due()
                for index, (beat, _, when) in enumerate(beats):
                    due = when <= now[0] and index not in cancelled
                    assert beat.fired == ([beat.fired[0]] if due else []), (index, when, now[0])
        assert heartbeat.pending() == sum(
            1 for index, (beat, _, _) in enumerate(beats) if not beat.fired and index not in cancelled
        )
        now[0] += 100
        heartbeat.run_due()
        for index, (beat, _, when) in enumerate(beats):
            assert len(beat.fired) == (0 if index in cancelled else 1)
            assert all(fired >= when for fired in beat.fired)
        assert heartbeat.pending() == 0
    finally:
        heartbeat.stop()


def test_acquiring_and_releasing_at_once_leaves_no_timers_behind(locker: Locker, clock: FakeClock) -> None:
    # A lock held for a moment cancels its timer at once: the queues must not keep the cancelled
    # timers until they would have fallen due (a tight loop makes hundreds of thousands a second).
    def timers() -> int:
        return sum(1 for item in gc.get_objects() if type(item) is Timer)  # no isinstance: lazy objects

    before = timers()
    kept = locker.acquire("kept")
    for _ in range(5000):
        with locker.lock("k"):
            clock.advance(0.001)
    assert timers() - before <= 300
    assert locker._heartbeat.pending() == 1
    kept.release()
    assert locker._heartbeat.pending() == 0


def test_many_ttls_still_extend_each_lock_on_time(locker: Locker, backend: RecordingBackend, clock: FakeClock) -> None:
    # More distinct intervals than the heartbeat keeps lanes for: the rest wait in its heap.
    locks = [locker.acquire(f"k{index}", ttl=3.0 * (index + 1)) for index in range(LANES + 4)]
    for index, lock in enumerate(locks):
        clock.set(START + index + 1.0)
        locker.run_heartbeat()
        assert [ttl for _, key, ttl in backend.called("extend") if key == lock.key] == [3.0 * (index + 1)]
        assert all(lock.state == "held" for lock in locks)


def test_a_lock_released_before_its_first_beat_never_costs_a_timer(locker: Locker, clock: FakeClock) -> None:
    # ttl 30 s: the first beat is 10 s away, so the grant only joins the arrivals; the
    # heartbeat sets a timer for the locks still held when it next looks.
    def timers() -> int:
        return sum(1 for item in gc.get_objects() if type(item) is Timer)  # no isinstance: lazy objects

    before = timers()
    for _ in range(100):
        with locker.lock("brief"):
            pass
    auto_extend_off = locker.acquire("off", auto_extend=False)
    auto_extend_off.release()
    assert timers() == before
    held = locker.acquire("held")
    assert locker._heartbeat.pending() == 1, "the lock still held got its timer"
    assert timers() == before + 1
    held.release()
    assert locker._heartbeat.pending() == 0




def test_a_locker_without_its_heartbeat_thread_starts_none_and_beats_when_told(
    backend: RecordingBackend, clock: FakeClock
) -> None:
    # The supported way to drive the heartbeat from the program (tests on injected time, an
    # event loop): no thread is ever started, and run_heartbeat() does the due work.
    before = set(threading.enumerate())
    locker = Locker(backend, clock=clock, heartbeat_thread=False, ttl=3.0)
    try:
        short = locker.acquire("short")  # its first beat 1 s away: a timer at once
        long = locker.acquire("long", ttl=30.0)  # 10 s away: an arrival
        dropped = locker.acquire("dropped")
        dropped_message = re.escape("'dropped' that Locker.acquire() returned was dropped while held")
        with pytest.warns(DroppedLockWarning, match=dropped_message):
            del dropped
        assert set(threading.enumerate()) == before, "no heartbeat thread"
        assert backend.called("release") == []
        clock.advance(1.0)
        assert locker.run_heartbeat() == 1
        assert backend.called("release") == [("release", "dropped", None)]
        assert [call[1] for call in backend.called("extend")] == ["short"]
        for _ in range(9):
            clock.advance(1.0)
            locker.run_heartbeat()
        extended = [call[1] for call in backend.called("extend")]
        assert extended.count("long") == 1 and extended.count("short") == 10
        assert short.state == long.state == "held"
        clock.advance(30.0)  # nobody ran the heartbeat meanwhile: both leases ran out
        assert short.state == long.state == "lost"
        assert set(threading.enumerate()) == before
    finally:
        locker.close()


def test_heartbeat_thread_and_owns_backend_are_validated_options(backend: RecordingBackend) -> None:
    with pytest.raises(ValidationError, match="heartbeat_thread"):
        Locker(backend, heartbeat_thread="no")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="owns_backend"):
        Locker(backend, owns_backend=1)  # type: ignore[arg-type]
    closed: list[bool] = []
    backend.close = lambda: closed.append(True)  # type: ignore[method-assign]
    Locker(backend).close()
    assert closed == []
    Locker(backend, owns_backend=True).close()
    assert closed == [True]
