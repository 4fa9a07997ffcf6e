"""``lease-lock serve --workers N``: several processes on one port and one store agree."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import requests
from lease_lock.server import create_key, list_keys, revoke_key
from lease_lock.testing import wait_until

from tests.support.http_server import make_keys, start_serve, stop_serve
from tests.support.redis_server import RedisFactory

_ACCESS = re.compile(r" (\d+) lease_lock\.server INFO GET /locks/\{key\} -> (\d{3})")


def _get(url: str, key: str) -> int:
    # No session: each call opens a new connection, which any worker may accept.
    return requests.get(f"{url}/locks/k", headers={"Authorization": f"Bearer {key}"}, timeout=10).status_code


def test_two_workers_share_the_port_the_budgets_and_the_keys(tmp_path: Path, redis_factory: RedisFactory) -> None:
    redis = redis_factory.server()
    keys_file = tmp_path / "keys.toml"
    keys = make_keys(keys_file)
    process, url, log = start_serve(
        tmp_path, redis.url, keys_file, "--workers", "2", "--rate-limit", "1000", module="lease_lock"
    )
    try:
        # Both processes answer on the one port.
        def both_answered() -> bool:
            assert _get(url, keys["alpha"]) == 200
            return len({pid for pid, _status in _ACCESS.findall(log.read_text())}) == 2

        assert wait_until(both_answered, 60)
        # A key made after the start works in every worker, a revoked one in none.
        _record, fresh = create_key(keys_file, "gamma", "locks.read")
        assert [_get(url, fresh) for _ in range(10)] == [200] * 10
        [beta] = [r for r in list_keys(keys_file) if r.project == "beta"]
        assert revoke_key(keys_file, beta.id)
        assert [_get(url, keys["beta"]) for _ in range(10)] == [401] * 10
    finally:
        stop_serve(process)


def test_the_budget_is_one_across_workers(tmp_path: Path, redis_factory: RedisFactory) -> None:
    redis = redis_factory.server()
    keys_file = tmp_path / "keys.toml"
    keys = make_keys(keys_file)
    process, url, log = start_serve(
        tmp_path, redis.url, keys_file, "--workers", "2", "--rate-limit", "30", module="lease_lock"
    )
    try:
        statuses = [_get(url, keys["alpha"]) for _ in range(40)]
        # Access lines reach the log moments after their answers (the handler writes batches).
        assert wait_until(lambda: len(_ACCESS.findall(log.read_text())) >= 40, 10)
        seen = _ACCESS.findall(log.read_text())
    finally:
        stop_serve(process)
    # 30 per minute for the project, whichever process counted: a minute boundary can only
    # restart the count, so at most 30 in a row pass and the run ends refused.
    runs = "".join("a" if status == 200 else "r" for status in statuses).split("r")
    assert statuses[-1] == 429 and max(len(run) for run in runs) <= 30
    assert set(statuses) == {200, 429}
    assert len(seen) >= 40


def test_workers_need_a_shared_store(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.toml"
    make_keys(keys_file)
    done = subprocess.run(
        [sys.executable, "-m", "lease_lock", "serve", "--url", "memory://", "--keys", str(keys_file),
         "--bind", "127.0.0.1:0", "--workers", "2"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 2 and "shared store" in done.stderr


def test_stopping_the_supervisor_stops_its_workers(tmp_path: Path, redis_factory: RedisFactory) -> None:
    redis = redis_factory.server()
    keys_file = tmp_path / "keys.toml"
    keys = make_keys(keys_file)
    process, url, _log = start_serve(tmp_path, redis.url, keys_file, "--workers", "2", module="lease_lock")
    assert _get(url, keys["alpha"]) == 200
    children = Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()
    assert len(children) == 2
    stop_serve(process)
    assert process.returncode == 0
    assert wait_until(lambda: not any(Path(f"/proc/{pid}").exists() for pid in children), 20)
