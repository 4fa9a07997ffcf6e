"""The rest of the library on a MongoDB server: exclusion and rising fences across processes,
the ``lease-lock`` command (``run``, ``status``, ``ls``, ``force-release --prefix``, an
unreachable server, ``serve``), and RQ's ``enqueue_once`` with its claims and locks on MongoDB."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Optional

import lease_lock
import pytest
import requests
from lease_lock.backends.http import HttpBackend
from lease_lock.contrib.rq import enqueue_once, job_locker

from tests.integration.test_cli import Cli
from tests.integration.test_rq import WAIT, _fresh_queue, customer_job, start_workers
from tests.support.http_server import make_keys, start_serve, stop_serve
from tests.support.mongo_server import MongoServer
from tests.support.polling import wait_until
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
    cli = Cli(url, tmp_path)
    key = f"cli-mongo-{uuid.uuid4().hex[:8]}"
    fences = []
    for _ in range(2):
        result = cli.run("run", key, "--", "sh", "-c", 'echo "$LEASE_LOCK_KEY $LEASE_LOCK_FENCE"')
        assert result.returncode == 0, result.stderr
        seen_key, fence = result.stdout.split()
        assert seen_key == key
        fences.append(int(fence))
    assert fences[1] > fences[0]
    assert cli.status(key)[0]["held"] is False


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
    # The queue on Redis, the claims and the runs' locks on MongoDB (one LEASE_LOCK_URL for the
    # sender and the worker): the worker's run adopts the claim in the grant's one upsert.
    monkeypatch.setenv("LEASE_LOCK_URL", url)
    queue_url = redis_server.url
    client, flags, queue = _fresh_queue(queue_url)
    first = enqueue_once(queue, customer_job, 1, flags, queue_url)
    assert first is not None
    assert getattr(enqueue_once(queue, customer_job, 1, flags, queue_url), "id", None) == first.id
    key = f"{customer_job.__module__}.customer_job"
    workers = start_workers(queue_url, flags, 1, dict(os.environ))
    logs: list[Optional[str]] = []
    try:
        wait_until(lambda: client.llen(f"{flags}:started") == 1, "the job to start")
        held = list(job_locker(client).list(key))
        assert len(held) == 1
        assert getattr(enqueue_once(queue, customer_job, 1, flags, queue_url), "id", None) == first.id
    finally:
        client.rpush(f"{flags}:go", "1")
        logs = [worker.communicate(timeout=WAIT)[0] for worker in workers]
    assert first.return_value(refresh=True) == "ran 1", logs
    assert not list(job_locker(client).list(key))
    client.delete(f"{flags}:started", f"{flags}:go")
    job_locker(client).close()
