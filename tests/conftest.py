"""Shared test configuration.

Fixtures that start private servers live in ``tests/support`` and are loaded here as plugins, so
every test directory can ask for them by name.
"""

from __future__ import annotations

import os

pytest_plugins: list[str] = [
    "tests.support.postgres_server",
    "tests.support.redis_server",
    "tests.support.http_server",
    "tests.support.etcd_server",
]


def pytest_xdist_auto_num_workers(config: object) -> int:
    """The workers of ``-n auto``: one more than the CPUs. Most of the suite waits on servers,
    subprocesses and leases running out rather than computing, so one worker per CPU leaves
    them idle much of the time."""
    return (os.cpu_count() or 1) + 1
