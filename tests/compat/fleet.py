"""Start and talk to ``fleet_worker`` processes from the mixed-fleet tests."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from lease_lock.testing import wait_until

ROOT = Path(__file__).resolve().parents[2]
#: Generous: the machine is shared, and a correct run answers in well under a second.
EVENT_WAIT = 30.0


class Worker:
    """A ``fleet_worker`` child whose stdout lines arrive on a queue."""

    def __init__(self, *args: str) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.compat.fleet_worker", *args],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.strip())

    def expect(self, prefix: str) -> str:
        """The next line, which must start with ``prefix`` (fails after ``EVENT_WAIT``)."""
        try:
            line = self.lines.get(timeout=EVENT_WAIT)
        except queue.Empty:
            raise AssertionError(f"no {prefix!r} from the worker; stderr: {self.stderr()}") from None
        assert line.startswith(prefix), (line, self.stderr())
        return line

    def send(self, text: str = "go") -> None:
        """Write one line to the worker's stdin."""
        assert self.process.stdin is not None
        self.process.stdin.write(text + "\n")
        self.process.stdin.flush()

    def finish(self) -> None:
        """Wait for a clean exit."""
        assert self.process.wait(timeout=EVENT_WAIT * 2) == 0, self.stderr()

    def stderr(self) -> str:
        if self.process.poll() is None:
            return "(still running)"
        assert self.process.stderr is not None
        return self.process.stderr.read()

    def kill(self) -> None:
        """Stop the worker if it still runs and close its pipes."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)
        self._reader.join(10)  # it ends at the end of stdout; close the pipe only after
        for pipe in (self.process.stdin, self.process.stdout, self.process.stderr):
            if pipe is not None:
                pipe.close()


def blocked_in_blpop(client: Any, count: int = 1) -> bool:
    """``True`` once ``count`` connections of the server sit in ``BLPOP``."""
    return sum(1 for entry in client.client_list() if entry.get("cmd") == "blpop") >= count


def wait_for_blpop(client: Any) -> None:
    """Wait until some connection blocks in ``BLPOP`` (a python-redis-lock waiter)."""
    assert wait_until(lambda: blocked_in_blpop(client), EVENT_WAIT)


def run_loops(url: str, library: str, name: str, count: int) -> None:
    """A real-library and a shim process each take the lock ``count`` times on ``name``."""
    workers = [Worker("loop", library, impl, url, name, str(count)) for impl in ("real", "shim")]
    try:
        for worker in workers:
            worker.expect("done")
            worker.finish()
    finally:
        for worker in workers:
            worker.kill()
