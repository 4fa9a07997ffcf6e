"""JSON-lines event logs stamped with one host-wide clock.

Every process of the harness (workers, injectors, the runner) stamps its lines with
:func:`host_now`, ``CLOCK_BOOTTIME`` on Linux: one clock shared by all processes of the host and
unmoved by wall-clock steps, so lines from different processes can be compared directly. Lines
are flushed one by one, so a worker that is killed leaves a complete log up to its last line.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Iterator

from lease_lock.clock import monotonic_source

__all__ = ["EventLog", "host_now", "read_log"]

#: The host clock (seconds). Workers whose lease clock is deliberately skewed still stamp their
#: log lines with this one.
host_now = monotonic_source()


class EventLog:
    """Appends one JSON object per line; safe to share between threads."""

    def __init__(self, path: Path, **constant: Any) -> None:
        self.path = path
        self._constant = constant
        self._mutex = threading.Lock()
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the process

    def write(self, event: str, **fields: Any) -> None:
        """Log ``event`` with ``fields``; ``t`` defaults to :func:`host_now`."""
        fields.setdefault("t", host_now())
        line = json.dumps({"ev": event, **self._constant, **fields}, default=str)
        with self._mutex:
            if not self._file.closed:
                self._file.write(line + "\n")
                self._file.flush()

    def close(self) -> None:
        """Close the file; later writes are dropped."""
        with self._mutex:
            self._file.close()


def read_log(path: Path) -> Iterator[dict[str, Any]]:
    """The events of one log; a torn last line (a killed writer) is skipped."""
    with open(path, encoding="utf-8") as source:
        for line in source:
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue
