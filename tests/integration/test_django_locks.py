"""``manage.py locks`` on the Django test project: real ``manage.py`` processes, locks held by
real processes, on SQLite (``django://default``), PostgreSQL and an etcd cluster (an
``etcd://`` URL in ``LEASE_LOCK``); the output is the ``lease-lock`` command's."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_cli import DEADLINE, Cli
from tests.integration.test_cli_admin import Holders

MANAGE = Path(__file__).resolve().parent / "django_project" / "manage.py"


class Site:
    """The test project with ``LEASE_LOCK`` on ``url`` (the CLI reaches the same store)."""

    def __init__(self, tmp_path: Path, url: str, lease_url: str, prefix: str) -> None:
        self.cli = Cli(url, tmp_path)
        self.env = dict(
            self.cli.env,
            DJANGO_TEST_SQLITE=str(tmp_path / "site.db"),
            LEASE_LOCK_TEST_URL=lease_url,
            LEASE_LOCK_TEST_PREFIX=prefix,
        )
        self.workdir = tmp_path

    def manage(self, *args: str, input: str | None = None, command: str = "locks") -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(MANAGE), command, *args],
            env=self.env, cwd=self.workdir, input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
            capture_output=True, text=True, timeout=DEADLINE, check=False,
        )


@pytest.fixture(params=["sqlite", "postgres", "etcd"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    """(URL for the CLI and the holders, LEASE_LOCK URL of the site)."""
    if request.param == "etcd":
        url = str(request.getfixturevalue("etcd_cluster").url)
        return url, url
    if request.param == "postgres":
        url = str(request.getfixturevalue("postgres_server").url)
        url += ("&" if "?" in url else "?") + "create_table=true"
        return url, url
    return f"sqlite:///{tmp_path / 'site.db'}", "django://default"


def without_timing(states: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The states without what changes from one read to the next (their holders' too)."""
    timing = ("expires_in", "expires_at")
    return [
        {
            name: without_timing(value) if name == "holders" else value
            for name, value in state.items() if name not in timing
        }
        for state in states
    ]


def test_locks_list_prints_what_lease_lock_ls_prints(store: tuple[str, str], tmp_path: Path) -> None:
    url, lease_url = store
    tag = f"dj{uuid.uuid4().hex[:6]}:"
    site = Site(tmp_path, url, lease_url, "")
    keys = [f"{tag}order:{number}" for number in range(6)]
    holders = Holders(site.cli, {"web-1": keys[:3], "worker-2": keys[3:]})
    try:
        listed = site.manage("list", tag, "--json")
        assert listed.returncode == 0, listed.stderr
        ls = site.cli.run("ls", tag, "--json")
        assert without_timing(json.loads(listed.stdout)) == without_timing(json.loads(ls.stdout))
        assert [state["owner"] for state in json.loads(listed.stdout)] == ["web-1"] * 3 + ["worker-2"] * 3

        table, cli_table = site.manage("list", tag).stdout.splitlines(), site.cli.run("ls", tag).stdout.splitlines()
        # Every column but the two times (held for, lease left), which move between the calls.
        moving = table[0].index("HELD FOR")
        assert [line[:moving] for line in table] == [line[:moving] for line in cli_table]
        assert len(table) == 7
    finally:
        holders.stop()
    assert site.manage("list", tag).stdout == f"no held keys under {tag!r}\n"


def test_locks_release_by_key_and_by_prefix(store: tuple[str, str], tmp_path: Path) -> None:
    url, lease_url = store
    shop = f"shop{uuid.uuid4().hex[:6]}:"
    # The site's keys carry its KEY_PREFIX in the store; manage.py names them without it.
    site = Site(tmp_path, url, lease_url, shop)
    stored = [f"{shop}order_1", f"{shop}order%2", f"{shop}orderX3", f"{shop}cart:1", f"{shop}cart:2"]
    holders = Holders(site.cli, {"web": stored})
    try:
        listed = site.manage("list", "--json")
        assert [state["key"] for state in json.loads(listed.stdout)] == [
            "cart:1", "cart:2", "order%2", "orderX3", "order_1",
        ]
        no_answer = site.manage("release", "--prefix", "order_")
        assert no_answer.returncode == 1 and "no answer on stdin" in no_answer.stderr
        declined = site.manage("release", "--prefix", "order_", input="n\n")
        assert declined.returncode == 1 and "aborted; nothing released" in declined.stderr
        released = site.manage("release", "--prefix", "order_", input="y\n")
        assert released.returncode == 0, released.stderr
        assert released.stdout.splitlines()[-1] == "released 1 key(s) under 'order_'"
        keyed = site.manage("release", "cart:1", "cart:9", "--yes")
        assert keyed.returncode == 0, keyed.stderr
        assert keyed.stdout.splitlines()[-2:] == ["cart:1: released", "cart:9: free, nothing to release"]
        left = json.loads(site.cli.run("ls", shop, "--json").stdout)
        assert [state["key"] for state in left] == [f"{shop}cart:2", f"{shop}order%2", f"{shop}orderX3"]
        usage = site.manage("release")
        assert usage.returncode == 2 and "either KEY... or --prefix PREFIX" in usage.stderr
    finally:
        holders.stop()


def test_metrics_setting_records_prometheus_metrics(tmp_path: Path) -> None:
    site = Site(tmp_path, f"sqlite:///{tmp_path / 'site.db'}", "django://default", "")
    site.env["LEASE_LOCK_TEST_METRICS"] = "prometheus"
    code = (
        "import prometheus_client\n"
        "from lease_lock.contrib.django import locker\n"
        "locker.acquire('nightly').release()\n"
        "value = prometheus_client.REGISTRY.get_sample_value\n"
        "print(value('lease_lock_acquisitions_total', {'outcome': 'acquired'}), value('lease_lock_held'))\n"
    )
    result = site.manage("-c", code, command="shell")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1].split() == ["1.0", "0.0"]
    site.env["LEASE_LOCK_TEST_METRICS"] = "statsd"
    wrong = site.manage("-c", code, command="shell")
    assert wrong.returncode != 0 and "METRICS setting must be 'prometheus' or 'opentelemetry'" in wrong.stderr


def test_locks_shows_keys_with_control_characters_escaped_one_line_each(
    store: tuple[str, str], tmp_path: Path
) -> None:
    url, lease_url = store
    tag = f"dj{uuid.uuid4().hex[:6]}:"
    site = Site(tmp_path, url, lease_url, "")
    keys = [f"{tag}two\nlines", f"{tag}back\rover", f"{tag}\x1b[2Jclear", f"{tag}tab\there"]
    escaped = sorted(repr(key)[1:-1] for key in keys)
    holders = Holders(site.cli, {"web-1": keys})
    try:
        assert sorted(state["key"] for state in json.loads(site.manage("list", tag, "--json").stdout)) == sorted(keys)
        lines = site.manage("list", tag).stdout.splitlines()
        assert len(lines) == 1 + len(keys) and all(line.isprintable() for line in lines)
        assert sorted(line.split()[0] for line in lines[1:]) == escaped
        dropped = site.manage("release", "--prefix", tag, input="y\n")
        assert dropped.returncode == 0, dropped.stderr
        lines = dropped.stdout.splitlines()
        assert len(lines) == 1 + len(keys) + 1 and all(line.isprintable() for line in lines)
        assert sorted(line.split()[0] for line in lines[1:-1]) == escaped
    finally:
        holders.stop()
