"""Events shared by the test process and the commands it runs in threads."""

from __future__ import annotations

import threading

__all__ = ["proceed", "reset", "runs", "started"]

started = threading.Event()
proceed = threading.Event()
runs: list[str] = []


def reset() -> None:
    """Fresh events and an empty run log, for one test."""
    global started, proceed
    started = threading.Event()
    proceed = threading.Event()
    runs.clear()
