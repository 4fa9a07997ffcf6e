"""Forked children in the tests: waiting for them without ever hanging the suite."""

from __future__ import annotations

import os
import signal
import time
from typing import Any, Callable

__all__ = ["check_forked_children_beside_the_parent", "exit_codes", "fork_children"]


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


def fork_children(count: int, body: Callable[[int], int], failed: int = 99) -> list[int]:
    """Fork ``count`` children, child ``index`` exiting with ``body(index)``; their pids.

    A child that raises exits with ``failed``. A child never returns into the test: it leaves
    through ``os._exit``, so neither pytest's teardown nor the parent's atexit hooks run twice.
    """
    children = []
    for index in range(count):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through its exit status
            code = failed
            try:
                code = body(index)
            finally:
                os._exit(code)
        children.append(pid)
    return children


def check_forked_children_beside_the_parent(backend: Any, child_cycles: Callable[[int], int], token: str) -> None:
    """Four forked children run ``child_cycles(index)`` (0 when all went well) while the parent
    keeps extending its own lease on ``"parent"`` through ``backend``; then the parent releases.

    A child reports through its exit status only; one still running after a minute is killed.
    """
    assert backend.acquire_fenced("parent", token, 60, "parent") is not None
    children = fork_children(4, lambda index: min(child_cycles(index), 90))
    # Meanwhile the parent keeps using its own connection.
    for cycle in range(100):
        assert backend.is_held("parent", token), cycle
        assert backend.extend("parent", token, 60), cycle
    assert exit_codes(children) == [0, 0, 0, 0]
    assert backend.release("parent", token)
