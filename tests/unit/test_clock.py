"""The lease clock: monotonic time plus the pauses only the wall clock saw."""

from __future__ import annotations

import time

import pytest
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
