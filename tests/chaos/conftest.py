"""Fixtures of the chaos suite: backend targets for the harness in ``benchmarks/chaos_harness``.

Redis and PostgreSQL targets are private servers and the etcd target a private three-member
cluster (the restart, kill and member injectors need servers nobody else uses); SQLite targets
are files in the test's temp dir, as is the fenced resource of the Redis and etcd targets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
from benchmarks.chaos_harness.scenario import Target

from tests.support.etcd_server import EtcdCluster, EtcdFactory
from tests.support.postgres_server import PostgresServer
from tests.support.redis_server import RedisFactory, RedisServer

__all__ = ["chaos_etcd", "chaos_postgres", "chaos_redis", "chaos_target"]


@pytest.fixture(scope="module")
def chaos_redis(redis_factory: RedisFactory) -> RedisServer:
    """A private redis-server the chaos scenarios may restart and kill clients of."""
    return redis_factory.server()


@pytest.fixture(scope="module")
def chaos_etcd(etcd_factory: EtcdFactory) -> EtcdCluster:
    """A private three-member etcd cluster the chaos scenarios may kill, pause and restart."""
    return etcd_factory.cluster(members=3)


@pytest.fixture
def chaos_postgres(postgres_private_server: PostgresServer) -> PostgresServer:
    """The session's private PostgreSQL server (restartable)."""
    return postgres_private_server


@pytest.fixture
def chaos_target(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], Target]:
    """Builds the :class:`Target` for a backend name; servers are started on first use.
    ``etcd-direct`` is etcd with ``direct_handoff`` (a release hands the key to a waiter)."""

    def build(backend: str) -> Target:
        if backend == "sqlite":
            return Target("sqlite", f"sqlite:///{tmp_path}/locks.db", f"sqlite:///{tmp_path}/resource.db")
        if backend == "redis":
            server = request.getfixturevalue("chaos_redis")
            return Target("redis", server.url, f"sqlite:///{tmp_path}/resource.db", server)
        if backend in ("etcd", "etcd-direct"):
            cluster = request.getfixturevalue("chaos_etcd")
            # Every injector puts the members back; a scenario starts on a cluster that serves.
            cluster.wait_serving()
            url = cluster.url + ("?direct_handoff=true" if backend == "etcd-direct" else "")
            return Target("etcd", url, f"sqlite:///{tmp_path}/resource.db", cluster)
        server = request.getfixturevalue("chaos_postgres")
        return Target("postgres", f"{server.url}?table=chaos_leases", f"{server.url}?table=chaos_resource", server)

    return build
