"""Starting, stopping, killing and reading the log of a test server's process, shared by the
fixtures."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

import pytest

__all__ = ["kill_process", "log_tail", "start_or_give_up", "stop_process"]

_Server = TypeVar("_Server")

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


def start_or_give_up(name: str, start: Callable[[], _Server]) -> _Server:
    """What ``start()`` returns; when it cannot start its server (``OSError``, ``RuntimeError``,
    a failed command), the test FAILS under the ``CI`` environment variable and is skipped
    elsewhere, naming ``name`` and why (a failed command's stderr included)."""
    try:
        return start()
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:
        detail = getattr(error, "stderr", b"") or b""
        text = detail if isinstance(detail, str) else detail.decode(errors="replace")
        reason = f"{error} {text}".strip()
        if os.environ.get("CI"):
            pytest.fail(f"{name} is required under CI but unavailable: {reason}")
        pytest.skip(f"{name} unavailable: {reason}")
