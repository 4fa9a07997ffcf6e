"""``SingletonTask`` on real Celery workers and a real Redis broker (the tests' private server):
a worker in a thread (threads pool) and a worker subprocess (prefork pool), so the locker is
also exercised in processes forked after it was built.

The module doubles as the worker subprocess's app (``celery -A tests.integration.test_celery``):
the broker, lock URL and queue then come from the environment.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery, signals
from celery.contrib.testing.worker import start_worker
from lease_lock import Locker
from lease_lock.contrib.celery import SingletonTask, task_locker

from tests.support.polling import wait_until

# Celery's Redis result backend calls redis-py's deprecated setex(); that is Celery's to fix,
# and the warning must not fail the task inside the worker thread.
pytestmark = pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning")

WAIT = 30.0
_ENV = "LEASE_LOCK_TEST_CELERY"

app = Celery("lease_lock_celery_tests")
app.conf.update(
    broker_url=os.environ.get(f"{_ENV}_BROKER", "redis://127.0.0.1:1/0"),
    result_backend=os.environ.get(f"{_ENV}_BROKER", "redis://127.0.0.1:1/0"),
    lease_lock_url=os.environ.get(f"{_ENV}_LOCKS", "memory://"),
    task_default_queue=os.environ.get(f"{_ENV}_QUEUE", "celery"),
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    task_serializer="json",
    result_serializer="json",
)
#: The locker the worker's main process built before forking its pool (subprocess mode).
_PARENT_LOCKERS: list[Locker] = []


@signals.worker_init.connect
def _build_before_fork(**kwargs: Any) -> None:
    if os.environ.get(f"{_ENV}_PREBUILD"):
        _PARENT_LOCKERS.append(task_locker(app))


def _hold(flags: str, redis_url: str, label: str) -> None:
    """Announce the run, then block until the test pushes a go token."""
    client = redis.Redis.from_url(redis_url)
    client.rpush(f"{flags}:started", label)
    if client.blpop([f"{flags}:go"], timeout=WAIT) is None:
        raise RuntimeError("the test never let the task finish")


@app.task(base=SingletonTask, lock_key="report:{0}", bind=True)
def build_report(self: Any, day: str, flags: str, redis_url: str) -> dict[str, Any]:
    """Runs alone per day."""
    _hold(flags, redis_url, self.request.id)
    inherited = any(task_locker(app) is parent for parent in _PARENT_LOCKERS)
    return {"day": day, "pid": os.getpid(), "inherited_locker": inherited, "prebuilt": len(_PARENT_LOCKERS)}


@app.task(base=SingletonTask, lock_key=lambda flags, redis_url: f"retrying:{flags}", lock_on_busy="retry",
          lock_ttl=2, bind=True, max_retries=10)
def retrying(self: Any, flags: str, redis_url: str) -> int:
    """Retried (after the holder's remaining lease) while another run holds the key."""
    _hold(flags, redis_url, str(self.request.retries))
    return int(self.request.retries)


@app.task(base=SingletonTask, lock_key="fragile:{key}")
def loses_lock(key: str) -> str:
    """Its lease is force-released while it runs, as if it had run out."""
    assert task_locker(app).force_release(f"fragile:{key}")
    return "finished"


@app.task(base=SingletonTask, lock_key="tolerant:{key}", lock_fail_on_loss=False)
def tolerates_loss(key: str) -> str:
    """Like ``loses_lock`` but keeps its result."""
    assert task_locker(app).force_release(f"tolerant:{key}")
    return "kept"


@pytest.fixture(scope="module")
def celery_redis(redis_server: Any) -> str:
    """Point the app at the tests' Redis, on a queue of its own."""
    queue = f"ll-celery-{uuid.uuid4().hex[:8]}"
    app.conf.update(
        broker_url=redis_server.url, result_backend=redis_server.url,
        lease_lock_url=redis_server.url, task_default_queue=queue,
    )
    return queue


@pytest.fixture
def thread_worker(celery_redis: str) -> Iterator[None]:
    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False, loglevel="WARNING"):
        yield


