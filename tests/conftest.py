"""Shared test configuration.

Fixtures that start private servers live in ``tests/support`` and are loaded here as plugins, so
every test directory can ask for them by name.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins: list[str] = [
    "tests.support.postgres_server",
    "tests.support.redis_server",
    "tests.support.http_server",
    "tests.support.etcd_server",
    "tests.support.mongo_server",
]


UNIT = Path(__file__).resolve().parent / "unit"


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """The workers of ``-n auto``: one more than the CPUs. Most of the suite waits on servers,
    subprocesses and leases running out rather than computing, so one worker per CPU leaves
    them idle much of the time. A run of ``tests/unit`` alone gets none: its few seconds of
    computing cost less than starting workers, each of which imports and collects it all again."""
    paths = [(config.invocation_params.dir / arg.split("::")[0]).resolve() for arg in config.args]
    if paths and all(path == UNIT or UNIT in path.parents for path in paths):
        return 0
    return (os.cpu_count() or 1) + 1
