"""Watching a waiting acquire ride out an outage: the ``attempt_failed`` events it reports."""

from __future__ import annotations

import threading

from lease_lock import LockEvent

__all__ = ["DEADLINE", "Failures"]

#: How long a test waits for anything that should happen within a few seconds.
DEADLINE = 60.0


class Failures:
    """An ``on_event`` hook that counts ``attempt_failed`` events and lets a test wait for some."""

    def __init__(self) -> None:
        self.errors: list[BaseException] = []
        self._condition = threading.Condition()

    def __call__(self, event: LockEvent) -> None:
        if event.type == "attempt_failed":
            with self._condition:
                assert event.error is not None
                self.errors.append(event.error)
                self._condition.notify_all()

    def wait_for(self, count: int) -> bool:
        """Whether ``count`` failed attempts were reported within :data:`DEADLINE`."""
        with self._condition:
            return self._condition.wait_for(lambda: len(self.errors) >= count, DEADLINE)
