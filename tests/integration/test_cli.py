"""The ``lease-lock`` command, driven as a user would: real ``python -m lease_lock`` processes.

Children are small shell or Python programs that leave marker files, so the tests wait on files
appearing (with generous deadlines) rather than on timing.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Optional

import pytest
from lease_lock.testing import wait_until

DEADLINE = 60.0


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Cli:
    """Runs ``python -m lease_lock`` against one backend URL, in a scratch directory."""

    def __init__(self, url: str, workdir: Path) -> None:
        self.url = url
        self.workdir = workdir
        self.env = dict(os.environ, LEASE_LOCK_URL=url, XDG_STATE_HOME=str(workdir / "state"))
        self.env.pop("LEASE_LOCK_DEBUG", None)
        self.started: list[subprocess.Popen[str]] = []

    def start(
        self, *args: str, stdin: Optional[int] = subprocess.DEVNULL, python: Optional[list[str]] = None
    ) -> subprocess.Popen[str]:
        """``python -m lease_lock ARGS``, or ``python PYTHON ARGS`` (another way into the command)."""
        process = subprocess.Popen(
            [sys.executable, *(python or ["-m", "lease_lock"]), *args],
            env=self.env,
            cwd=self.workdir,
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # A test run started in the background of a script inherits SIGINT ignored, and Python
            # keeps an ignored SIGINT ignored; the command is tested as a terminal starts it.
            preexec_fn=_default_sigint,
        )
        self.started.append(process)
        return process

    def close(self) -> None:
        """Kill what a failed test left running and close its pipes, so no later test inherits them."""
        for process in self.started:
            if process.poll() is None:
                process.kill()
            process.communicate()

    def run(self, *args: str, input: Optional[str] = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "lease_lock", *args],
            env=self.env,
            cwd=self.workdir,
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=DEADLINE,
            check=False,
        )

    def status(self, *keys: str) -> list[dict[str, object]]:
        result = self.run("status", "--json", *keys)
        assert result.returncode == 0, result.stderr
        states: list[dict[str, object]] = json.loads(result.stdout)
        return states


def check_run_hands_rising_fences(url: str, workdir: Path, key: str) -> None:
    """Two ``lease-lock run`` of ``key`` on the store ``url`` names: each child sees its key and
    a fence, the second fence is the larger, and the key is free afterwards."""
    cli = Cli(url, workdir)
    fences = []
    for _ in range(2):
        result = cli.run("run", key, "--", "sh", "-c", 'echo "$LEASE_LOCK_KEY $LEASE_LOCK_FENCE"')
        assert result.returncode == 0, result.stderr
        seen_key, fence = result.stdout.split()
        assert seen_key == key
        fences.append(int(fence))
    assert fences[1] > fences[0]
    assert cli.status(key)[0]["held"] is False


def finish(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=DEADLINE)
    return process.returncode, out, err


def one_line_error(stderr: str) -> str:
    """lease-lock's one line of stderr (a shell child may add its own, e.g. "Terminated")."""
    assert "Traceback" not in stderr
    lines = [line for line in stderr.splitlines() if line.startswith("lease-lock")]
    assert len(lines) == 1, stderr
    return lines[0]


def holder_script(started: Path, go: Path, *, on_term: str = "") -> list[str]:
    """A child that marks itself started, then runs until ``go`` appears (or it is signalled)."""
    trap = f"trap '{on_term}' TERM; " if on_term else ""
    return [
        "sh", "-c",
        f"{trap}echo $$ > '{started}'; while [ ! -e '{go}' ]; do sleep 0.05; done",
    ]


