"""A shared-memory knob over a worker's lease clock: wall-clock jumps and hidden pauses.

The machine's real clocks are shared with everyone else on it and must never be stepped, so a
worker started with ``--clock-file`` builds its :class:`~lease_lock.clock.LeaseClock` on top of
two offsets kept in a 16-byte file that the injector maps too:

- ``wall_offset`` is added to ``time.time()``: the injector steps it forward or back to play an
  NTP step (a clock jump);
- ``hidden`` is subtracted from the monotonic clock: while the worker is stopped the injector
  adds the length of the stop, so the worker's monotonic clock never sees the pause but its wall
  clock does. That is what a VM frozen by its hypervisor looks like from inside, and it is the
  case the lease clock's pause detector exists for.

The offsets are aligned 8-byte doubles, so a reader never sees a torn value on the platforms
we run on.
"""

from __future__ import annotations

import mmap
import struct
import time
from pathlib import Path

from lease_lock.clock import LeaseClock, monotonic_source

__all__ = ["ClockControl", "controlled_clock"]

_LAYOUT = struct.Struct("dd")


class ClockControl:
    """The two offsets of one worker's clock, in a file mapped into both processes."""

    def __init__(self, path: Path, *, create: bool = False) -> None:
        if create:
            path.write_bytes(_LAYOUT.pack(0.0, 0.0))
        self.path = path
        with open(path, "r+b") as handle:
            self._map = mmap.mmap(handle.fileno(), _LAYOUT.size)

    @property
    def hidden(self) -> float:
        """Seconds the worker's monotonic clock did not see."""
        return float(_LAYOUT.unpack_from(self._map, 0)[0])

    @property
    def wall_offset(self) -> float:
        """Seconds added to the worker's wall clock."""
        return float(_LAYOUT.unpack_from(self._map, 0)[1])

    def hide(self, seconds: float) -> None:
        """Hide ``seconds`` more from the monotonic clock (call while the worker is stopped)."""
        _LAYOUT.pack_into(self._map, 0, self.hidden + seconds, self.wall_offset)

    def jump_wall(self, seconds: float) -> None:
        """Step the worker's wall clock by ``seconds`` (negative: back)."""
        _LAYOUT.pack_into(self._map, 0, self.hidden, self.wall_offset + seconds)


def controlled_clock(control: ClockControl) -> LeaseClock:
    """A production :class:`LeaseClock` whose two sources are shifted by ``control``."""
    monotonic = monotonic_source()
    return LeaseClock(
        monotonic=lambda: monotonic() - control.hidden,
        wall=lambda: time.time() + control.wall_offset,
    )
