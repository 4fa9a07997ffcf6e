"""The lease clock: monotonic time plus the pauses only the wall clock saw."""

from __future__ import annotations

import threading
import time
from typing import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lease_lock import Locker, MemoryBackend
from lease_lock.clock import PAUSE_THRESHOLD, LeaseClock, monotonic_source


class Sources:
    """A monotonic and a wall clock that a test moves independently."""

    def __init__(self) -> None:
        self.monotonic = 500.0
        self.wall = 1_700_000_000.0

    def step(self, monotonic: float, wall: float) -> None:
        self.monotonic += monotonic
        self.wall += wall


@pytest.fixture
def sources() -> Sources:
    return Sources()


@pytest.fixture
def lease_clock(sources: Sources) -> LeaseClock:
    return LeaseClock(monotonic=lambda: sources.monotonic, wall=lambda: sources.wall)


def test_reads_the_monotonic_clock_while_both_agree(sources: Sources, lease_clock: LeaseClock) -> None:
    assert lease_clock() == 500.0
    sources.step(2.0, 2.0)
    assert lease_clock() == 502.0
    assert lease_clock.paused == 0.0


def test_forward_wall_jump_beyond_threshold_is_added(sources: Sources, lease_clock: LeaseClock) -> None:
    lease_clock()
    # A VM frozen for 7 s: the monotonic clock advanced 1 s, the wall clock 8 s.
    sources.step(1.0, 8.0)
    assert lease_clock() == pytest.approx(508.0)
    assert lease_clock.paused == pytest.approx(7.0)
    # The pause stays counted in every later reading.
    sources.step(1.0, 1.0)
    assert lease_clock() == pytest.approx(509.0)


def test_jitter_up_to_threshold_is_ignored(sources: Sources, lease_clock: LeaseClock) -> None:
    lease_clock()
    sources.step(1.0, 1.0 + PAUSE_THRESHOLD * 0.8)
    assert lease_clock() == 501.0
    sources.step(1.0, 1.0 + PAUSE_THRESHOLD)
    assert lease_clock() == 502.0
    assert lease_clock.paused == 0.0
    sources.step(1.0, 1.0 + PAUSE_THRESHOLD * 1.5)
    assert lease_clock() == pytest.approx(503.0 + PAUSE_THRESHOLD * 1.5)


def test_backward_wall_step_is_ignored(sources: Sources, lease_clock: LeaseClock) -> None:
    lease_clock()
    sources.step(1.0, -3600.0)
    assert lease_clock() == 501.0
    # The next ordinary advance is measured from the stepped-back wall reading, not flagged.
    sources.step(1.0, 1.0)
    assert lease_clock() == 502.0
    assert lease_clock.paused == 0.0


def test_reading_never_goes_back(sources: Sources, lease_clock: LeaseClock) -> None:
    readings = [lease_clock()]
    for monotonic, wall in [(0.5, 0.5), (0.1, 5.0), (0.2, -10.0), (0.3, 0.3), (0.0, 0.0)]:
        sources.step(monotonic, wall)
        readings.append(lease_clock())
    assert readings == sorted(readings)


def test_monotonic_source_is_suspend_aware_where_the_os_allows() -> None:
    source = monotonic_source()
    first = source()
    second = source()
    assert second >= first
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    if boottime is not None:
        assert abs(source() - time.clock_gettime(boottime)) < 1.0
    else:
        assert source is time.monotonic


def test_locker_uses_a_lease_clock_unless_given_one() -> None:
    backend = MemoryBackend()
    with Locker(backend) as default:
        assert isinstance(default._clock, LeaseClock)
    readings = iter([10.0, 11.0])
    with Locker(backend, clock=lambda: next(readings)) as injected:
        assert injected._clock() == 10.0


# -- the lock-free reading: a pause is counted once, whoever sees it ----------------------------


def reference_pauses(steps: list[tuple[float, float]], threshold: float = PAUSE_THRESHOLD) -> float:
    """What the clock must have counted after these steps, read one at a time: every forward
    wall jump beyond the monotonic advance (and beyond the threshold) between two readings."""
    return sum(wall - monotonic for monotonic, wall in steps if wall - monotonic > threshold)


@settings(deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(min_value=0.0, max_value=5.0),
            # Clear of the threshold itself, where rounding decides.
            st.one_of(st.floats(min_value=-100.0, max_value=0.04), st.floats(min_value=0.06, max_value=100.0)),
        ),
        max_size=40,
    )
)
def test_one_reader_counts_what_consecutive_readings_show(steps: list[tuple[float, float]]) -> None:
    sources = Sources()
    lease_clock = LeaseClock(monotonic=lambda: sources.monotonic, wall=lambda: sources.wall)
    readings = [lease_clock()]
    for monotonic, wall_extra in steps:
        sources.step(monotonic, monotonic + wall_extra)
        readings.append(lease_clock())
    expected = reference_pauses([(monotonic, monotonic + extra) for monotonic, extra in steps])
    # The wall clock reads about 1.7e9 s, where a float resolves about 2e-7 s.
    assert lease_clock.paused == pytest.approx(expected, abs=1e-6 * (len(steps) + 1))
    assert readings == sorted(readings)


