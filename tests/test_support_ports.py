"""The ports the tests' private servers listen on: distinct, outside the kernel's ephemeral
range, and a cluster whose member finds its port taken starts again on other ports."""

from __future__ import annotations

import shutil
import socket
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import psycopg2
import pytest

from tests.support import etcd_server, ports, postgres_server
from tests.support.etcd_server import EtcdFactory


def test_ports_are_never_handed_out_twice_and_stay_below_the_ephemeral_range() -> None:
    chosen = [ports.free_port() for _ in range(200)]
    assert len(set(chosen)) == len(chosen)
    floor = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert max(chosen) < max(floor, 11000)


def test_a_cluster_node_port_leaves_its_bus_port_free() -> None:
    port = ports.free_port(with_cluster_bus=True)
    assert port + ports.CLUSTER_BUS_OFFSET <= 65535
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", port + ports.CLUSTER_BUS_OFFSET))


def test_each_xdist_worker_draws_from_a_slice_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
    slices = []
    for worker in ("gw0", "gw1", "gw2"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        slices.append(set(ports._worker_slice(10000, 20000)))
    assert all(len(share) >= 3000 for share in slices)
    assert not (slices[0] & slices[1] or slices[1] & slices[2] or slices[0] & slices[2])


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port some other process is listening on."""
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", ports.free_port()))
        squatter.listen()
        yield squatter.getsockname()[1]


class FirstATakenPort:
    """Stands in for ``free_port``: the taken port first, then free ones."""

    def __init__(self, taken_port: int) -> None:
        self.taken_port = taken_port
        self.handed: list[int] = []

    def __call__(self) -> int:
        self.handed.append(self.taken_port if not self.handed else ports.free_port())
        return self.handed[-1]


def test_an_etcd_member_whose_port_was_taken_starts_again_on_other_ports(
    etcd_factory: EtcdFactory, taken_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    chooser = FirstATakenPort(taken_port)
    monkeypatch.setattr(etcd_server, "free_port", chooser)
    cluster = etcd_factory.cluster(members=1)
    try:
        assert cluster.members[0].client_port != taken_port
        assert len(chooser.handed) == 4  # two ports for the try that failed, two for the one that served
    finally:
        cluster.close()


def test_a_private_postgres_whose_port_was_taken_starts_on_another_port(
    taken_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    chooser = FirstATakenPort(taken_port)
    monkeypatch.setattr(postgres_server, "free_port", chooser)
    server = postgres_server.start_private_postgres()
    try:
        assert server.port != taken_port and len(chooser.handed) == 2
        with closing(psycopg2.connect(server.dsn)) as connection, connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            assert cursor.fetchone() == (1,)
    finally:
        server.stop()
        assert server.datadir is not None
        shutil.rmtree(server.datadir, ignore_errors=True)
