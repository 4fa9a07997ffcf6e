"""RQ jobs guarded by ``singleton`` and by a plain ``@locker.locked(key, skip=True)``, run by two
real ``rq worker --burst`` processes (each forks a work horse per job) on the tests' private
Redis, which also holds the locks (or, for the one-body test, the tests' etcd cluster holds
them, named by an ``etcd://`` ``LEASE_LOCK_URL``).

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
from lease_lock.contrib.rq import META_KEY, enqueue_once, job_locker, singleton, was_skipped
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


def customer_job(customer_id: int, flags: str, redis_url: str) -> str:
    """Sent with enqueue_once: announces its customer, then waits for the go."""
    client = redis.Redis.from_url(redis_url)
    client.rpush(f"{flags}:started", customer_id)
    if client.blpop([f"{flags}:go"], timeout=WAIT) is None:
        raise RuntimeError("the test never let the job finish")
    return f"ran {customer_id}"


def polling_job(customer_id: int, flags: str, redis_url: str) -> str:
    """Like ``customer_job``, but polls for the go: a work horse's blocking read may time out
    while the test waits for another worker to start."""
    client = redis.Redis.from_url(redis_url)
    client.rpush(f"{flags}:started", customer_id)
    wait_until(lambda: client.lpop(f"{flags}:go") is not None, "the test to let the job finish", WAIT)
    return f"ran {customer_id}"


def never_run(flags: str) -> None:
    """Queued where no worker listens."""


def _fresh_queue(url: str) -> tuple[Any, str, Queue]:
    """A client of the Redis at ``url`` and a queue of a new name, which also names the test's lists."""
    client = redis.Redis.from_url(url)
    flags = f"ll-rq-{uuid.uuid4().hex}"
    return client, flags, Queue(flags, connection=client)


def finished(job: Job) -> bool:
    return bool(job.get_status(refresh=True) == "finished")


@pytest.fixture(params=["redis", "etcd"])
def job_locks(request: pytest.FixtureRequest) -> str:
    """The workers' ``LEASE_LOCK_URL``: the queue's Redis, or the tests' etcd cluster (the queue
    stays on Redis)."""
    return str(request.getfixturevalue("etcd_cluster" if request.param == "etcd" else "redis_server").url)


@pytest.mark.parametrize("function", [default_key_job, keyed_job, plain_job])
def test_two_jobs_with_one_key_run_one_body(redis_server: Any, job_locks: str, function: Callable[..., Any]) -> None:
    url = redis_server.url
    client, flags, queue = _fresh_queue(url)
    jobs = [queue.enqueue(function, flags, url) for _ in range(2)]
    environment = {**os.environ, "LEASE_LOCK_URL": job_locks}
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
    if function is not plain_job:
        # The skip is told apart from a None result, and names the key's holder.
        skipped = [job for job in jobs if was_skipped(job)]
        assert len(skipped) == 1 and skipped[0].return_value() is None
        assert skipped[0].get_meta()[META_KEY]["holder"]
        # The WARNING the docs promise reaches the worker's own output under RQ's default
        # logging, which configures no handler above its own loggers.
        told = [line for log in logs if log for line in log.splitlines() if "skipped: lock" in line]
        assert len(told) == 1 and f"[{skipped[0].id}]" in told[0], logs
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


def start_workers(url: str, queue: str, count: int, environment: Optional[dict[str, str]] = None) -> list[Any]:
    if environment is None:
        environment = {name: value for name, value in os.environ.items() if name != "LEASE_LOCK_URL"}
    command = [sys.executable, "-m", "rq.cli", "worker", "--burst", "--url", url, queue]
    return [
        subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(count)
    ]