class Interleaved:
    """Sources whose wall reading can run other steps in the middle of a reading: the reader
    that read first records its reading last, as when a thread is switched out between reading
    the sources and recording what it read."""

    def __init__(self) -> None:
        self.sources = Sources()
        self.in_between: list[Callable[[], None]] = []
        self.clock = LeaseClock(monotonic=lambda: self.sources.monotonic, wall=self._wall)

    def _wall(self) -> float:
        wall = self.sources.wall
        while self.in_between:
            self.in_between.pop(0)()
        return wall


def test_a_late_written_reading_from_before_a_pause_does_not_count_it_again() -> None:
    run = Interleaved()
    run.clock()

    def pause_then_read() -> None:
        run.sources.step(1.0, 9.0)  # an 8 s pause only the wall clock saw
        run.clock()  # another thread reads after the pause and counts it

    run.in_between.append(pause_then_read)
    before = run.clock()  # read before the pause, recorded after the other thread's reading
    assert before == pytest.approx(500.0 + 8.0), "a reading finished after a counted pause includes it"
    assert run.clock.paused == pytest.approx(8.0)
    # The next readings compare against a reading from before the pause: still counted once.
    run.clock()
    run.sources.step(1.0, 1.0)
    run.clock()
    assert run.clock.paused == pytest.approx(8.0)
    # A later pause is counted as usual.
    run.sources.step(1.0, 4.0)
    assert run.clock() == pytest.approx(503.0 + 8.0 + 3.0)
    assert run.clock.paused == pytest.approx(11.0)


def test_a_late_written_reading_from_before_a_backward_step_is_no_pause() -> None:
    run = Interleaved()
    run.clock()

    def step_back_then_read() -> None:
        run.sources.step(0.5, -1.0)  # NTP steps the wall clock back
        run.clock()

    run.in_between.append(step_back_then_read)
    run.clock()  # read before the step, recorded after the newer reading
    run.sources.step(1.0, 1.0)
    run.clock()
    assert run.clock.paused == 0.0


STEPS = st.lists(
    st.tuples(
        st.sampled_from(["read", "late read", "pause", "tick", "step back"]),
        st.floats(min_value=0.1, max_value=20.0),
    ),
    max_size=30,
)


@given(STEPS)
@settings(max_examples=300, deadline=None)
def test_each_pause_is_counted_once_however_readings_interleave(steps: list[tuple[str, float]]) -> None:
    # A "late read" reads its sources, runs every later step up to the next read in between
    # (other threads) and only then records its own reading. Each "pause" is one forward jump
    # of the wall clock: counted at most once, and exactly once unless a backward step of the
    # wall clock hides it; a backward step is never counted (a late reading compared with a
    # newer one would see it reversed); no reading comes out behind the monotonic clock plus
    # the pauses known when it started.
    run = Interleaved()
    run.clock()
    injected = 0.0
    floors: list[tuple[float, float]] = []

    def read() -> None:
        floor = run.sources.monotonic + run.clock.paused
        floors.append((floor, run.clock()))

    def move(kind: str, amount: float) -> None:
        nonlocal injected
        if kind == "pause":
            run.sources.step(0.5, 0.5 + amount)
            injected += amount
        elif kind == "tick":
            run.sources.step(amount, amount)
        elif kind == "step back":
            run.sources.step(0.5, -amount)
        else:
            read()

    index = 0
    while index < len(steps):
        kind, amount = steps[index]
        index += 1
        if kind != "late read":
            move(kind, amount)
            continue
        while index < len(steps) and steps[index][0] not in ("read", "late read"):
            run.in_between.append(lambda step=steps[index]: move(*step))
            index += 1
        if index < len(steps):
            run.in_between.append(read)
            index += 1
        read()
    read()
    assert run.clock.paused <= injected + 1e-4, "a pause was counted twice"
    if not any(kind == "step back" for kind, _ in steps):
        assert run.clock.paused == pytest.approx(injected, abs=1e-4)
    assert all(reading >= floor - 1e-9 for floor, reading in floors)


def test_threads_reading_through_a_pause_count_it_once() -> None:
    sources = Sources()
    lease_clock = LeaseClock(monotonic=lambda: sources.monotonic, wall=lambda: sources.wall)
    lease_clock()
    start = threading.Barrier(5)

    def reader() -> None:
        start.wait()
        for index in range(2000):
            lease_clock()
            if index % 100 == 0:
                time.sleep(0)  # hand the GIL over, so that readings interleave

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for thread in threads:
        thread.start()
    start.wait()
    sources.step(1.0, 9.0)
    for thread in threads:
        thread.join()
    lease_clock()
    assert lease_clock.paused == pytest.approx(8.0)
