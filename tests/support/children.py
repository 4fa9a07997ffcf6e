"""Waiting for forked children without ever hanging the suite."""

from __future__ import annotations

import os
import signal
import time

__all__ = ["exit_codes"]


def exit_codes(children: list[int], timeout: float = 60) -> list[int]:
    """The children's exit codes, sorted; a child still running at the timeout is killed (-9)."""
    codes: dict[int, int] = {}
    deadline = time.monotonic() + timeout
    while len(codes) < len(children) and time.monotonic() < deadline:
        for pid in children:
            if pid not in codes:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[pid] = os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    for pid in children:
        if pid not in codes:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            codes[pid] = -9
    return sorted(codes.values())
