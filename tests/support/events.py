"""An ``on_event`` hook for the tests: it keeps every event and lets a test wait for some."""

from __future__ import annotations

import threading

from lease_lock.events import LockEvent

__all__ = ["Recorder"]


class Recorder:
    """Collects events and lets a test wait for one of a type."""

    def __init__(self) -> None:
        self.events: list[LockEvent] = []
        self._condition = threading.Condition()

    def __call__(self, event: LockEvent) -> None:
        with self._condition:
            self.events.append(event)
            self._condition.notify_all()

    def wait_for(self, kind: str, count: int = 1, timeout: float = 30) -> bool:
        with self._condition:
            return self._condition.wait_for(
                lambda: sum(event.type == kind for event in self.events) >= count, timeout
            )

    def types(self) -> list[str]:
        with self._condition:
            return [event.type for event in self.events]
