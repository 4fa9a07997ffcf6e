"""``lease-lock`` on counting keys (``run --limit N``): real ``lease-lock run`` processes on each
store that grants counting leases, and the command's output in-process on a memory store the
test shares with it.

A store whose ``capabilities.counting`` is False skips the process tests, saying so: they start
running as soon as the store grants counting leases.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from lease_lock import Locker
from lease_lock.backends.base import Capabilities
from lease_lock.backends.memory import MemoryBackend
from lease_lock.cli import main
from lease_lock.testing import wait_until

from tests.integration.test_cli import (
    DEADLINE,
    Cli,
    backend_url,
    finish,
    holder_script,
    one_line_error,
    telling_its_first_refusal,
)


@pytest.fixture(params=["sqlite", "redis", "postgres"])
def counting_cli(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cli]:
    """The command on each real store (every one grants counting leases)."""
    cli = Cli(backend_url(request.param, request, tmp_path), tmp_path)
    yield cli
    cli.close()


@pytest.fixture
def key(request: pytest.FixtureRequest) -> str:
    return f"cli-count-{request.node.name}".replace("[", "-").replace("]", "")


class Places:
    """``lease-lock run KEY --limit N`` processes, each holding a place until ``let_go``."""

    def __init__(self, cli: Cli, key: str, limit: int, count: int) -> None:
        self.go = cli.workdir / "places-go"
        started = [cli.workdir / f"place-{index}" for index in range(count)]
        self.processes = [
            cli.start("run", key, "--limit", str(limit), "--ttl", "30", "--", *holder_script(mark, self.go))
            for mark in started
        ]
        assert wait_until(lambda: all(mark.exists() for mark in started), DEADLINE)

    def let_go(self) -> list[int]:
        """Let every holder finish; their exit statuses."""
        self.go.touch()
        return [finish(process)[0] for process in self.processes]


def test_a_limit_2_key_admits_two_runs_and_the_third_is_busy(counting_cli: Cli, key: str) -> None:
    places = Places(counting_cli, key, limit=2, count=2)
    try:
        third = counting_cli.run("run", key, "--limit", "2", "--", "sh", "-c", "echo ran")
        assert third.returncode == 75
        assert third.stdout == ""
        line = one_line_error(third.stderr)
        assert f"{key!r} is busy (2/2 held, latest by " in line

        [state] = counting_cli.status(key)
        text = counting_cli.run("status", key).stdout.splitlines()
        listed = counting_cli.run("ls", key)
        listed_json = json.loads(counting_cli.run("ls", key, "--json").stdout)
        # Every holder of a key gives the same limit.
        exclusive = counting_cli.run("run", key, "--", "true")
        other_limit = counting_cli.run("run", key, "--limit", "3", "--", "true")
    finally:
        assert places.let_go() == [0, 0]

    assert state["held"] is True and state["limit"] == 2
    fences = [holder["fence"] for holder in state["holders"]]
    assert len(set(fences)) == 2 and fences == sorted(fences) and state["fence"] == fences[-1]
    for holder in state["holders"]:
        assert holder["owner"].endswith(" sh")
        assert 0 < holder["expires_in"] <= 30
        assert holder["expires_at"].endswith("Z")
    assert text[0] == f"{key}: 2/2 held (limit 2)"
    assert len(text) == 3
    for line, fence in zip(text[1:], fences):
        assert line.startswith("  held by ") and f", fence {fence}, current lease ends in " in line
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()
    assert header.split()[:3] == ["KEY", "HOLDERS", "OWNER"]
    assert row.split()[:2] == [key, "2/2"]
    assert [(item["key"], item["limit"], len(item["holders"])) for item in listed_json] == [(key, 2, 2)]
    for refused in (exclusive, other_limit):
        assert refused.returncode == 2
        assert "limit" in one_line_error(refused.stderr)
    assert counting_cli.status(key)[0]["held"] is False


def test_a_waiting_run_takes_the_first_place_given_back(counting_cli: Cli, key: str) -> None:
    places = Places(counting_cli, key, limit=2, count=2)
    ran = counting_cli.workdir / "ran"
    try:
        waiting = counting_cli.start(
            "run", key, "--limit", "2", "--wait", "--", "sh", "-c", f"echo $LEASE_LOCK_FENCE > {ran}",
            python=telling_its_first_refusal(),
        )
        assert waiting.stdout is not None
        assert waiting.stdout.readline() == "refused\n"
        assert waiting.poll() is None and not ran.exists()
    finally:
        assert places.let_go() == [0, 0]
    code, _, err = finish(waiting)
    assert code == 0, err
    assert int(ran.read_text()) > 0


def test_force_release_drops_every_place(counting_cli: Cli, key: str) -> None:
    places = Places(counting_cli, key, limit=2, count=2)
    try:
        dropped = counting_cli.run("force-release", key, "--yes")
    finally:
        statuses = places.let_go()
    assert dropped.returncode == 0, dropped.stderr
    assert dropped.stdout.strip() == f"{key}: released, all places dropped"
    # Each holder found its place gone, at its next renewal or when giving it back.
    assert statuses == [70, 70]


# -- in-process, on a memory store the test shares with the command ---------------------------

#: The module the command's connect() comes from (the package's ``connect`` is the function).
CONNECT = importlib.import_module("lease_lock.connect")


@pytest.fixture
def shared(monkeypatch: pytest.MonkeyPatch) -> Iterator[MemoryBackend]:
    """One memory store behind every locker the command connects (whatever its ``--url``)."""
    backend = MemoryBackend()
    monkeypatch.setattr(CONNECT, "connect", lambda url, **options: Locker(backend, **options))
    yield backend
    backend.close()


def test_status_and_ls_of_a_counting_key(shared: MemoryBackend, capsys: pytest.CaptureFixture[str]) -> None:
    with Locker(shared, fencing=True, owner="web-1:7 report.sh") as one, Locker(
        shared, fencing=True, owner="web-2:8 report.sh"
    ) as two:
        first, second = one.acquire("reports", ttl=40, limit=3), two.acquire("reports", ttl=40, limit=3)
        assert main(["status", "reports", "--url", "memory://"]) == 0
        text = capsys.readouterr().out.splitlines()
        assert main(["status", "reports", "--json", "--url", "memory://"]) == 0
        [state] = json.loads(capsys.readouterr().out)
        assert main(["ls", "--url", "memory://"]) == 0
        table = capsys.readouterr().out.splitlines()
        assert first.is_held() and second.is_held()
    assert text[0] == "reports: 2/3 held (limit 3)"
    assert text[1].startswith(f"  held by web-1:7 report.sh, fence {first.fence}, current lease ends in ")
    assert text[2].startswith(f"  held by web-2:8 report.sh, fence {second.fence}, current lease ends in ")
    assert (state["limit"], state["owner"], state["fence"]) == (3, "web-2:8 report.sh", second.fence)
    assert [(holder["owner"], holder["fence"]) for holder in state["holders"]] == [
        ("web-1:7 report.sh", first.fence), ("web-2:8 report.sh", second.fence),
    ]
    assert [line.split()[:2] for line in table] == [["KEY", "HOLDERS"], ["reports", "2/3"]]


def test_run_limit_takes_a_free_place_and_is_busy_when_none_is_left(
    shared: MemoryBackend, capsys: pytest.CaptureFixture[str]
) -> None:
    with Locker(shared, owner="web-1:7 job") as other:
        held = other.acquire("jobs", limit=2)
        assert main(["run", "jobs", "--limit", "2", "--url", "memory://", "--", "true"]) == 0
        assert capsys.readouterr().err == ""
        also = other.acquire("jobs", limit=2)
        assert main(["run", "jobs", "--limit", "2", "--url", "memory://", "--", "true"]) == 75
        busy = capsys.readouterr().err
        # Every run of a key gives the same limit: an exclusive run is a usage error.
        assert main(["run", "jobs", "--url", "memory://", "--", "true"]) == 2
        assert "limit=1 differs from limit=2 of the live holders of 'jobs'" in capsys.readouterr().err
        assert held.is_held() and also.is_held()
    assert busy.startswith("lease-lock: 'jobs' is busy (2/2 held, latest by web-1:7 job, leases renewed by")
    assert busy.endswith("; not running the command\n")


def test_force_release_of_a_counting_key_says_every_place_went(
    shared: MemoryBackend, capsys: pytest.CaptureFixture[str]
) -> None:
    with Locker(shared) as holder:
        places = [holder.acquire("jobs", limit=2) for _ in range(2)]
        assert main(["force-release", "jobs", "--yes", "--url", "memory://"]) == 0
        assert capsys.readouterr().out == "jobs: released, all places dropped\n"
        assert not any(place.is_held() for place in places)


class _NotCounting(MemoryBackend):
    capabilities: ClassVar[Capabilities] = dataclasses.replace(MemoryBackend.capabilities, counting=False)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--limit", "0"], "--limit must be an int from 1 to 1,000,000"),
        (["--limit", "-2"], "--limit must be an int from 1 to 1,000,000"),
        (["--limit", "two"], "--limit must be a whole number from 1 to 1,000,000, not 'two'"),
        (["--limit", "2.5"], "--limit must be a whole number"),
    ],
)
def test_a_bad_limit_is_a_usage_error(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_status:
        main(["run", "k", *args, "--url", "memory://", "--", "true"])
    assert exit_status.value.code == 2
    assert message in capsys.readouterr().err


def test_a_limit_on_a_store_without_counting_leases_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def connect_plain(url: str, **options: Any) -> Locker:
        return Locker(_NotCounting(), owns_backend=True, **options)

    monkeypatch.setattr(CONNECT, "connect", connect_plain)
    assert main(["run", "k", "--limit", "2", "--url", "memory://", "--", "true"]) == 2
    assert capsys.readouterr().err == (
        "lease-lock: --limit 2 needs a store that grants counting leases; _NotCounting does not\n"
    )
    assert main(["run", "k", "--limit", "1", "--url", "memory://", "--", "true"]) == 0
