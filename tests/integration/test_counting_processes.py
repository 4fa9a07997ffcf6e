"""Four processes on one ``limit=2`` key of each real store: never more than two holders at once,
two at once reached, and every grant a fence of its own, rising in each process.

The holders count themselves in a file of the test's own, under ``flock``: a process adds itself
when its ``with`` block starts and takes itself away before it ends, so the count is the number
of processes inside their blocks at that moment, whatever the store says.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any, Callable

import pytest
from lease_lock import connect

from tests.support.http_server import ServiceInfo

PROCESSES = 4
LIMIT = 2
ROUNDS = 6

# Each process takes the key ROUNDS times and stays inside a little, so that holders overlap.
_WORKER = textwrap.dedent(
    """
    import fcntl, json, os, sys, time
    import lease_lock

    url, key, counter, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])  # and the limit

    def step(change):
        with open(counter, "r+") as file:
            fcntl.flock(file, fcntl.LOCK_EX)
            inside, most = json.loads(file.read())
            inside += change
            most = max(most, inside)
            file.seek(0)
            file.truncate()
            file.write(json.dumps([inside, most]))

    fences = []
    with lease_lock.connect(url, ttl=10, retry=lease_lock.Retry(timeout=120)) as locker:
        for _ in range(rounds):
            with locker.lock(key, limit=int(sys.argv[5])) as lock:
                step(+1)
                fences.append(lock.fence)
                time.sleep(0.2)
                step(-1)
    print(json.dumps(fences))
    """
)


def _sqlite(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'locks.db'}"


def _redis(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return str(request.getfixturevalue("redis_server").url)


def _postgres(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    url = str(request.getfixturevalue("postgres_server").url)
    return f"{url}{'&' if '?' in url else '?'}table=counting_{uuid.uuid4().hex[:12]}"


def _etcd(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    url = str(request.getfixturevalue("etcd_server").url)
    return f"{url}{'&' if '?' in url else '?'}namespace=counting-{uuid.uuid4().hex[:12]}/"


def _mongo(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return str(request.getfixturevalue("mongo_server").url(request.getfixturevalue("mongo_database")))


def _http(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    service: ServiceInfo = request.getfixturevalue("lock_service")
    return service.url


STORES: dict[str, Callable[[pytest.FixtureRequest, Path], str]] = {
    "sqlite": _sqlite, "redis": _redis, "postgres": _postgres, "etcd": _etcd, "mongodb": _mongo, "http": _http,
}


@pytest.mark.parametrize("store", sorted(STORES))
def test_four_processes_on_one_limit_two_key(store: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    url = STORES[store](request, tmp_path)
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    options: dict[str, Any] = {}
    if store == "http":
        options["api_key"] = environment["LEASE_LOCK_API_KEY"] = request.getfixturevalue("lock_service").keys["alpha"]
    key = f"counting-{uuid.uuid4().hex}"
    # The store's first grant of the key, exclusive: every counting grant must be above it.
    with connect(url, fencing=True, **options) as locker, locker.lock(key) as first:
        assert first.fence is not None
        floor = first.fence
    counter = tmp_path / "inside.json"
    counter.write_text(json.dumps([0, 0]))
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, url, key, str(counter), str(ROUNDS), str(LIMIT)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment,
        )
        for _ in range(PROCESSES)
    ]
    outputs: list[Any] = []
    for worker in workers:
        stdout, stderr = worker.communicate(timeout=300)
        assert worker.returncode == 0, stderr
        outputs.append(json.loads(stdout))
    inside, most = json.loads(counter.read_text())
    assert inside == 0
    assert most == LIMIT, f"at most {LIMIT} holders at once, and {LIMIT} reached: saw {most}"
    fences = [fence for process in outputs for fence in process]
    assert len(fences) == PROCESSES * ROUNDS and len(set(fences)) == len(fences)
    assert all(fence > floor for fence in fences)
    assert all(process == sorted(process) for process in outputs)