def check_enqueue_once_with_locks_on(lock_url: str, redis_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The queue on Redis, the claims and the runs' locks on the store ``lock_url`` names (one
    ``LEASE_LOCK_URL`` for the sender and the worker): a worker's run adopts the claim there,
    a duplicate meanwhile finds the job, and the run gives its key back."""
    monkeypatch.setenv("LEASE_LOCK_URL", lock_url)
    url = redis_server.url
    client, flags, queue = _fresh_queue(url)
    first = enqueue_once(queue, customer_job, 1, flags, url)
    assert first is not None
    assert getattr(enqueue_once(queue, customer_job, 1, flags, url), "id", None) == first.id
    key = f"{customer_job.__module__}.customer_job"
    workers = start_workers(url, flags, 1, dict(os.environ))
    logs: list[Optional[str]] = []
    try:
        wait_until(lambda: client.llen(f"{flags}:started") == 1, "the job to start")
        # The run holds the key under a token of its own; a duplicate still finds the job.
        held = list(job_locker(client).list(key))
        assert len(held) == 1
        assert getattr(enqueue_once(queue, customer_job, 1, flags, url), "id", None) == first.id
    finally:
        client.rpush(f"{flags}:go", "1")
        logs = [worker.communicate(timeout=WAIT)[0] for worker in workers]
    assert first.return_value(refresh=True) == "ran 1", logs
    assert not list(job_locker(client).list(key))
    client.delete(f"{flags}:started", f"{flags}:go")
    # This process's locker from LEASE_LOCK_URL goes with the variable: a later get builds anew.
    job_locker(client).close()


def test_enqueue_once_sends_one_job_per_key_to_real_workers(redis_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # No LEASE_LOCK_URL anywhere: the queue's own Redis holds the keys, here and in the workers.
    monkeypatch.delenv("LEASE_LOCK_URL", raising=False)
    url = redis_server.url
    client, flags, queue = _fresh_queue(url)
    first = enqueue_once(queue, customer_job, 1, flags, url)
    other = enqueue_once(queue, customer_job, 2, flags, url)
    assert first is not None and other is not None and first.id != other.id
    workers = start_workers(url, flags, 2)
    logs: list[Optional[str]] = []
    try:
        # Different arguments run side by side: both start before either may finish.
        wait_until(lambda: client.llen(f"{flags}:started") == 2, "both customers to start")
        duplicates = [enqueue_once(queue, customer_job, 1, flags, url) for _ in range(18)]
        duplicates.append(enqueue_once(queue, customer_job, customer_id=1, flags=flags, redis_url=url))
        key = f"{customer_job.__module__}.customer_job"
        held = [state for state in job_locker(client).list(key)]
        assert len(held) == 2 and all(client.exists(state.key) for state in held)
    finally:
        client.rpush(f"{flags}:go", "1", "1")
        logs = [worker.communicate(timeout=WAIT)[0] for worker in workers]
    assert [duplicate.id for duplicate in duplicates if duplicate is not None] == [first.id] * 19, logs
    assert queue.count == 0
    assert (first.return_value(refresh=True), other.return_value(refresh=True)) == ("ran 1", "ran 2"), logs
    assert sorted(client.lrange(f"{flags}:started", 0, -1)) == [b"1", b"2"]
    # Both runs gave their keys back, so the same call is sent again under a new id.
    assert not list(job_locker(client).list(key))
    again = enqueue_once(queue, customer_job, 1, flags, url)
    assert again is not None and again.id != first.id
    again.delete()
    client.delete(f"{flags}:started", f"{flags}:go")


def test_an_unrun_job_frees_its_key_when_the_claim_lapses(redis_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LEASE_LOCK_URL", raising=False)
    client = redis.Redis.from_url(redis_server.url)
    flags = uuid.uuid4().hex
    queue = Queue(f"nobody-{flags}", connection=client)
    first = enqueue_once(queue, never_run, flags, enqueue_ttl=2)
    assert first is not None
    duplicate = enqueue_once(queue, never_run, flags, enqueue_ttl=2)
    assert duplicate is not None and duplicate.id == first.id
    queue.empty()  # the message is dropped before any worker ran it
    # Its job is gone, so a duplicate has nothing to return while the claim lasts.
    assert enqueue_once(queue, never_run, flags) is None
    key = f"{never_run.__module__}.never_run"
    wait_until(lambda: not list(job_locker(client).list(key)), "the claim of the dropped job to lapse")
    again = enqueue_once(queue, never_run, flags, enqueue_ttl=2)
    assert again is not None and again.id != first.id
    queue.empty()


def test_a_job_id_that_is_not_a_token_is_refused_before_anything_is_sent() -> None:
    with pytest.raises(ValidationError, match="job id"):
        enqueue_once(Queue("q", connection=redis.Redis.from_url("redis://127.0.0.1:1/0")), never_run, "x",
                     key="k", job_id="short")


def test_the_same_job_delivered_again_while_it_runs_is_skipped(
    redis_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The job id pushed onto the queue a second time (as a requeue of a job that looks stuck
    # does) while its first delivery runs: the second delivery adopts nothing and skips.
    monkeypatch.delenv("LEASE_LOCK_URL", raising=False)
    url = redis_server.url
    client, flags, queue = _fresh_queue(url)
    first = enqueue_once(queue, polling_job, 1, flags, url)
    assert first is not None
    workers = start_workers(url, flags, 1)
    logs: list[Optional[str]] = []
    try:
        wait_until(lambda: client.llen(f"{flags}:started") == 1, "the first delivery to start")
        queue.push_job_id(first.id)
        workers += start_workers(url, flags, 1)  # a burst worker that finds the job queued
        # Skipped (its worker quits while the first still runs), or (the bug) running beside
        # the first: either ends the wait.
        wait_until(
            lambda: workers[1].poll() is not None or client.llen(f"{flags}:started") == 2,
            "the second delivery to be handled",
        )
        concurrent = client.llen(f"{flags}:started")
    finally:
        client.rpush(f"{flags}:go", "1", "1")
        logs = [worker.communicate(timeout=WAIT)[0] for worker in workers]
    assert concurrent == 1, logs
    assert client.llen(f"{flags}:started") == 1, logs
    # Both deliveries finished, the second without running the body (newest result first);
    # the job is not marked skipped: it ran.
    assert [result.return_value for result in first.results()] == ["ran 1", None], logs
    assert not was_skipped(first)
    assert not list(job_locker(client).list(f"{polling_job.__module__}.polling_job"))
    client.delete(f"{flags}:started", f"{flags}:go")
