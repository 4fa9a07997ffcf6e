"""Waiting on a condition in real time, with a generous limit, instead of sleeping a guess."""

from __future__ import annotations

import time
from typing import Callable

__all__ = ["wait_until"]


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Poll ``condition`` every 50 ms; ``AssertionError`` naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
