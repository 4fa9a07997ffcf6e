"""Leader election across real processes on a real Redis server.

Three candidate processes campaign for one key. The leader writes to a fenced resource (an
SQLite file that refuses a write whose fence is lower than the last accepted one) every few
milliseconds while ``is_leader`` reads true, and every candidate reports on stdout when it is
elected, revoked, or when the resource refused one of its writes. A refused write from a
candidate that still believed it was leader would mean two leaders at once; the accepted
history shows who wrote when.

Run as a script, this module is one candidate (see :func:`candidate`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: The generous limit of every wait; the contract bounds are asserted separately.
LIMIT = 60.0
LOST_REASONS = {"expired", "extend", "late-extend", "extend-failed"}

pytestmark = pytest.mark.slow


# -- the candidate process -------------------------------------------------------------------


def candidate(url: str, key: str, resource_path: str, ttl: float) -> None:
    """One candidate: campaign, write while leader, obey ``resign`` and ``stop`` on stdin."""
    sys.path.insert(0, str(ROOT))
    import lease_lock
    from benchmarks.chaos_harness.resource import SqliteResource

    pid = str(os.getpid())
    out = threading.Lock()

    def say(event: str, **fields: Any) -> None:
        with out:
            print(json.dumps({"event": event, "at": time.time(), **fields}), flush=True)

    # The callbacks run on the campaign thread; sqlite3 connections belong to one thread.
    late_writer = SqliteResource(resource_path)
    elected_fence: list[int] = []

    def on_elected(lock: lease_lock.Lock) -> None:
        assert lock.fence is not None
        elected_fence.append(lock.fence)
        say("elected", fence=lock.fence)

    def on_revoked(reason: str) -> None:
        say("revoked", reason=reason)
        if reason in LOST_REASONS:
            # Work that was in flight when the process stalled: it still carries the old fence.
            accepted = late_writer.write(key, elected_fence[-1], pid, -1)
            say("late-write", fence=elected_fence[-1], accepted=accepted)

    locker = lease_lock.connect(url, fencing=True, ttl=ttl)
    leadership = locker.elect(key, on_elected=on_elected, on_revoked=on_revoked)

    stop = threading.Event()

    def commands() -> None:
        for line in sys.stdin:
            if line.strip() == "resign":
                leadership.resign()
                say("resigned")
            elif line.strip() == "stop":
                stop.set()

    threading.Thread(target=commands, daemon=True).start()
    say("ready")
    resource = SqliteResource(resource_path)
    seq = 0
    while True:
        fence = leadership.fence
        if fence is not None:
            seq += 1
            if not resource.write(key, fence, pid, seq):
                say("refused", fence=fence, seq=seq)
        if stop.is_set():
            # The whole process stops (every thread, wherever it is), but never inside a write
            # to the resource: a process stopped there would keep the file's write lock, and
            # nobody, successor included, could write until it resumed.
            stop.clear()
            say("stopping")
            os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(0.02)


# -- the test side ---------------------------------------------------------------------------


class Candidate:
    """A candidate process and the events it printed."""

    def __init__(self, url: str, key: str, resource_path: Path, ttl: float) -> None:
        self.process = subprocess.Popen(
            [sys.executable, __file__, url, key, str(resource_path), str(ttl)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
        )
        self.pid = self.process.pid
        self.events: list[dict[str, Any]] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._changed:
                self.events.append(json.loads(line))
                self._changed.notify_all()

    def of(self, event: str) -> list[dict[str, Any]]:
        with self._changed:
            return [record for record in self.events if record["event"] == event]

    def wait_for(self, event: str) -> dict[str, Any]:
        """The first event of that kind; fails after ``LIMIT``."""
        with self._changed:
            found = self._changed.wait_for(lambda: any(r["event"] == event for r in self.events), LIMIT)
            assert found, f"candidate {self.pid} printed no {event!r} (got {self.events})"
            return next(r for r in self.events if r["event"] == event)

    def pause(self) -> None:
        """Have the process stop itself (SIGSTOP) between two writes; return once it is stopped."""
        self.send("stop")
        self.wait_for("stopping")
        deadline = time.monotonic() + LIMIT
        # /proc/<pid>/stat: the state follows the parenthesised command name; "T" is stopped.
        while Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
            assert time.monotonic() < deadline, f"candidate {self.pid} did not stop"
            time.sleep(0.01)

    def send(self, command: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
        self.process.wait(timeout=LIMIT)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()


def wait_any(candidates: list[Candidate], event: str, what: str) -> Candidate:
    """The first of ``candidates`` to print ``event``."""
    deadline = time.monotonic() + LIMIT
    while time.monotonic() < deadline:
        for one in candidates:
            if one.of(event):
                return one
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def accepted_writes(resource_path: Path) -> list[tuple[int, str]]:
    """Accepted leader writes in acceptance order: ``(fence, pid)``; late writes excluded."""
    from benchmarks.chaos_harness.resource import SqliteResource

    resource = SqliteResource(str(resource_path))
    try:
        return [(fence, hold) for _, _, fence, hold, seq in resource.history() if seq >= 0]
    finally:
        resource.close()


def assert_one_leader_at_a_time(writes: list[tuple[int, str]]) -> None:
    """Each fence belongs to one process and accepted fences only rise, so the writes of two
    terms never interleave."""
    owners: dict[int, str] = {}
    for fence, pid in writes:
        assert owners.setdefault(fence, pid) == pid, f"fence {fence} used by two processes"
    fences = [fence for fence, _ in writes]
    assert fences == sorted(fences)


def wait_writes_by(resource_path: Path, pid: int, count: int) -> None:
    deadline = time.monotonic() + LIMIT
    while sum(1 for _, hold in accepted_writes(resource_path) if hold == str(pid)) < count:
        assert time.monotonic() < deadline, f"leader {pid} made fewer than {count} writes"
        time.sleep(0.05)


@pytest.fixture
def election(redis_server: Any, tmp_path: Path) -> Iterator[Callable[[float], tuple[list[Candidate], Path]]]:
    """Starts three candidates on a fresh key and resource; stops them at the end."""
    from benchmarks.chaos_harness.resource import SqliteResource

    started: list[Candidate] = []

    def start(ttl: float) -> tuple[list[Candidate], Path]:
        key = f"leader-{uuid.uuid4().hex}"
        path = tmp_path / "resource.db"
        resource = SqliteResource(str(path))
        resource.setup([key])
        resource.close()
        for _ in range(3):
            started.append(Candidate(redis_server.url, key, path, ttl))
        for one in started:
            one.wait_for("ready")
        return started, path

    yield start
    for one in started:
        one.stop()


def test_sigkill_of_the_leader_elects_another(election: Any) -> None:
    ttl = 4.0
    candidates, path = election(ttl)
    leader = wait_any(candidates, "elected", "a first leader")
    wait_writes_by(path, leader.pid, 10)
    standbys = [one for one in candidates if one is not leader]
    assert all(not one.of("elected") for one in standbys)
    old_fence = leader.of("elected")[0]["fence"]
    leader.process.kill()
    leader.process.wait(timeout=LIMIT)
    # Elected once the dead leader's lease runs out (how soon is a matter for a loaded machine's
    # scheduler, not for this test): with a new fence, and writing.
    successor = wait_any(standbys, "elected", "a successor")
    assert successor.of("elected")[0]["fence"] > old_fence
    wait_writes_by(path, successor.pid, 10)
    other = next(one for one in standbys if one is not successor)
    assert not other.of("elected")
    assert all(not one.of("refused") for one in candidates), "two candidates believed they led at once"
    assert_one_leader_at_a_time(accepted_writes(path))


def test_sigstop_past_the_ttl_revokes_on_resume_and_late_writes_are_refused(election: Any) -> None:
    ttl = 4.0
    candidates, path = election(ttl)
    leader = wait_any(candidates, "elected", "a first leader")
    old_fence = leader.of("elected")[0]["fence"]
    wait_writes_by(path, leader.pid, 10)
    leader.pause()
    standbys = [one for one in candidates if one is not leader]
    successor = wait_any(standbys, "elected", "a successor while the leader is stopped")
    assert successor.of("elected")[0]["fence"] > old_fence
    wait_writes_by(path, successor.pid, 10)
    leader.process.send_signal(signal.SIGCONT)
    revoked = leader.wait_for("revoked")
    assert revoked["reason"] in LOST_REASONS
    late = leader.wait_for("late-write")
    assert (late["fence"], late["accepted"]) == (old_fence, False)
    # Any write the stalled leader had already started when it stopped was refused too.
    assert all(record["fence"] == old_fence for record in leader.of("refused"))
    assert all(not one.of("refused") for one in standbys)
    writes = accepted_writes(path)
    first_by_successor = next(i for i, (_, pid) in enumerate(writes) if pid == str(successor.pid))
    assert all(pid != str(leader.pid) for _, pid in writes[first_by_successor:])
    assert_one_leader_at_a_time(writes)
    # The old leader campaigns again and stands by.
    assert len(leader.of("elected")) == 1


def test_resign_hands_over_at_once(election: Any) -> None:
    # A lease longer than the test may run (pytest's timeout): a successor got the key from
    # resign(), never from the lease running out, however slowly a loaded machine goes.
    ttl = 600.0
    candidates, path = election(ttl)
    leader = wait_any(candidates, "elected", "a first leader")
    wait_writes_by(path, leader.pid, 5)
    leader.send("resign")
    standbys = [one for one in candidates if one is not leader]
    successor = wait_any(standbys, "elected", "a successor after resign()")
    elected = successor.of("elected")[0]
    revoked = leader.wait_for("revoked")
    assert revoked["reason"] == "resigned"
    assert revoked["at"] <= elected["at"], "the old leader stops before the new one starts"
    assert not leader.of("late-write")
    wait_writes_by(path, successor.pid, 5)
    assert all(not one.of("refused") for one in candidates)
    assert_one_leader_at_a_time(accepted_writes(path))


if __name__ == "__main__":
    candidate(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]))
