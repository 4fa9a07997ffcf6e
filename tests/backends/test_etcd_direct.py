"""The etcd backend's own connections: reused only while open, and never past a proxy."""

from __future__ import annotations

import uuid

import pytest
from benchmarks.chaos_harness.proxy import TcpProxy
from lease_lock.backends.etcd import EtcdBackend

from tests.support.etcd_server import EtcdCluster, EtcdFactory
from tests.support.ports import free_port


def test_a_connection_the_member_closed_while_idle_is_not_used_again(etcd_factory: EtcdFactory) -> None:
    # One member, so a request sent on a dead connection would have no other member to go to:
    # the call would fail instead of opening a new connection.
    cluster = etcd_factory.cluster(members=1)
    backend = EtcdBackend(cluster.endpoints)
    key, mine = f"test:direct:{uuid.uuid4().hex}", "d" * 32
    try:
        assert backend.acquire(key, mine, 30, "direct")
        cluster.restart()  # every member stops (closing its connections), then starts again
        assert backend.is_held(key, mine)
        assert backend.release(key, mine)
    finally:
        backend.close()
        cluster.close()


def test_a_member_the_environment_routes_through_a_proxy_is_reached_through_it(
    etcd_server: EtcdCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nothing listens at the endpoint itself: only a request sent through the proxy (the
    # session's way, which reads the environment) reaches etcd.
    proxy = TcpProxy("127.0.0.1", etcd_server.members[0].client_port)
    for name in ("HTTP_PROXY", "http_proxy"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{proxy.port}")
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    backend = EtcdBackend([f"http://127.0.0.1:{free_port()}"])
    key, mine = f"test:proxied:{uuid.uuid4().hex}", "p" * 32
    try:
        assert backend.acquire(key, mine, 30, "proxied")
        assert backend.extend(key, mine, 30)
        assert backend.release(key, mine)
    finally:
        backend.close()
        proxy.close()
