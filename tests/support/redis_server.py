"""Private redis-server instances for the test session, on free loopback ports.

Every test that needs Redis asks for one of these fixtures instead of the machine's shared
server, so tests may restart, kill, flush or reconfigure their server freely:

- ``redis_server`` (session scope): one standalone server shared by the whole session. Tests
  that use it pick unique keys and never restart it. ``.url``, ``.port``, ``.pid``, ``.host``.
- ``redis_factory`` (session scope): a :class:`RedisFactory` that starts more servers on demand
  and stops them all at the end of the session:

  - ``redis_factory.server(*extra_args)`` a fresh standalone server (yours to restart or kill);
  - ``redis_factory.replica(primary)`` a server started with ``--replicaof`` the primary,
    returned once the replica reports its link up;
  - ``redis_factory.cluster(nodes=3)`` a :class:`RedisClusterNodes` whose nodes own every slot;
  - ``redis_factory.sentinel(primary, service)`` a Sentinel monitoring ``primary``.

:class:`RedisServer` has ``restart()`` (same port, no persistence, so all data is lost),
``stop()`` (SIGTERM, then SIGKILL), ``kill()`` (SIGKILL, as a crash), ``client()`` and ``log()``.
Servers run with no RDB and no AOF in a temporary directory and bind 127.0.0.1 only.

To fail a client's connection while the server and its data live on, put
``benchmarks.chaos_harness.proxy.TcpProxy`` between them.

The ``redis-server`` binary comes from ``PATH`` (or ``$REDIS_SERVER_BIN``). When it is missing the
tests that need it are skipped on a developer's machine and FAIL when the ``CI`` environment
variable is set, so a CI without Redis can never pass by skipping. A failing test that used a
server gets the tail of that server's log in its report.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import pytest

from tests.support.ports import free_port
from tests.support.processes import kill_process, log_tail, stop_process

__all__ = [
    "RedisClusterNodes",
    "RedisFactory",
    "RedisServer",
    "redis_factory",
    "redis_server",
    "require_redis_binary",
]

_START_TIMEOUT = 20.0


def require_redis_binary(name: str = "redis-server") -> str:
    """The path of a Redis binary; fails under ``CI``, skips elsewhere, when it is missing."""
    override = os.environ.get("REDIS_SERVER_BIN") if name == "redis-server" else None
    path = override or shutil.which(name)
    if path is None:
        message = f"{name} is not on PATH (install the redis-server package)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def _ping(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=1.0) as conn:
        conn.sendall(b"PING\r\n")
        return conn.recv(64)


class RedisServer:
    """One redis-server process on a loopback port, in a directory of its own."""

    def __init__(
        self,
        binary: str,
        workdir: Path,
        extra_args: tuple[str, ...] = (),
        config: Optional[str] = None,
        cluster_node: bool = False,
    ) -> None:
        self.binary = binary
        self.workdir = workdir
        self.extra_args = extra_args
        self.config = config
        self.cluster_node = cluster_node
        self.host = "127.0.0.1"
        self.port = 0
        self._process: Optional[subprocess.Popen[bytes]] = None

    @property
    def pid(self) -> int:
        """The running server's process id."""
        if self._process is None:
            raise RuntimeError("the server is not running")
        return self._process.pid

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        return f"redis://{self.host}:{self.port}/0"

    @property
    def running(self) -> bool:
        """``True`` while the process is alive."""
        return self._process is not None and self._process.poll() is None

    @property
    def logfile(self) -> Path:
        """The server's log file."""
        return self.workdir / "redis.log"

    def start(self) -> RedisServer:
        """Start on the current port, or on a free one the first time; wait until it answers."""
        for _attempt in range(5):
            if not self.port:
                self.port = free_port(with_cluster_bus=self.cluster_node)
            self._launch()
            if self._wait_ready():
                return self
            # Another process took the port between our probe and the bind: try another one.
            self.stop()
            self.port = 0
        raise RuntimeError(f"redis-server did not start; log:\n{self.log()}")

    def _launch(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        args = [self.binary]
        if self.config is not None:
            # Sentinel rewrites its config file, so each start gets a fresh writable copy.
            config_file = self.workdir / "redis.conf"
            config_file.write_text(self.config)
            args.append(str(config_file))
        args += [
            "--port", str(self.port),
            "--bind", self.host,
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.workdir),
            "--logfile", str(self.logfile),
            "--daemonize", "no",
            *self.extra_args,
        ]
        self._process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            if not self.running:
                return False
            try:
                reply = _ping(self.port)
            except OSError:
                time.sleep(0.01)
                continue
            # A server still loading (or a foreign process on the port) does not answer PONG;
            # one started with --requirepass answers NOAUTH.
            if reply.startswith((b"+PONG", b"-NOAUTH")):
                return True
            time.sleep(0.01)
        return False

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 10 s). Idempotent."""
        process, self._process = self._process, None
        stop_process(process)

    def kill(self) -> None:
        """Kill the server at once, as a crash would."""
        process, self._process = self._process, None
        kill_process(process)

    def restart(self) -> RedisServer:
        """Stop and start again on the same port; without persistence every key is gone."""
        self.stop()
        return self.start()

    def client(self, **options: Any) -> Any:
        """A new ``redis.Redis`` for this server (the caller closes it)."""
        import redis

        return redis.Redis(host=self.host, port=self.port, **options)

    def log(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the server's log."""
        return log_tail(self.logfile, lines)


