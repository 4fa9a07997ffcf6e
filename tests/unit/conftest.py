"""Fixtures for the core's unit tests: a fake clock shared by the Locker and the memory backend,
a recording memory backend, an event recorder and a Locker wired to all three.

Time is injected, never slept: a test moves the :class:`FakeClock` and calls
``locker.run_heartbeat()`` to do the heartbeat's due work on its own thread (its Lockers run
without a heartbeat thread: ``heartbeat_thread=False``). A test that
asks for ``sleeps`` gets a :class:`SleepingClock`, which the Locker's waits sleep on.
"""

from __future__ import annotations

from typing import Iterator

import pytest
from lease_lock import Locker

from .fakes import EventLog, FakeClock, RecordingBackend, SleepingClock


@pytest.fixture
def clock(request: pytest.FixtureRequest) -> FakeClock:
    """The fake clock (a :class:`SleepingClock` when the test also asks for ``sleeps``).

    A Locker on it is built with ``heartbeat_thread=False``: a real thread acting on fake time
    would do due work whenever it happens to wake, racing the test. The test runs that work
    where it chooses with ``locker.run_heartbeat()``. Tests of the thread itself need the real
    clock and are in ``tests/integration/test_core_real_time.py``.
    """
    return SleepingClock() if "sleeps" in request.fixturenames else FakeClock()


@pytest.fixture
def backend(clock: FakeClock) -> RecordingBackend:
    """A recording memory backend judging expiry on the fake clock."""
    return RecordingBackend(clock=clock)


@pytest.fixture
def events() -> EventLog:
    """Records every event of the ``locker`` fixture."""
    return EventLog()


@pytest.fixture
def locker(backend: RecordingBackend, clock: FakeClock, events: EventLog) -> Iterator[Locker]:
    """A Locker on the fake clock: ttl 30 s (heartbeat every 10 s), max_hold one hour."""
    locker = Locker(backend, clock=clock, heartbeat_thread=False, on_event=events, ttl=30.0)
    yield locker
    locker.close()


@pytest.fixture
def sleeps(clock: FakeClock) -> list[float]:
    """Each wait of the Locker's acquisitions, in order: they sleep on the fake clock, moving it."""
    assert isinstance(clock, SleepingClock)
    return clock.slept
