"""Stopping, killing and reading the log of a test server's process, shared by the fixtures."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any, Optional

__all__ = ["kill_process", "log_tail", "stop_process"]

_GRACE = 10


def stop_process(process: Optional[subprocess.Popen[Any]], resume: bool = False) -> None:
    """SIGTERM ``process``, then SIGKILL if it has not exited after 10 s; nothing if it is gone.

    ``resume`` sends SIGCONT first, so that a process a test paused with SIGSTOP can act on the
    SIGTERM instead of sitting out the grace period.
    """
    if process is None or process.poll() is not None:
        return
    if resume:
        process.send_signal(signal.SIGCONT)
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(_GRACE)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(_GRACE)


def kill_process(process: Optional[subprocess.Popen[Any]]) -> None:
    """SIGKILL ``process`` at once, as a crash would, and reap it; nothing if it is gone."""
    if process is not None and process.poll() is None:
        process.kill()
        process.wait(_GRACE)


def log_tail(path: Path, lines: int) -> str:
    """The last ``lines`` lines of the log at ``path``, or ``(no log)`` where it cannot be read."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
