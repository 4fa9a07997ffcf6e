"""The clock that times leases: monotonic, suspend-aware, and pause-detecting.

A lease is only as good as the holder's idea of how much of it is left. The clock here errs on
the safe side: it never runs slower than real elapsed time as far as this host can tell.

- It reads ``CLOCK_BOOTTIME`` where the OS has it (Linux), which keeps counting while the machine
  is suspended; elsewhere ``time.monotonic``.
- Some pauses are invisible even to that clock (a VM frozen by its hypervisor, a container
  checkpointed and restored). The wall clock usually does see them, so between two readings a
  forward wall-clock jump more than :data:`PAUSE_THRESHOLD` beyond the monotonic advance is
  added to the reading. Backward wall-clock steps are ignored. An NTP step forward can therefore
  end a local lease early, never late.
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Callable, Optional

__all__ = ["PAUSE_THRESHOLD", "LeaseClock", "monotonic_source"]

#: Forward wall-clock jumps beyond the monotonic advance smaller than this are noise (NTP slew,
#: scheduling jitter) and are not counted as pauses.
PAUSE_THRESHOLD = 0.05


def monotonic_source() -> Callable[[], float]:
    """The best monotonic clock of this OS: ``CLOCK_BOOTTIME`` when available."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    if boottime is not None:
        try:
            time.clock_gettime(boottime)
        except OSError:  # pragma: no cover - kernels without it
            return time.monotonic
        # A partial, not a lambda: the clock is read several times per lock, and a partial of a
        # builtin runs without a Python frame.
        return functools.partial(time.clock_gettime, boottime)
    return time.monotonic  # pragma: no cover - non-Linux


class LeaseClock:
    """A zero-argument callable returning seconds that only move forward.

    The reading is the monotonic clock plus every pause that only the wall clock saw (see the
    module docstring). ``monotonic`` and ``wall`` are injectable for tests.
    """

    def __init__(
        self,
        monotonic: Optional[Callable[[], float]] = None,
        wall: Callable[[], float] = time.time,
        threshold: float = PAUSE_THRESHOLD,
    ) -> None:
        self._monotonic = monotonic or monotonic_source()
        self._wall = wall
        self._threshold = threshold
        self._mutex = threading.Lock()
        self._last_monotonic = self._monotonic()
        self._last_wall = wall()
        #: Seconds of pauses seen so far, added to every reading.
        self.paused = 0.0

    def after_fork(self) -> None:
        """In a forked child: a new mutex, since a parent thread may have held the old one."""
        self._mutex = threading.Lock()

    def __call__(self) -> float:
        with self._mutex:
            now_monotonic = self._monotonic()
            now_wall = self._wall()
            unexplained = (now_wall - self._last_wall) - (now_monotonic - self._last_monotonic)
            if unexplained > self._threshold:
                self.paused += unexplained
            self._last_monotonic = now_monotonic
            self._last_wall = now_wall
            return now_monotonic + self.paused
