"""The ``lease-lock`` command on an etcd cluster: ``run``, ``status``, ``ls`` and
``force-release --prefix`` with an ``etcd://`` URL, against locks held by another process."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import lease_lock

from tests.integration.test_cli import Cli, check_run_hands_rising_fences
from tests.support.etcd_nested import INNER, nested_namespaces
from tests.support.etcd_server import EtcdCluster


def test_run_hands_the_child_its_key_and_a_rising_fence(etcd_cluster: EtcdCluster, tmp_path: Path) -> None:
    check_run_hands_rising_fences(etcd_cluster.url, tmp_path, f"cli-etcd-{uuid.uuid4().hex[:8]}")


def test_ls_and_force_release_by_prefix(etcd_cluster: EtcdCluster, tmp_path: Path) -> None:
    cli = Cli(etcd_cluster.url, tmp_path)
    prefix = f"cli-etcd-{uuid.uuid4().hex[:8]}:"
    with lease_lock.connect(etcd_cluster.url, ttl=30, fencing=True, owner="worker-1") as locker:
        locks = [locker.acquire(f"{prefix}{index}") for index in range(3)]
        listed = json.loads(cli.run("ls", prefix, "--json").stdout)
        assert sorted(state["key"] for state in listed) == [lock.key for lock in locks]
        assert {state["owner"] for state in listed} == {"worker-1"}
        assert [state["fence"] for state in sorted(listed, key=lambda s: s["key"])] == [lock.fence for lock in locks]
        result = cli.run("force-release", "--prefix", prefix, "--yes")
        assert result.returncode == 0, result.stderr
        assert json.loads(cli.run("ls", prefix, "--json").stdout) == []
        assert all(not lock.is_held() for lock in locks)


def test_ls_and_prefix_release_of_an_outer_namespace_see_only_lock_keys(
    etcd_cluster: EtcdCluster, tmp_path: Path
) -> None:
    with nested_namespaces(etcd_cluster) as outer:
        cli = Cli(f"{etcd_cluster.url}?namespace={outer}", tmp_path)
        listed = cli.run("ls", "--json")
        assert listed.returncode == 0, listed.stderr
        assert [state["key"] for state in json.loads(listed.stdout)] == [f"{INNER}a", f"{INNER}b"]
        released = cli.run("force-release", "--prefix", INNER, "--yes")
        assert released.returncode == 0, released.stderr
        assert "released 2 key(s)" in released.stdout + released.stderr