@dataclass
class RedisClusterNodes:
    """The primaries of a small Redis Cluster; every slot is assigned and the cluster is ok."""

    servers: list[RedisServer]

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        """``(host, port)`` of every node."""
        return [(server.host, server.port) for server in self.servers]

    @property
    def url(self) -> str:
        """A ``redis://`` URL of the first node (add ``?cluster=true`` for lease_lock)."""
        return self.servers[0].url

    def client(self, **options: Any) -> Any:
        """A new ``redis.cluster.RedisCluster`` (the caller closes it)."""
        from redis.cluster import ClusterNode, RedisCluster

        nodes = [ClusterNode(host, port) for host, port in self.startup_nodes]
        return RedisCluster(startup_nodes=nodes, **options)


class RedisFactory:
    """Starts private servers on demand and stops all of them at :meth:`close`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.servers: list[RedisServer] = []

    def server(
        self, *extra_args: str, config: Optional[str] = None, cluster_node: bool = False
    ) -> RedisServer:
        """A new server, started (``config`` is the text of a config file).

        A ``cluster_node`` gets a port whose cluster bus port (10000 above) is free too.
        """
        binary = require_redis_binary()
        workdir = Path(tempfile.mkdtemp(prefix="redis-", dir=self.root))
        server = RedisServer(binary, workdir, tuple(extra_args), config, cluster_node)
        self.servers.append(server)
        return server.start()

    def sentinel(self, primary: RedisServer, service: str = "leases") -> RedisServer:
        """A Sentinel (quorum 1) that monitors ``primary`` under the name ``service``."""
        config = f"sentinel monitor {service} {primary.host} {primary.port} 1\n"
        return self.server("--sentinel", config=config)

    def replica(self, primary: RedisServer, *extra_args: str) -> RedisServer:
        """A server replicating ``primary``, returned once its link to the primary is up."""
        source = primary.client()
        try:
            # Redis 7 waits 5 s before a diskless full sync, hoping more replicas join.
            source.config_set("repl-diskless-sync-delay", 0)
        finally:
            source.close()
        replica = self.server("--replicaof", primary.host, str(primary.port), *extra_args)
        client = replica.client()
        try:
            deadline = time.monotonic() + _START_TIMEOUT
            while client.info("replication").get("master_link_status") != "up":
                if time.monotonic() > deadline:
                    raise RuntimeError(f"replica did not sync; log:\n{replica.log()}")
                time.sleep(0.02)
        finally:
            client.close()
        return replica

    def cluster(self, nodes: int = 3) -> RedisClusterNodes:
        """``nodes`` cluster-enabled primaries sharing the 16384 slots, with no replicas."""
        servers = [
            self.server(
                "--cluster-enabled", "yes",
                "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", "5000",
                cluster_node=True,
            )
            for _ in range(nodes)
        ]
        clients = [server.client() for server in servers]
        try:
            # Assigning slots and meeting by hand is quicker than `redis-cli --cluster create`,
            # which sleeps a whole second between its polls.
            per_node = 16384 // nodes
            for index, client in enumerate(clients):
                first = index * per_node
                last = 16383 if index == nodes - 1 else first + per_node - 1
                client.execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
            for server in servers[1:]:
                clients[0].execute_command("CLUSTER", "MEET", server.host, server.port)
            deadline = time.monotonic() + _START_TIMEOUT
            while not all(self._cluster_ready(client, nodes) for client in clients):
                if time.monotonic() > deadline:
                    logs = "\n".join(server.log(10) for server in servers)
                    raise RuntimeError(f"cluster did not converge; logs:\n{logs}")
                time.sleep(0.02)
        finally:
            for client in clients:
                client.close()
        return RedisClusterNodes(servers)

    @staticmethod
    def _cluster_ready(client: Any, nodes: int) -> bool:
        info = client.execute_command("CLUSTER", "INFO")
        text = info.decode() if isinstance(info, bytes) else str(info)
        fields = dict(
            line.split(":", 1) for line in text.splitlines() if ":" in line
        )
        return (
            fields.get("cluster_state") == "ok"
            and fields.get("cluster_known_nodes") == str(nodes)
            and fields.get("cluster_slots_assigned") == "16384"
        )

    def logs(self) -> str:
        """The log tails of every server this factory started."""
        return "\n".join(f"--- redis :{server.port}\n{server.log()}" for server in self.servers)

    def close(self) -> None:
        """Stop every server this factory started."""
        for server in self.servers:
            server.stop()
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_factory() -> Iterator[RedisFactory]:
    """Starts private redis-servers for the session; stops them all at its end."""
    factory = RedisFactory(Path(tempfile.mkdtemp(prefix="lease-lock-redis-")))
    yield factory
    factory.close()


@pytest.fixture(scope="session")
def redis_server(redis_factory: RedisFactory) -> RedisServer:
    """One private standalone redis-server shared by the session (do not restart it)."""
    return redis_factory.server()


@pytest.fixture
def private_redis_server(redis_factory: RedisFactory) -> Iterator[RedisServer]:
    """A redis-server of the test's own, which it may stop, restart, pause or cut off."""
    server = redis_factory.server()
    yield server
    server.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Attach the log tails of the servers a failing test used to its report."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and "redis_factory" in getattr(item, "fixturenames", ()):
        factory = item.funcargs.get("redis_factory") if hasattr(item, "funcargs") else None
        if isinstance(factory, RedisFactory) and factory.servers:
            report.sections.append(("redis-server logs", factory.logs()))
