"""RQ with counting keys: ``singleton(limit=2)`` jobs run by real ``rq worker --burst`` processes
(at most two runs of a key at once, and two do run together), on each lock store that grants
counting leases (skipped, saying so, on one that does not yet); ``enqueue_once`` refusing
``lock_limit`` > 1, and ``singleton``'s limit in-process on a memory store.

The module doubles as the job module the workers import: in a worker, ``LEASE_LOCK_URL`` names
the lock store.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import pytest
from lease_lock import Locker, MemoryBackend, ValidationError
from lease_lock.contrib.rq import enqueue_once, singleton, was_skipped

from tests.integration.test_rq import WAIT, _fresh_queue, finished, start_workers
from tests.support.counted_runs import count_this_run, counts_seen, let_runs_end, two_started_two_skipped


@singleton(lambda flags, redis_url: f"rq-limit:{flags}", limit=2)
def limited_job(flags: str, redis_url: str) -> str:
    """A counted run (see tests.support.counted_runs)."""
    return count_this_run(flags, redis_url)


@pytest.fixture(params=["sqlite", "redis"])
def counting_store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The workers' ``LEASE_LOCK_URL``: a SQLite file, or the tests' Redis (which also holds the
    queue)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'locks.db'}"
    return str(request.getfixturevalue("redis_server").url)


def test_at_most_two_jobs_of_a_key_run_at_once_on_real_workers(redis_server: Any, counting_store: str) -> None:
    url = redis_server.url
    client, flags, queue = _fresh_queue(url)
    jobs = [queue.enqueue(limited_job, flags, url) for _ in range(4)]
    workers = start_workers(url, flags, 4, {**os.environ, "LEASE_LOCK_URL": counting_store})
    logs: list[Optional[str]] = []
    try:
        two_started_two_skipped(client, flags, lambda: sum(finished(job) for job in jobs))
    finally:
        let_runs_end(client, flags, 4)
        logs = [worker.communicate(timeout=WAIT)[0] for worker in workers]
    seen = counts_seen(client, flags)
    # The second job started while the first ran: two at once, never three.
    assert seen == [1, 2], logs
    assert all(finished(job) for job in jobs), logs
    assert sorted(str(job.return_value()) for job in jobs) == ["None", "None", "ran", "ran"], logs
    assert sum(was_skipped(job) for job in jobs) == 2


def test_singleton_limit_runs_while_a_place_is_free() -> None:
    shared = Locker(MemoryBackend())

    @singleton("exports", locker=shared, limit=2)
    def export() -> int:
        return len(shared.get("exports").holders)

    held = shared.acquire("exports", limit=2)
    assert export() == 2
    also = shared.acquire("exports", limit=2)
    assert export() is None
    assert held.release() and also.release()
    shared.close()
    with pytest.raises(ValidationError, match="limit must be an int from 1"):
        singleton(limit=0)


def test_enqueue_once_refuses_a_lock_limit_above_one_before_anything_is_sent() -> None:
    class Unreachable:
        """A queue that fails any use: nothing may be claimed nor sent."""

        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"the queue was used: {name}")

    with pytest.raises(ValidationError, match=(
        r"enqueue_once cannot go with lock_limit=2: .* send the job with queue.enqueue and decorate "
        r"its function with singleton\(limit=2\)"
    )):
        enqueue_once(Unreachable(), limited_job, "flags", "redis://", lock_limit=2)
    with pytest.raises(ValidationError, match="lock_limit must be an int from 1"):
        enqueue_once(Unreachable(), limited_job, "flags", "redis://", lock_limit=0)
