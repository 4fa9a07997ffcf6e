"""The rest of the library on a MongoDB server: exclusion and rising fences across processes,
the ``lease-lock`` command (``run``, ``status``, ``ls``, ``force-release --prefix``, an
unreachable server, ``serve``), and RQ's ``enqueue_once`` with its claims and locks on MongoDB."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import lease_lock
import pytest
import requests
from lease_lock.backends.http import HttpBackend

from tests.integration.test_cli import Cli, check_run_hands_rising_fences
from tests.integration.test_rq import check_enqueue_once_with_locks_on
from tests.support.http_server import make_keys, start_serve, stop_serve
from tests.support.mongo_server import MongoServer
from tests.support.ports import free_port

PROCESSES = 4
ROUNDS = 25

# Each process takes the key ROUNDS times and, holding it, appends "enter FENCE" and then
# "leave FENCE" to one shared file (O_APPEND: every line lands whole, in the order written).
_WORKER = """
import os, sys, lease_lock
url, key, path, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
with lease_lock.connect(url, fencing=True, ttl=30) as locker:
    for _ in range(rounds):
        with locker.lock(key, timeout=120) as lock:
            for word in ("enter", "leave"):
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
                os.write(fd, f"{word} {lock.fence}\\n".encode())
                os.close(fd)
"""


@pytest.fixture
def url(mongo_server: MongoServer, mongo_database: str) -> str:
    return mongo_server.url(mongo_database)


def test_processes_take_turns_with_rising_fences(url: str, tmp_path: Path) -> None:
    key = f"processes:{uuid.uuid4().hex[:8]}"
    journal = tmp_path / "journal"
    workers = [
        subprocess.Popen([sys.executable, "-c", _WORKER, url, key, str(journal), str(ROUNDS)], stderr=subprocess.PIPE)
        for _ in range(PROCESSES)
    ]
    errors = [worker.communicate(timeout=600)[1].decode() for worker in workers]
    assert [worker.returncode for worker in workers] == [0] * PROCESSES, errors
    lines = [line.split() for line in journal.read_text().splitlines()]
    assert len(lines) == 2 * PROCESSES * ROUNDS
    # Never two holders inside at once: every "enter" is followed by its own "leave".
    assert [word for word, _ in lines] == ["enter", "leave"] * (PROCESSES * ROUNDS)
    assert all(lines[index][1] == lines[index + 1][1] for index in range(0, len(lines), 2))
    fences = [int(fence) for word, fence in lines if word == "enter"]
    assert all(earlier < later for earlier, later in zip(fences, fences[1:])), fences


def test_run_hands_the_child_its_key_and_a_rising_fence(url: str, tmp_path: Path) -> None:
    check_run_hands_rising_fences(url, tmp_path, f"cli-mongo-{uuid.uuid4().hex[:8]}")


def test_ls_status_and_force_release_by_prefix(
    mongo_server: MongoServer, mongo_database: str, url: str, tmp_path: Path
) -> None:
    # The collection through the URL, as the command passes every backend option.
    cli = Cli(mongo_server.url(mongo_database, collection="cli-locks"), tmp_path)
    prefix = f"cli-mongo-{uuid.uuid4().hex[:8]}:"
    with lease_lock.connect(url, collection="cli-locks", ttl=30, fencing=True, owner="worker-1") as locker:
        locks = [locker.acquire(f"{prefix}{index}") for index in range(3)]
        listed = json.loads(cli.run("ls", prefix, "--json").stdout)
        assert [state["key"] for state in listed] == [lock.key for lock in locks]
        assert {state["owner"] for state in listed} == {"worker-1"}
        assert [state["fence"] for state in listed] == [lock.fence for lock in locks]
        [state] = cli.status(locks[0].key)
        assert state["held"] and 0 < state["expires_in"] <= 30
        result = cli.run("force-release", "--prefix", prefix, "--yes")
        assert result.returncode == 0, result.stderr
        assert json.loads(cli.run("ls", prefix, "--json").stdout) == []
        assert all(not lock.is_held() for lock in locks)


def test_an_unreachable_server_exits_69_with_one_line(tmp_path: Path) -> None:
    cli = Cli(f"mongodb://127.0.0.1:{free_port()}/app?serverSelectionTimeoutMS=300", tmp_path)
    result = cli.run("run", "k", "--", "true")
    assert result.returncode == 69, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_the_lock_service_serves_from_a_mongodb_store(url: str, tmp_path: Path) -> None:
    # lease-lock serve --url mongodb://...: ready, and its clients' grants are the store's.
    keys_file = tmp_path / "keys.toml"
    keys = make_keys(keys_file)
    process, served, _log = start_serve(tmp_path, url, keys_file, module="lease_lock")
    first, second = HttpBackend(served, keys["alpha"]), HttpBackend(served, keys["alpha"])
    try:
        assert requests.get(f"{served}/readyz", timeout=30).status_code == 200
        key = f"served-{uuid.uuid4().hex[:8]}"
        mine = first.new_token()
        fence = first.acquire_fenced(key, mine, 30, "first:1")
        assert fence is not None
        assert second.acquire_fenced(key, second.new_token(), 30, "second:1") is None
        assert second.inspect(key).fence == fence
        assert first.release(key, mine)
        later = second.acquire_fenced(key, second.new_token(), 30, "second:1")
        assert later is not None and later > fence
    finally:
        first.close()
        second.close()
        stop_serve(process)


def test_enqueue_once_runs_one_job_per_key_with_its_locks_on_mongodb(
    url: str, redis_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The run adopts the claim in the grant's one upsert.
    check_enqueue_once_with_locks_on(url, redis_server, monkeypatch)