def exactly_one_runs(redis_url: str) -> tuple[list[Any], int]:
    """Send two tasks with the same key at once; return their results and how many started."""
    flags = f"ll-celery-{uuid.uuid4().hex}"
    client = redis.Redis.from_url(redis_url)
    results = [build_report.delay("mon", flags, redis_url) for _ in range(2)]
    try:
        # Either the second was skipped while the first held the key, or (a broken lock) both
        # bodies started; both outcomes end the wait, and only the first passes the asserts.
        wait_until(
            lambda: client.llen(f"{flags}:started") >= 2
            or (client.llen(f"{flags}:started") == 1 and any(result.ready() for result in results)),
            "one run to start and the other to be skipped",
        )
    finally:
        client.rpush(f"{flags}:go", "1", "1")
    outcomes = [result.get(timeout=WAIT) for result in results]
    started = int(client.llen(f"{flags}:started"))
    client.delete(f"{flags}:started", f"{flags}:go")
    return outcomes, started


def test_two_tasks_with_one_key_on_a_threads_worker(redis_server: Any, thread_worker: None) -> None:
    outcomes, started = exactly_one_runs(redis_server.url)
    assert started == 1
    assert sorted(outcomes, key=lambda outcome: outcome is None) == [
        {"day": "mon", "pid": os.getpid(), "inherited_locker": False, "prebuilt": 0}, None,
    ]
    assert not task_locker(app).get("report:mon").held


def test_busy_retry_runs_after_the_holder(redis_server: Any, thread_worker: None) -> None:
    flags = f"ll-celery-{uuid.uuid4().hex}"
    client = redis.Redis.from_url(redis_server.url)
    first = retrying.delay(flags, redis_server.url)
    wait_until(lambda: client.llen(f"{flags}:started") == 1, "the first run to start")
    second = retrying.delay(flags, redis_server.url)
    try:
        wait_until(lambda: second.state == "RETRY", "the second run to be retried")
    finally:
        client.rpush(f"{flags}:go", "1", "1")
    assert first.get(timeout=WAIT) == 0
    assert second.get(timeout=WAIT) >= 1
    client.delete(f"{flags}:started", f"{flags}:go")


def test_a_lost_lock_fails_the_task_unless_told_otherwise(thread_worker: None) -> None:
    key = uuid.uuid4().hex
    failed = loses_lock.delay(key)
    failed.get(timeout=WAIT, propagate=False)
    assert failed.state == "FAILURE"
    assert "LockLostError" in (failed.traceback or "")
    assert tolerates_loss.delay(key).get(timeout=WAIT) == "kept"


def test_bad_options_fail_when_the_task_is_defined() -> None:
    def job() -> None:
        """A task body that is never run."""

    with pytest.raises(ValueError, match="lock_on_busy"):
        assert app.task(base=SingletonTask, lock_on_busy="wait", name=f"bad-{uuid.uuid4().hex}", shared=False)(job).name
    with pytest.raises(ValueError, match="lock_ttl"):
        assert app.task(base=SingletonTask, lock_ttl=0, name=f"bad-{uuid.uuid4().hex}", shared=False)(job).name


def test_two_tasks_with_one_key_on_a_prefork_worker_subprocess(redis_server: Any, celery_redis: str) -> None:
    environment = {
        **os.environ,
        f"{_ENV}_BROKER": redis_server.url, f"{_ENV}_LOCKS": redis_server.url,
        f"{_ENV}_QUEUE": celery_redis, f"{_ENV}_PREBUILD": "1",
    }
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tests.integration.test_celery", "worker", "--pool", "prefork",
         "--concurrency", "2", "-O", "fair", "--loglevel", "WARNING", "--without-heartbeat", "--without-mingle",
         "--without-gossip"],
        env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        outcomes, started = exactly_one_runs(redis_server.url)
    finally:
        worker.send_signal(signal.SIGTERM)
        log, _ = worker.communicate(timeout=WAIT)
    assert started == 1, log
    ran = [outcome for outcome in outcomes if outcome is not None]
    assert len(ran) == 1 and outcomes.count(None) == 1, log
    # The pool child built its own locker instead of using the one built before the fork.
    assert ran[0]["pid"] not in (os.getpid(), worker.pid)
    assert ran[0]["prebuilt"] == 1 and ran[0]["inherited_locker"] is False