@contextlib.contextmanager
def holding(cli: Cli, key: str, *options: str) -> Iterator[subprocess.Popen[str]]:
    """A ``lease-lock run`` holding ``key`` for the block; it must then finish with status 0."""
    started, go = cli.workdir / "holder-started", cli.workdir / "holder-go"
    holder = cli.start("run", key, *options, "--", *holder_script(started, go))
    try:
        assert wait_until(started.exists, DEADLINE)
        yield holder
    finally:
        go.touch()
    assert finish(holder)[0] == 0


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie left for a reaper that never comes counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def backend_url(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of a backend of kind ``name``: a scratch SQLite file or the session's servers."""
    if name == "redis":
        return str(request.getfixturevalue("redis_server").url)
    if name == "postgres":
        url = str(request.getfixturevalue("postgres_server").url)
        return url + ("&" if "?" in url else "?") + "create_table=true"
    return f"sqlite:///{tmp_path / 'locks.db'}"


@pytest.fixture(params=["sqlite", "redis", "postgres"])
def any_cli(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cli]:
    """The command on each backend, for the behaviours that depend on the backend."""
    cli = Cli(backend_url(request.param, request, tmp_path), tmp_path)
    yield cli
    cli.close()


@pytest.fixture
def cli(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cli]:
    """The command on SQLite, for behaviours of the command itself (signals, errors, ...)."""
    cli = Cli(backend_url("sqlite", request, tmp_path), tmp_path)
    yield cli
    cli.close()


@pytest.fixture
def key(request: pytest.FixtureRequest) -> str:
    return f"cli-{request.node.name}".replace("[", "-").replace("]", "")


# -- running a command -------------------------------------------------------------------------


def test_exit_status_and_environment_reach_the_child(any_cli: Cli, key: str) -> None:
    seen = any_cli.workdir / "seen"
    result = any_cli.run(
        "run", key, "--", "sh", "-c", f'echo "$LEASE_LOCK_KEY $LEASE_LOCK_FENCE" > {seen}; exit 7'
    )
    assert result.returncode == 7, result.stderr
    assert result.stderr == ""
    seen_key, fence = seen.read_text().split()
    assert seen_key == key
    assert 0 < int(fence) < 2**53
    assert any_cli.status(key)[0]["held"] is False  # given back after the child exited


def test_fences_rise_from_run_to_run(any_cli: Cli, key: str) -> None:
    fences = []
    for _ in range(2):
        result = any_cli.run("run", key, "--", "sh", "-c", 'echo "$LEASE_LOCK_FENCE"')
        assert result.returncode == 0, result.stderr
        fences.append(int(result.stdout))
    assert fences[1] > fences[0]


def test_child_killed_by_a_signal_gives_128_plus_n(cli: Cli, key: str) -> None:
    result = cli.run("run", key, "--", "sh", "-c", "kill -KILL $$")
    assert result.returncode == 128 + signal.SIGKILL


def test_options_may_follow_the_key_and_the_command_keeps_its_own(cli: Cli, key: str) -> None:
    result = cli.run(
        "run", key, "--ttl", "5s", "--max-hold", "1h", "--", sys.executable, "-c",
        "import sys; print(sys.argv[1:])", "--ttl", "--", "-x",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['--ttl', '--', '-x']"


def test_missing_command_exits_127(cli: Cli, key: str) -> None:
    result = cli.run("run", key, "--", str(cli.workdir / "no-such-program"))
    assert result.returncode == 127
    assert "command not found" in one_line_error(result.stderr)
    assert cli.status(key)[0]["held"] is False


# -- contention ----------------------------------------------------------------------------------


def test_second_run_is_busy_and_says_so(any_cli: Cli, key: str) -> None:
    with holding(any_cli, key):
        second = any_cli.run("run", key, "--", "sh", "-c", "echo ran")
        assert second.returncode == 75
        assert second.stdout == ""
        line = one_line_error(second.stderr)
        assert repr(key) in line
        assert "busy" in line
        custom = any_cli.run("run", key, "--busy-exit", "0", "--", "sh", "-c", "echo ran")
        assert custom.returncode == 0
        assert custom.stdout == ""
        timed_out = any_cli.run(
            "run", key, "--wait", "--timeout", "0.3", "--", "sh", "-c", "echo ran"
        )
        assert timed_out.returncode == 75
        assert timed_out.stdout == ""


def telling_its_first_refusal() -> list[str]:
    """Python code (for ``python -c``) that runs the command and prints ``refused`` once its first
    attempt finds the key held: a test then knows the command is waiting, not still starting."""
    return [
        "-c",
        "import logging, sys\n"
        "class Tell(logging.Handler):\n"
        "    def emit(self, record):\n"
        "        if ' contended ' in record.getMessage():\n"
        "            print('refused', flush=True)\n"
        "            logging.getLogger('lease_lock').removeHandler(self)\n"
        "logging.getLogger('lease_lock').addHandler(Tell())\n"
        "logging.getLogger('lease_lock').setLevel(logging.DEBUG)\n"
        "from lease_lock.__main__ import main\n"
        "sys.exit(main())\n",
    ]


def test_second_run_waits_for_the_key(any_cli: Cli, key: str) -> None:
    ran = any_cli.workdir / "ran"
    with holding(any_cli, key):
        second = any_cli.start(
            "run", key, "--wait", "--", "sh", "-c", f"echo > {ran}", python=telling_its_first_refusal()
        )
        assert second.stdout is not None
        # It is waiting, not running: its first attempt found the key held.
        assert second.stdout.readline() == "refused\n"
        assert second.poll() is None and not ran.exists()
    code, _, err = finish(second)
    assert code == 0, err
    assert ran.exists()
    # One line says it had to wait; a key free at once says nothing.
    assert re.fullmatch(rf"lease-lock: waited \d+\.\ds for {re.escape(repr(key))}", one_line_error(err))
    free = any_cli.run("run", key, "-w", "30", "--", "true")
    assert free.returncode == 0 and free.stderr == ""


# -- loss, signals -------------------------------------------------------------------------------


def test_lost_lock_stops_the_child(any_cli: Cli, key: str) -> None:
    started, go = any_cli.workdir / "started", any_cli.workdir / "go"
    termed = any_cli.workdir / "termed"
    holder = any_cli.start(
        "run", key, "--ttl", "6", "--grace", "30", "--",
        *holder_script(started, go, on_term=f"echo > {termed}; exit 0"),
    )
    assert wait_until(started.exists, DEADLINE)
    # A third process drops the key; the holder's next heartbeat is refused.
    dropped = any_cli.run("force-release", key, "--yes")
    assert dropped.returncode == 0, dropped.stderr
    code, _, err = finish(holder)
    assert code == 70
    assert termed.exists()
    assert "the key was force-released or taken by another holder" in one_line_error(err)
    assert not go.exists()


def test_child_ignoring_sigterm_is_killed_with_its_group(cli: Cli, key: str) -> None:
    started, go = cli.workdir / "started", cli.workdir / "go"
    grandchild = cli.workdir / "grandchild"
    script = (
        f"trap '' TERM; sleep 120 & echo $! > {grandchild}; echo $$ > {started}; "
        f"while [ ! -e {go} ]; do sleep 0.05; done"
    )
    holder = cli.start(
        "run", key, "--ttl", "6", "--grace", "0.5", "--lost-exit", "9", "--", "sh", "-c", script
    )
    assert wait_until(started.exists, DEADLINE)
    assert cli.run("force-release", key, "--yes").returncode == 0
    code, _, err = finish(holder)
    assert code == 9
    assert "SIGKILL" in one_line_error(err)
    # The whole job is stopped, not only its first process.
    assert wait_until(lambda: not alive(int(started.read_text())), DEADLINE)
    assert wait_until(lambda: not alive(int(grandchild.read_text())), DEADLINE)


@pytest.mark.parametrize(
    ("signum", "on_signal", "expected"),
    [
        (signal.SIGTERM, "exit 0", 0),
        (signal.SIGINT, "", 128 + signal.SIGINT),
        (signal.SIGHUP, "exit 4", 4),
    ],
)
def test_signals_are_forwarded_and_the_key_released(
    cli: Cli, key: str, signum: int, on_signal: str, expected: int
) -> None:
    started, go = cli.workdir / "started", cli.workdir / "go"
    name = signal.Signals(signum).name[3:]
    handler = f"trap '{on_signal}' {name}; " if on_signal else f"trap - {name}; "
    script = f"{handler}echo $$ > {started}; while [ ! -e {go} ]; do sleep 0.05; done"
    # Under sh -c, SIGINT is only ever ignored in background jobs; `trap -` restores the default.
    holder = cli.start("run", key, "--", "sh", "-c", script)
    assert wait_until(started.exists, DEADLINE)
    assert cli.status(key)[0]["held"] is True
    holder.send_signal(signum)
    code, _, err = finish(holder)
    assert code == expected, err
    assert cli.status(key)[0]["held"] is False


def catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler of its own for ``signum`` (Linux's SigCgt mask)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as handle:
        caught = next(line for line in handle if line.startswith("SigCgt:")).split()[1]
    return bool(int(caught, 16) & 1 << (signum - 1))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_while_waiting_runs_nothing(cli: Cli, key: str, signum: int) -> None:
    ran = cli.workdir / "ran"
    with holding(cli, key):
        waiter = cli.start("run", key, "--wait", "--", "sh", "-c", f"echo > {ran}")
        # SIGHUP is only ever caught by run's own handlers: it is waiting for the key, or about to.
        assert wait_until(lambda: waiter.poll() is None and catches(waiter.pid, signal.SIGHUP), DEADLINE)
        waiter.send_signal(signum)
        code, _, err = finish(waiter)
        assert code == 128 + signum, err
        assert "interrupted" in one_line_error(err)
        assert not ran.exists()


def console_script() -> str:
    """The ``module:function`` that the installed ``lease-lock`` script calls (from setup.cfg)."""
    text = (Path(__file__).parents[2] / "setup.cfg").read_text(encoding="utf-8")
    match = re.search(r"^\s*lease-lock\s*=\s*([\w.]+:\w+)\s*$", text, flags=re.MULTILINE)
    assert match is not None, "no lease-lock console script in setup.cfg"
    return match.group(1)


def held_at_the_heavy_import(entry: str) -> list[str]:
    """Python code (for ``python -c``) that enters the command as ``entry`` does, and stops it
    when it starts importing ``lease_lock.cli``: it prints ``importing`` and waits for a signal."""
    if entry == "console script":
        module, function = console_script().split(":")
        start = f"from {module} import {function} as main; sys.exit(main())"
    else:
        start = "import runpy; runpy.run_module('lease_lock', run_name='__main__', alter_sys=True)"
    return [
        "-c",
        "import sys, time\n"
        "class Gate:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'lease_lock.cli':\n"
        "            sys.meta_path.remove(self)\n"
        "            print('importing', flush=True)\n"
        "            while True: time.sleep(60)\n"
        "sys.meta_path.insert(0, Gate())\n"
        f"{start}\n",
    ]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("entry", ["console script", "python -m"])
def test_a_signal_while_the_command_still_imports_gives_one_line(
    cli: Cli, key: str, entry: str, signum: int
) -> None:
    ran = cli.workdir / "ran"
    starting = cli.start("run", key, "--", "sh", "-c", f"echo > {ran}", python=held_at_the_heavy_import(entry))
    assert starting.stdout is not None
    assert starting.stdout.readline() == "importing\n"
    starting.send_signal(signum)
    code, _, err = finish(starting)
    assert code == 128 + signum, err
    assert one_line_error(err) == f"lease-lock: interrupted by {signal.Signals(signum).name}"
    assert not ran.exists()


# -- status and force-release ----------------------------------------------------------------------


def test_status_json(any_cli: Cli, key: str) -> None:
    with holding(any_cli, key, "--ttl", "40"):
        held, free = any_cli.status(key, f"{key}-free")
        text = any_cli.run("status", key)
    assert set(held) == {"key", "held", "expires_at", "expires_in", "fence", "owner", "limit", "holders"}
    assert held["key"] == key
    assert held["held"] is True
    assert isinstance(held["fence"], int)
    assert held["fence"] > 0
    assert isinstance(held["owner"], str)
    assert held["owner"].endswith(" sh")
    # An exclusive key's one holder is the key's own fields.
    assert held["limit"] == 1
    assert held["holders"] == [{name: held[name] for name in ("owner", "fence", "expires_at", "expires_in")}]
    assert isinstance(held["expires_in"], float)
    assert 0 < held["expires_in"] <= 40
    assert isinstance(held["expires_at"], str)
    expires_at = datetime.fromisoformat(held["expires_at"].replace("Z", "+00:00"))
    assert expires_at.utcoffset() is not None
    assert free == {
        "key": f"{key}-free", "held": False, "expires_at": None, "expires_in": None,
        "fence": None, "owner": None, "limit": 1, "holders": [],
    }
    assert text.returncode == 0
    assert text.stdout.startswith(f"{key}: held by ")
    assert f"fence {held['fence']}" in text.stdout


def test_force_release_asks_first(any_cli: Cli, key: str) -> None:
    started, go = any_cli.workdir / "started", any_cli.workdir / "go"
    holder = any_cli.start("run", key, "--ttl", "6", "--", *holder_script(started, go))
    assert wait_until(started.exists, DEADLINE)
    declined = any_cli.run("force-release", key, input="n\n")
    assert declined.returncode == 1
    assert "force-release" in declined.stderr
    assert any_cli.status(key)[0]["held"] is True
    closed_stdin = any_cli.run("force-release", key)
    assert closed_stdin.returncode == 1
    assert any_cli.status(key)[0]["held"] is True
    accepted = any_cli.run("force-release", key, input="y\n")
    assert accepted.returncode == 0, accepted.stderr
    assert accepted.stdout.strip() == f"{key}: released"
    assert finish(holder)[0] == 70
    again = any_cli.run("force-release", key, "--yes")
    assert again.returncode == 0
    assert "nothing to release" in again.stdout


# -- errors and defaults -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "k", "--ttl", "soon", "--", "true"], "--ttl must look like"),
        (["run", "k", "--ttl", "0", "--", "true"], "--ttl must be > 0"),
        (["run", "k", "--max-hold", "-1h", "--", "true"], "--max-hold"),
        (["run", "k", "--busy-exit", "300", "--", "true"], "--busy-exit must be an exit status"),
        (["run", "k", "-n", "--timeout", "5", "--", "true"], "--nonblock is one attempt"),
        (["run", "k", "true"], "put the command after --"),
        (["run", "k", "--"], "KEY and COMMAND are required"),
        (["run", "--", "true"], "KEY"),
        (["run", "k", "--bogus", "--", "true"], "unrecognized arguments: --bogus"),
        (["run", "k", "--url", "nope://x", "--", "true"], "unknown URL scheme 'nope'"),
        (["run", "k", "--url", "sqlite://host/x.db", "--", "true"], "names a host"),
        (["status", "k" * 1100], "at most 1024 allowed"),
        (["status", "k", "--url", "sqlite:///x.db?bad=1"], "unknown sqlite URL option"),
        (["frobnicate"], "invalid choice"),
        ([], "required"),
    ],
)
def test_usage_errors_exit_2_with_one_line(cli: Cli, args: list[str], message: str) -> None:
    result = cli.run(*args)
    assert result.returncode == 2
    assert message in one_line_error(result.stderr)
    assert result.stdout == ""


def test_unreachable_backend_exits_69(cli: Cli, key: str, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'missing-dir' / 'locks.db'}"
    for args in (["run", key, "--url", url, "--", "true"], ["status", key, "--url", url]):
        result = cli.run(*args)
        assert result.returncode == 69
        assert "backend unavailable" in one_line_error(result.stderr)


def test_version(cli: Cli) -> None:
    import lease_lock

    result = cli.run("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"lease-lock {lease_lock.__version__}"


def test_embedded_default_without_any_url(tmp_path: Path) -> None:
    cli = Cli("unused", tmp_path)
    del cli.env["LEASE_LOCK_URL"]
    result = cli.run("run", "nightly", "--", "sh", "-c", "echo $LEASE_LOCK_FENCE")
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) > 0
    assert (tmp_path / "state" / "lease-lock" / "locks.db").is_file()


def test_max_hold_stops_the_command(cli: Cli, key: str) -> None:
    started, go = cli.workdir / "started", cli.workdir / "go"
    holder = cli.start(
        "run", key, "--max-hold", "1", "--ttl", "30", "--", *holder_script(started, go)
    )
    assert wait_until(started.exists, DEADLINE)
    code, _, err = finish(holder)
    assert code == 70
    assert "held for the longest time allowed" in one_line_error(err)
    assert not go.exists()
