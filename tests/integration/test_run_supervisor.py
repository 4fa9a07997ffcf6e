"""``lease-lock run`` keeps the command inside its lease: after a loss the whole process group
is killed once ``--grace`` has passed, whatever the group leader did; and a supervisor killed
with SIGKILL takes the command with it (Linux ``PR_SET_PDEATHSIG``).

Real ``python -m lease_lock`` processes and real shell children; every wait is on a file or a
process state with a generous deadline.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from lease_lock.testing import wait_until

from .test_cli import DEADLINE, Cli, alive, backend_url, finish, holder_script


@pytest.fixture
def cli(request: pytest.FixtureRequest, tmp_path: Path) -> Cli:
    return Cli(backend_url("sqlite", request, tmp_path), tmp_path)


@pytest.fixture
def key(request: pytest.FixtureRequest) -> str:
    return f"supervisor-{request.node.name}"


@pytest.fixture
def pids() -> Iterator[list[int]]:
    """Processes a test started indirectly; any still alive at the end are killed."""
    started: list[int] = []
    yield started
    for pid in started:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def _read_pid(path: Path) -> int:
    assert wait_until(lambda: path.exists() and path.read_text().strip().isdigit(), DEADLINE), path
    return int(path.read_text())


def test_after_a_loss_a_member_ignoring_sigterm_is_killed(cli: Cli, key: str, tmp_path: Path, pids: list[int]) -> None:
    member_pid_file = tmp_path / "member.pid"
    # A member of the command's process group that ignores SIGTERM and would run for ten
    # minutes; the group leader (the shell) dies of the SIGTERM at once.
    member = (
        f"{sys.executable} -c \"import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        f"open('{member_pid_file}', 'w').write(str(os.getpid())); time.sleep(600)\""
    )
    supervisor = cli.start("run", key, "--ttl", "6", "--grace", "0.5", "--", "sh", "-c", f"{member} & wait")
    member_pid = _read_pid(member_pid_file)
    pids.append(member_pid)
    assert cli.run("force-release", key, "--yes").returncode == 0
    status, _, stderr = finish(supervisor)
    assert status == 70, stderr
    assert "lost the lock" in stderr
    assert wait_until(lambda: not alive(member_pid), DEADLINE), "the SIGTERM-ignoring member kept running"


def test_after_a_loss_a_leader_that_exits_does_not_shield_its_group(
    cli: Cli, key: str, tmp_path: Path, pids: list[int]
) -> None:
    member_pid_file, go = tmp_path / "member.pid", tmp_path / "go"
    member = (
        f"{sys.executable} -c \"import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        f"open('{member_pid_file}', 'w').write(str(os.getpid())); time.sleep(600)\""
    )
    # The leader traps SIGTERM and exits 0 after it, leaving its member behind.
    leader = f"trap 'exit 0' TERM; {member} & while [ ! -e '{go}' ]; do sleep 0.05; done"
    supervisor = cli.start("run", key, "--ttl", "6", "--grace", "0.5", "--", "sh", "-c", leader)
    member_pid = _read_pid(member_pid_file)
    pids.append(member_pid)
    assert cli.run("force-release", key, "--yes").returncode == 0
    status, _, stderr = finish(supervisor)
    assert status == 70, stderr
    assert wait_until(lambda: not alive(member_pid), DEADLINE), "the member outlived the leader's exit"


def test_a_supervisor_killed_by_sigkill_takes_the_command_with_it(
    cli: Cli, key: str, tmp_path: Path, pids: list[int]
) -> None:
    started, go = tmp_path / "started", tmp_path / "go"
    supervisor = cli.start("run", key, "--", *holder_script(started, go))
    command_pid = _read_pid(started)
    pids.append(command_pid)
    os.kill(supervisor.pid, signal.SIGKILL)
    supervisor.communicate(timeout=DEADLINE)
    assert supervisor.returncode == -signal.SIGKILL
    assert wait_until(lambda: not alive(command_pid), DEADLINE), "the command outlived its supervisor"
    go.touch()
