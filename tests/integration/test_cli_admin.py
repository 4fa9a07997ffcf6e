"""``lease-lock ls`` and ``lease-lock force-release --prefix`` on real stores, with the locks
held by real processes, and the command read as a person meets it (a pty for the waiting line).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lease_lock.testing import wait_until
from lease_lock.validation import escape_text

from tests.integration.test_cli import DEADLINE, Cli, backend_url, finish, holder_script

STATUS_FIELDS = {"key", "held", "expires_at", "expires_in", "fence", "owner", "limit", "holders"}

HOLDER = textwrap.dedent(
    """
    import pathlib, sys, time
    from lease_lock import connect

    url, owner, ready, go, *keys = sys.argv[1:]
    locker = connect(url, owner=owner, ttl=30, fencing=True)
    locks = [locker.acquire(key, timeout=60) for key in keys]
    pathlib.Path(ready).touch()
    while not pathlib.Path(go).exists():
        time.sleep(0.05)
    for lock in locks:
        lock.release()  # False for a lock that was force-released meanwhile
    locker.close()
    """
)


class Holders:
    """Real processes, each holding its share of the keys until ``stop``."""

    def __init__(self, cli: Cli, shares: dict[str, list[str]]) -> None:
        self.cli = cli
        script = cli.workdir / "holder.py"
        script.write_text(HOLDER)
        self.go = cli.workdir / f"go-{uuid.uuid4().hex[:6]}"
        self.processes: list[subprocess.Popen[str]] = []
        readies = []
        for owner, keys in shares.items():
            ready = cli.workdir / f"ready-{owner}-{uuid.uuid4().hex[:6]}"
            readies.append(ready)
            self.processes.append(
                subprocess.Popen(
                    [sys.executable, str(script), cli.url, owner, str(ready), str(self.go), *keys],
                    env=cli.env, cwd=cli.workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                )
            )
        assert wait_until(lambda: all(ready.exists() for ready in readies), DEADLINE), self.errors()

    def errors(self) -> str:
        ended = [process for process in self.processes if process.poll() is not None]
        return "".join(process.stderr.read() for process in ended if process.stderr)

    def stop(self) -> None:
        self.go.touch()
        for process in self.processes:
            _, err = process.communicate(timeout=DEADLINE)
            assert process.returncode == 0, err


@pytest.fixture(params=["sqlite", "redis", "postgres", "http"])
def store_cli(request: pytest.FixtureRequest, tmp_path: Path) -> Cli:
    if request.param == "http":
        service = request.getfixturevalue("lock_service")
        cli = Cli(service.url, tmp_path)
        cli.env["LEASE_LOCK_API_KEY"] = service.keys["alpha"]
        return cli
    return Cli(backend_url(request.param, request, tmp_path), tmp_path)


@pytest.fixture
def prefix() -> str:
    # Only characters the HTTP service accepts in keys, so every store takes the same names.
    return f"ops.{uuid.uuid4().hex[:8]}."


def test_ls_lists_exactly_the_locks_of_three_processes(store_cli: Cli, prefix: str) -> None:
    keys = [f"{prefix}job-{number:02d}" for number in range(50)]
    shares = {f"worker-{index}": keys[index::3] for index in range(3)}
    owner_of = {key: owner for owner, share in shares.items() for key in share}
    started = time.monotonic()
    holders = Holders(store_cli, shares)
    outside = Holders(store_cli, {"outsider": [f"{prefix[:-1]}x.job-00", f"other.{prefix}job-00"]})
    # Every key is held by now (Holders waits for each process to say so). Held this much
    # longer, HELD FOR cannot be a lease's age confused with zero, however slow the start was:
    # the time that passes is the subject here, not a guess at when something happened.
    time.sleep(1.5)
    try:
        listed = store_cli.run("ls", prefix, "--json")
        assert listed.returncode == 0, listed.stderr
        states = json.loads(listed.stdout)
        assert [state["key"] for state in states] == sorted(keys)
        assert {state["key"]: state["owner"] for state in states} == owner_of
        for state in states:
            assert set(state) == STATUS_FIELDS
            assert state["held"] is True and isinstance(state["fence"], int)
            assert 0 < state["expires_in"] <= 30

        table = store_cli.run("ls", prefix)
        listed_by = time.monotonic() - started
        assert table.returncode == 0, table.stderr
        header, *rows = table.stdout.splitlines()
        assert header.split() == ["KEY", "OWNER", "FENCE", "HELD", "FOR", "EXPIRES", "IN"]
        assert [row.split()[0] for row in rows] == sorted(keys)
        columns = [header.index(name) for name in ("OWNER", "FENCE", "HELD FOR", "EXPIRES IN")]
        for row in rows:
            key, owner, fence, held_for, expires_in = row.split()
            assert owner == owner_of[key]
            found = [row.index(owner, len(key)), row.index(fence, columns[1]), row.index(held_for, columns[2])]
            assert found == columns[:3]
            # The fence dates the grant: at least the pause above, at most since the holders began.
            assert 1.0 <= _seconds(held_for) <= listed_by + 1.0, row
            assert expires_in.endswith("s")

        everything = json.loads(store_cli.run("ls", "--json").stdout)
        assert set(keys) <= {state["key"] for state in everything}
    finally:
        holders.stop()
        outside.stop()
    after = store_cli.run("ls", prefix)
    assert after.returncode == 0 and after.stdout.strip() == f"no held keys under {prefix!r}"


def _seconds(text: str) -> float:
    """A duration as ``ls`` writes it (``4.6s``, ``12s``, ``5m03s``) in seconds."""
    minutes, _, seconds = text.rstrip("s").rpartition("m")
    return float(minutes or 0) * 60 + float(seconds)


SPECIAL = ["*", "%", "_", "[", "?", "\\"]


@pytest.fixture(params=["sqlite", "redis", "postgres"])
def any_cli(request: pytest.FixtureRequest, tmp_path: Path) -> Cli:
    return Cli(backend_url(request.param, request, tmp_path), tmp_path)


def test_prefix_release_takes_glob_and_like_characters_literally(any_cli: Cli, prefix: str) -> None:
    # For each special character c: "job<c>1" and "job<c>2" are under the prefix "job<c>";
    # "jobX<c>" and "jobc1" only look alike (a glob, LIKE or regex reading would match them).
    keys = {c: [f"{prefix}job{c}1", f"{prefix}job{c}2"] for c in SPECIAL}
    lookalikes = [f"{prefix}jobX1", f"{prefix}job", f"{prefix}jo", f"{prefix}jobab1", f"{prefix}job.1"]
    every = [key for pair in keys.values() for key in pair] + lookalikes
    holders = Holders(any_cli, {"a": every[::2], "b": every[1::2]})
    try:
        remaining = set(every)
        for c in SPECIAL:
            result = any_cli.run("force-release", "--prefix", f"{prefix}job{c}", "--yes")
            assert result.returncode == 0, result.stderr
            assert result.stdout.splitlines()[-1] == f"released 2 key(s) under {prefix + 'job' + c!r}"
            for key in keys[c]:
                assert escape_text(key) in result.stdout  # "\\" is written doubled in the table
            remaining -= set(keys[c])
            listed = json.loads(any_cli.run("ls", prefix, "--json").stdout)
            assert {state["key"] for state in listed} == remaining
        assert remaining == set(lookalikes)
        none_left = any_cli.run("force-release", "--prefix", f"{prefix}job*", "--yes")
        assert none_left.returncode == 0 and "nothing released" in none_left.stdout
    finally:
        holders.stop()


def test_prefix_release_asks_once_and_refuses_without_an_answer(any_cli: Cli, prefix: str) -> None:
    holders = Holders(any_cli, {"a": [f"{prefix}a", f"{prefix}b"], "b": [f"{prefix[:-1]}-c"]})
    try:
        declined = any_cli.run("force-release", "--prefix", prefix, input="n\n")
        assert declined.returncode == 1
        assert declined.stderr.count("[y/N]") == 1 and "nothing released" in declined.stderr
        assert f"{prefix}a" in declined.stdout and f"{prefix}b" in declined.stdout
        no_answer = any_cli.run("force-release", "--prefix", prefix)
        assert no_answer.returncode == 1
        assert "no answer on stdin" in no_answer.stderr and "--yes" in no_answer.stderr
        assert len(json.loads(any_cli.run("ls", prefix, "--json").stdout)) == 2
        accepted = any_cli.run("force-release", "--prefix", prefix, input="y\n")
        assert accepted.returncode == 0, accepted.stderr
        assert accepted.stdout.splitlines()[-1] == f"released 2 key(s) under {prefix!r}"
        assert json.loads(any_cli.run("ls", prefix, "--json").stdout) == []
        assert [s["key"] for s in json.loads(any_cli.run("ls", prefix[:-1], "--json").stdout)] == [f"{prefix[:-1]}-c"]
    finally:
        holders.stop()


def test_force_release_usage(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    cli = Cli(backend_url("sqlite", request, tmp_path), tmp_path)
    for args in (["force-release"], ["force-release", "k", "--prefix", "k"]):
        result = cli.run(*args)
        assert result.returncode == 2 and "either KEY or --prefix" in result.stderr
    empty = cli.run("force-release", "--prefix", "", "--yes")
    assert empty.returncode == 2 and "must not be empty" in empty.stderr


def test_ls_on_a_store_that_cannot_list_is_one_line_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import dataclasses
    import importlib

    from lease_lock import Locker, cli
    from lease_lock.backends.memory import MemoryBackend

    class NoScan(MemoryBackend):
        capabilities = dataclasses.replace(MemoryBackend.capabilities, scan=False)

    def connect(url: str, **options: Any) -> Locker:
        return Locker(NoScan(), **options)

    monkeypatch.setattr(importlib.import_module("lease_lock.connect"), "connect", connect)
    assert cli.main(["ls", "--url", "memory://"]) == 2
    assert cli.main(["force-release", "--prefix", "a", "--yes", "--url", "memory://"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["lease-lock: the NoScan store cannot list its keys; use status KEY... instead"] * 2


# -- the command as a person meets it -------------------------------------------------------------


def test_busy_message_says_the_holder_renews_its_lease(any_cli: Cli, prefix: str) -> None:
    key = f"{prefix}busy"
    started, go = any_cli.workdir / "started", any_cli.workdir / "go"
    holder = any_cli.start("run", key, "--", *holder_script(started, go))
    try:
        assert wait_until(started.exists, DEADLINE)
        busy = any_cli.run("run", key, "--", "true")
        assert busy.returncode == 75
        assert "lease renewed by its holder; current lease ends in " in busy.stderr
        assert "expires in" not in busy.stderr
        quiet = any_cli.run("run", "-q", "-E", "3", key, "--", "true")
        assert (quiet.returncode, quiet.stderr) == (3, "")
        status = any_cli.run("status", key)
        assert "lease renewed by its holder" in status.stdout
    finally:
        go.touch()
    assert finish(holder)[0] == 0


def read_until(fd: int, needle: bytes, deadline: float) -> bytes:
    seen = b""
    end = time.monotonic() + deadline
    while needle not in seen and time.monotonic() < end:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    return seen


def set_width(fd: int, columns: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))


@pytest.fixture
def terminal() -> Iterator[tuple[int, int]]:
    parent, child = pty.openpty()
    set_width(child, 200)
    yield parent, child
    for fd in (parent, child):
        with contextlib.suppress(OSError):
            os.close(fd)


def test_waiting_line_on_a_terminal_only(
    terminal: tuple[int, int], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    cli = Cli(backend_url("sqlite", request, tmp_path), tmp_path)
    started, go = tmp_path / "started", tmp_path / "go"
    holder = cli.start("run", "report", "--", *holder_script(started, go))
    assert wait_until(started.exists, DEADLINE)
    parent, child = terminal
    waiter = subprocess.Popen(
        [sys.executable, "-m", "lease_lock", "run", "report", "-w", "1h", "--", "echo", "ran"],
        env=cli.env, cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=child,
    )
    try:
        shown = read_until(parent, b"\xe2\x80\xa6", DEADLINE).decode()
        assert "lease-lock: waiting for 'report' (" in shown
        assert "held by " in shown and " sh, lease renewed by its holder" in shown
        assert "\n" not in shown, "one line, redrawn in place"
        # On a narrow terminal the line is cut to fit, so that it can still be redrawn in place.
        set_width(child, 40)
        end = time.monotonic() + DEADLINE
        drawn = ""
        while time.monotonic() < end and not 0 < len(drawn) <= 40:
            # Draws made before the resize may still be in the pty's buffer: read on.
            drawn = read_until(parent, b"\xe2\x80\xa6", DEADLINE).decode().split("\r\x1b[K")[-1]
        assert drawn.startswith("lease-lock: waiting for 'r") and len(drawn) <= 40, drawn
        go.touch()
        out, _ = waiter.communicate(timeout=DEADLINE)
        assert waiter.returncode == 0 and out == b"ran\n"
        # The line is erased when the wait ends; one lasting line says how long it took.
        assert re.search(rb"\r\x1b\[Klease-lock: waited \d+\.\ds for 'report'\r\n$", drain(parent))
    finally:
        go.touch()
        if waiter.poll() is None:
            waiter.kill()
    assert finish(holder)[0] == 0

    # Not a terminal, or -q on one: a wait that runs out (so it surely waited) draws nothing.
    go.unlink()
    started.unlink()
    holder = cli.start("run", "report", "--", *holder_script(started, go))
    try:
        assert wait_until(started.exists, DEADLINE)
        piped = cli.run("run", "report", "-w", "1", "--", "true")
        assert piped.returncode == 75
        assert "waiting" not in piped.stderr and "\r" not in piped.stderr
        assert piped.stderr.startswith("lease-lock: 'report' is busy (held by ")
        quiet = subprocess.run(
            [sys.executable, "-m", "lease_lock", "run", "-q", "report", "-w", "1", "--", "true"],
            env=cli.env, cwd=tmp_path, stdin=subprocess.DEVNULL, stderr=child, timeout=DEADLINE, check=False,
        )
        assert quiet.returncode == 75
        assert drain(parent) == b""
    finally:
        go.touch()
    assert finish(holder)[0] == 0


def drain(fd: int) -> bytes:
    """What a pty holds now (its writers are done)."""
    seen = b""
    while select.select([fd], [], [], 0.2)[0]:
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        seen += chunk
    return seen


def test_run_help_and_usage(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    cli = Cli(backend_url("sqlite", request, tmp_path), tmp_path)
    text = cli.run("run", "--help").stdout
    assert "usage: lease-lock run KEY [options] -- COMMAND [ARGS...]" in text
    for status in ("75", "70", "69", "2 ", "126, 127", "128+N"):
        assert f"\n  {status}" in text
    assert "1h30m" in text and "-w DURATION, --timeout DURATION" in text
    assert "-n, --nonblock" in text and "-E CODE, --busy-exit CODE" in text and "--api-key" in text
    bare = cli.run("run")
    assert bare.returncode == 2
    usage = "lease-lock run KEY [options] -- COMMAND [ARGS...]"
    assert bare.stderr == f"lease-lock: KEY and COMMAND are required: {usage}\n"
    timed = cli.run("run", "k", "--ttl", "1m30s", "-w", "1h30m", "--", "sh", "-c", "echo $LEASE_LOCK_KEY")
    assert (timed.returncode, timed.stdout) == (0, "k\n"), timed.stderr
    wrong = cli.run("run", "k", "--ttl", "30m1h", "--", "true")
    assert wrong.returncode == 2 and "1h30m" in wrong.stderr


def test_api_key_option_for_http_only(lock_service: Any, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    http = Cli(lock_service.url, tmp_path)
    http.env.pop("LEASE_LOCK_API_KEY", None)
    missing = http.run("status", "k")
    assert missing.returncode == 2 and "LEASE_LOCK_API_KEY" in missing.stderr
    given = http.run("status", "k", "--api-key", lock_service.keys["alpha"], "--json")
    assert given.returncode == 0, given.stderr
    assert json.loads(given.stdout)[0]["held"] is False
    sqlite = Cli(backend_url("sqlite", request, tmp_path), tmp_path)
    wrong = sqlite.run("status", "k", "--api-key", "secret")
    assert wrong.returncode == 2 and "--api-key is for http:// and https:// URLs only" in wrong.stderr


def test_prefix_release_over_http_takes_underscore_literally(lock_service: Any, tmp_path: Path, prefix: str) -> None:
    http = Cli(lock_service.url, tmp_path)
    http.env["LEASE_LOCK_API_KEY"] = lock_service.keys["alpha"]
    keys = [f"{prefix}job_1", f"{prefix}job_2", f"{prefix}jobX1", f"{prefix}job.1"]
    holders = Holders(http, {"a": keys})
    try:
        result = http.run("force-release", "--prefix", f"{prefix}job_", "--yes")
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines()[-1] == f"released 2 key(s) under {prefix + 'job_'!r}"
        left = [state["key"] for state in json.loads(http.run("ls", prefix, "--json").stdout)]
        assert left == [f"{prefix}job.1", f"{prefix}jobX1"]
    finally:
        holders.stop()


def test_keys_with_control_characters_read_one_escaped_line_each(any_cli: Cli, prefix: str) -> None:
    keys = [f"{prefix}two\nlines", f"{prefix}back\rover", f"{prefix}\x1b[2Jclear", f"{prefix}tab\there"]
    escaped = sorted(repr(key)[1:-1] for key in keys)
    holders = Holders(any_cli, {"worker": keys})
    try:
        exact = json.loads(any_cli.run("ls", prefix, "--json").stdout)
        assert sorted(state["key"] for state in exact) == sorted(keys)
        assert sorted(state["key"] for state in any_cli.status(*keys)) == sorted(keys)

        listed = any_cli.run("ls", prefix)
        assert listed.returncode == 0, listed.stderr
        lines = listed.stdout.splitlines()
        assert len(lines) == 1 + len(keys) and all(line.isprintable() for line in lines)
        assert sorted(line.split()[0] for line in lines[1:]) == escaped

        status = any_cli.run("status", *keys)
        lines = status.stdout.splitlines()
        assert len(lines) == len(keys) and all(line.isprintable() for line in lines)
        assert sorted(line.partition(": held by")[0] for line in lines) == escaped

        dropped = any_cli.run("force-release", "--prefix", prefix, input="y\n")
        assert dropped.returncode == 0, dropped.stderr
        lines = dropped.stdout.splitlines()
        assert len(lines) == 1 + len(keys) + 1 and all(line.isprintable() for line in lines)
        assert sorted(line.split()[0] for line in lines[1:-1]) == escaped
        assert lines[-1] == f"released {len(keys)} key(s) under {prefix!r}"
        assert dropped.stderr.isprintable()  # the question
    finally:
        holders.stop()
