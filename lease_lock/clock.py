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

__all__ = ["PAUSE_THRESHOLD", "QUIET_PAUSE", "LeaseClock", "monotonic_source"]

#: Forward wall-clock jumps beyond the monotonic advance smaller than this are noise (NTP slew,
#: scheduling jitter) and are not counted as pauses.
PAUSE_THRESHOLD = 0.05
#: How often a waiter looks at a key while nothing announces its release (seconds): the pause
#: between attempts on a store that announces nothing (with the retry delay unset), and an
#: announcing line's while its watcher is down.
QUIET_PAUSE = 0.2


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

    A reading takes no lock: it compares its two sources with the latest reading any thread
    made, and only a jump beyond the threshold goes to the mutex, where it is judged again so
    that a pause seen by several threads at once is counted once (see :meth:`_judge_jump`).
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
        #: How many pauses were counted: a reading is stamped with the count it saw before
        #: reading its sources, so a reading from before a counted pause is known as such.
        self._pauses = 0
        first_monotonic = self._monotonic()
        first = (first_monotonic, wall() - first_monotonic)
        #: The latest reading, ``(monotonic, offset, pauses)`` where the offset is the wall
        #: clock minus the monotonic one: a pause that only the wall clock saw grows the
        #: offset. One tuple, replaced whole, so that a thread never sees the halves of two
        #: readings. Threads race to write it, so it may be a little older than the newest
        #: reading; it is only ever the base of the next check.
        self._last = (*first, 0)
        #: The reading that found the latest counted pause (written under the mutex only).
        self._counted_at = first
        #: Seconds of pauses seen so far, added to every reading.
        self.paused = 0.0

    def after_fork(self) -> None:
        """In a forked child: a new mutex, since a parent thread may have held the old one."""
        self._mutex = threading.Lock()

    def __call__(self) -> float:
        pauses = self._pauses
        now_monotonic = self._monotonic()
        # The wall clock's advance beyond the monotonic one since the last reading is the
        # growth of their difference.
        offset = self._wall() - now_monotonic
        if offset - self._last[1] > self._threshold:
            self._judge_jump(now_monotonic, offset)
        else:
            self._last = (now_monotonic, offset, pauses)
        # Read after the check: a pause counted meanwhile by another thread is included, which
        # can only put this reading ahead, never behind.
        return now_monotonic + self.paused

    def peek(self) -> float:
        """A reading without the pause check: the monotonic clock plus the pauses counted so
        far. Never ahead of a full reading made at the same moment (a pause it skips is found by
        the next full reading), so it may time the start of a span whose end is read in full."""
        return self._monotonic() + self.paused

    def _judge_jump(self, now_monotonic: float, offset: float) -> None:
        """A reading saw the wall clock jump ahead: count the pause once, under the mutex.

        Judged against the latest reading if it was made since the last counted pause; a
        reading from before it (a thread that wrote its older reading late) would show that
        pause again, so the reading that counted it is the base instead. A reading older than
        its base is not judged at all: the base's own reading covered that span. So no pause
        is counted twice, none is missed, and a backward wall step is never read as a pause.
        """
        with self._mutex:
            last_monotonic, last_offset, pauses = self._last
            if pauses != self._pauses:
                last_monotonic, last_offset = self._counted_at
            if now_monotonic < last_monotonic:
                # This reading is older than the base (its thread was switched out after
                # reading): the reading that made the base judged that span already, and a
                # backward wall step inside it would read here as a forward jump.
                return
            unexplained = offset - last_offset
            if unexplained > self._threshold:
                self.paused += unexplained
                self._pauses += 1
                self._counted_at = (now_monotonic, offset)
            self._last = (now_monotonic, offset, self._pauses)
