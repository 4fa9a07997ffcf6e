"""``SingletonTask`` with ``lock_limit=2`` on a real Celery worker (threads pool) and the tests'
private Redis as broker: at most two runs per key at once, and two do run side by side.

The worker runs in this process, so its locks live on a memory store the test shares with it
(which grants counting leases); the options' checks need no worker at all.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from celery.contrib.testing.worker import start_worker
from lease_lock import Locker, MemoryBackend, ValidationError
from lease_lock.contrib.celery import SingletonTask

from tests.support.counted_runs import RUN_WAIT, count_this_run, counts_seen, let_runs_end, two_started_two_skipped

# Celery's Redis result backend calls redis-py's deprecated setex(); that is Celery's to fix.
pytestmark = pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning")

app = Celery("lease_lock_celery_counting_tests")
app.conf.update(
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    task_serializer="json",
    result_serializer="json",
)


@app.task(base=SingletonTask, lock_key="batch:{0}", lock_limit=2)
def batch(flags: str, redis_url: str) -> str:
    """A counted run (see tests.support.counted_runs)."""
    return count_this_run(flags, redis_url)


@pytest.fixture
def worker(redis_server: Any) -> Iterator[Locker]:
    """A threads worker with room for four runs at once; its locker (returned) on a memory store."""
    locker = Locker(MemoryBackend(), fencing=True)
    app.conf.update(
        broker_url=redis_server.url, result_backend=redis_server.url, lease_lock_locker=locker,
        task_default_queue=f"ll-celery-count-{uuid.uuid4().hex[:8]}",
    )
    with start_worker(app, pool="threads", concurrency=4, perform_ping_check=False, loglevel="WARNING"):
        yield locker
    locker.close()


def test_at_most_two_runs_per_key_at_once_and_two_do_run_together(redis_server: Any, worker: Locker) -> None:
    flags = f"ll-celery-count-{uuid.uuid4().hex}"
    client = redis.Redis.from_url(redis_server.url)
    results = [batch.delay(flags, redis_server.url) for _ in range(4)]
    try:
        two_started_two_skipped(client, flags, lambda: sum(result.ready() for result in results))
        state = worker.get(f"batch:{flags}")
    finally:
        let_runs_end(client, flags, 4)
    outcomes = [result.get(timeout=RUN_WAIT) for result in results]
    seen = counts_seen(client, flags)
    # The second run started while the first ran: two at once, never three.
    assert seen == [1, 2]
    assert sorted(outcomes, key=lambda outcome: outcome is None) == ["ran", "ran", None, None]
    assert (state.limit, len(state.holders)) == (2, 2)
    assert not worker.get(f"batch:{flags}").held


def _job() -> None:
    """A task body that is never run."""


def _define(**options: Any) -> Any:
    return app.task(base=SingletonTask, name=f"limit-{uuid.uuid4().hex}", shared=False, **options)(_job).name


def test_lock_limit_is_checked_when_the_task_is_defined() -> None:
    for bad in (0, -1, 2.0, "2", True):
        with pytest.raises(ValidationError, match="lock_limit must be an int from 1"):
            _define(lock_limit=bad)
    with pytest.raises(ValidationError, match=r"lock_on_enqueue cannot go with lock_limit=3: .* drop lock_on_enqueue"):
        _define(lock_limit=3, lock_on_enqueue=True)
    # One run at a time is what lock_on_enqueue keeps anyway.
    assert _define(lock_limit=1, lock_on_enqueue=True)
    assert _define(lock_limit=3)
