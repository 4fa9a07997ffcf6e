"""RQ jobs guarded by ``singleton`` and by a plain ``@locker.locked(key, skip=True)``, run by two
real ``rq worker --burst`` processes (each forks a work horse per job) on the tests' private
Redis, which also holds the locks.

The module doubles as the job module the workers import: in a worker, ``LEASE_LOCK_URL`` names
the lock store.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from typing import Any, Callable, Optional

import lease_lock
import pytest
import redis
from lease_lock import Locker, MemoryBackend, ValidationError
from lease_lock.contrib.rq import singleton
from rq import Queue
from rq.job import Job

from tests.support.polling import wait_until

WAIT = 30.0

#: A locker built at import, as an application would: in a worker that is the worker's main
#: process, and each forked work horse then uses it (the core gives the child its own heartbeat).
locker = lease_lock.connect(os.environ.get("LEASE_LOCK_URL", "memory://"))


def _hold(flags: str, redis_url: str) -> str:
    client = redis.Redis.from_url(redis_url)
    client.rpush(f"{flags}:started", os.getpid())
    if client.blpop([f"{flags}:go"], timeout=WAIT) is None:
        raise RuntimeError("the test never let the job finish")
    return "ran"


@singleton()
def default_key_job(flags: str, redis_url: str) -> str:
    """Locked on its dotted name, through the worker's process-wide locker."""
    return _hold(flags, redis_url)


@singleton(lambda flags, redis_url: f"rq:{flags}", ttl=5)
def keyed_job(flags: str, redis_url: str) -> str:
    """Locked on a key made from its arguments."""
    return _hold(flags, redis_url)


@locker.locked(lambda flags, redis_url: f"plain:{flags}", skip=True)
def plain_job(flags: str, redis_url: str) -> str:
    """The core decorator, unchanged, on an RQ job."""
    return _hold(flags, redis_url)


def finished(job: Job) -> bool:
    return bool(job.get_status(refresh=True) == "finished")


@pytest.mark.parametrize("function", [default_key_job, keyed_job, plain_job])
def test_two_jobs_with_one_key_run_one_body(redis_server: Any, function: Callable[..., Any]) -> None:
    url = redis_server.url
    client = redis.Redis.from_url(url)
    flags = f"ll-rq-{uuid.uuid4().hex}"
    queue = Queue(flags, connection=client)
    jobs = [queue.enqueue(function, flags, url) for _ in range(2)]
    environment = {**os.environ, "LEASE_LOCK_URL": url}
    command = [sys.executable, "-m", "rq.cli", "worker", "--burst", "--url", url, flags]
    workers = [
        subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(2)
    ]
    logs: list[Optional[str]] = []
    try:
        # One body started and the other job finished without running it, or (a broken lock)
        # both bodies started: either ends the wait, only the first passes the asserts.
        wait_until(
            lambda: client.llen(f"{flags}:started") >= 2
            or (client.llen(f"{flags}:started") == 1 and any(finished(job) for job in jobs)),
            "one body to run and the other job to finish",
        )
    finally:
        client.rpush(f"{flags}:go", "1", "1")
        logs = [worker.communicate(timeout=WAIT)[0] for worker in workers]
    assert [worker.returncode for worker in workers] == [0, 0], logs
    assert client.llen(f"{flags}:started") == 1, logs
    assert all(finished(job) for job in jobs), logs
    assert sorted(str(job.return_value()) for job in jobs) == ["None", "ran"]
    client.delete(f"{flags}:started", f"{flags}:go")


def test_singleton_with_an_explicit_locker_and_its_checks() -> None:
    shared = Locker(MemoryBackend())

    @singleton("report", locker=shared)
    def job() -> str:
        return "ran"

    assert job() == "ran"
    with shared.lock("report"):
        assert job() is None
    shared.close()
    with pytest.raises(ValidationError, match="ttl"):
        singleton(ttl=-1)
    with pytest.raises(ValidationError, match="unknown option"):
        singleton(wait=True)
