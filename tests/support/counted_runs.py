"""Task runs that count, in Redis, how many runs of their key are under way: what the Celery and
RQ counting tests run on real workers, and how they read it back.

A run adds one to ``<flags>:running``, notes the count it started at in ``<flags>:seen``, and
waits for a ``<flags>:go`` entry before it ends; a test lets every run end by pushing one entry
per run.
"""

from __future__ import annotations

from typing import Callable

import redis

from tests.support.polling import wait_until

__all__ = ["RUN_WAIT", "count_this_run", "counts_seen", "let_runs_end", "two_started_two_skipped"]

#: How long a run waits for the test to let it end (seconds).
RUN_WAIT = 30.0


def count_this_run(flags: str, redis_url: str) -> str:
    """The body of a counted run; returns ``"ran"``."""
    client = redis.Redis.from_url(redis_url)
    client.rpush(f"{flags}:seen", client.incr(f"{flags}:running"))
    try:
        wait_until(lambda: client.lpop(f"{flags}:go") is not None, "the test to let the run end", RUN_WAIT)
    finally:
        client.decr(f"{flags}:running")
    return "ran"


def two_started_two_skipped(client: redis.Redis, flags: str, done: Callable[[], int]) -> None:
    """Wait until two runs started and two others are ``done`` without running, or (a broken
    limit) a third run started: either ends the wait, only the first passes the tests' asserts."""
    wait_until(
        lambda: client.llen(f"{flags}:seen") > 2 or (client.llen(f"{flags}:seen") == 2 and done() == 2),
        "two runs to start and two to be skipped",
    )


def let_runs_end(client: redis.Redis, flags: str, runs: int) -> None:
    """Let up to ``runs`` runs end."""
    client.rpush(f"{flags}:go", *["1"] * runs)


def counts_seen(client: redis.Redis, flags: str) -> list[int]:
    """The counts the runs started at, in order, and the flags cleared."""
    seen = sorted(int(count) for count in client.lrange(f"{flags}:seen", 0, -1))
    client.delete(f"{flags}:seen", f"{flags}:running", f"{flags}:go")
    return seen
