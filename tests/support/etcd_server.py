"""Private etcd clusters for the tests, on free loopback ports, each member in a directory of its own.

- ``etcd_factory`` (session scope): an :class:`EtcdFactory` that starts clusters on demand and
  stops them all at the end of the session: ``etcd_factory.cluster(members=3)``, optionally
  with TLS (``tls=True``: server certificates from a private CA, client certificates checked) or
  with extra flags for every member.
- ``etcd_server`` (session scope): one single-member cluster shared by the session; tests use
  unique keys and never stop it.
- ``etcd_cluster`` (session scope): one three-member cluster shared by the session, same rules.
- ``private_etcd_cluster``: a fresh three-member cluster of the test's own, which it may kill,
  pause (SIGSTOP) or restart.

:class:`EtcdMember` has ``stop()`` (SIGTERM, then SIGKILL), ``kill()`` (SIGKILL, as a crash),
``pause()``/``resume()`` (SIGSTOP/SIGCONT), ``start()`` (again on the same ports and data
directory) and ``log()``. :class:`EtcdCluster` has ``url``, ``endpoints``, ``leader()``,
``wait_serving()`` and ``restart()`` (every member stopped, then all started on their data).

The ``etcd`` binary comes from ``$ETCD_BIN``, ``PATH`` or ``/usr/bin/etcd`` (Debian's
``etcd-server`` package; ``.ci/run`` installs it). When it is missing the tests that need it are
skipped on a developer's machine and FAIL when the ``CI`` environment variable is set. A failing
test that used a cluster gets the tail of every member's log in its report.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import pytest
import requests

from tests.support.ports import free_port
from tests.support.processes import kill_process, log_tail, stop_process
from tests.support.tls import make_certificates

__all__ = [
    "CountingSession",
    "EtcdCluster",
    "EtcdFactory",
    "EtcdMember",
    "etcd_cluster",
    "etcd_factory",
    "etcd_server",
    "find_etcd_binary",
    "line_places",
    "private_etcd_cluster",
    "queue_entries",
    "require_etcd_binary",
]

_START_TIMEOUT = 30.0
_START_ATTEMPTS = 3


def queue_entries(cluster: EtcdCluster, key: str, namespace: str = "lease_lock/") -> list[dict[str, Any]]:
    """The entries of ``key``'s hand-off queue in etcd, oldest first, read by hand."""
    start = namespace.encode() + b"\x00queue\x00" + key.encode() + b"\x00"
    body = {"key": base64.b64encode(start).decode(), "range_end": base64.b64encode(start[:-1] + b"\x01").decode()}
    answer = requests.post(cluster.endpoints[0] + "/v3/kv/range", json=body, timeout=10).json()
    return sorted(answer.get("kvs", []), key=lambda kv: int(kv["create_revision"]))


class CountingSession(requests.Session):
    """A session that counts the requests sent per path."""

    def __init__(self) -> None:
        super().__init__()
        self.paths: list[str] = []

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        self.paths.append(str(request.path_url))
        return super().send(request, **kwargs)


def line_places(cluster: EtcdCluster, key: str, namespace: str = "lease_lock/") -> list[dict[str, Any]]:
    """The places in ``key``'s line of waiters (``direct_handoff``), oldest first, read by hand."""
    start = namespace.encode() + b"\x00line\x00" + key.encode() + b"\x00"
    body = {"key": base64.b64encode(start).decode(), "range_end": base64.b64encode(start[:-1] + b"\x01").decode()}
    answer = requests.post(cluster.endpoints[0] + "/v3/kv/range", json=body, timeout=10).json()
    return sorted(answer.get("kvs", []), key=lambda kv: int(kv["create_revision"]))


def find_etcd_binary() -> Optional[str]:
    """The path of an ``etcd`` binary (``$ETCD_BIN``, ``PATH``, ``/usr/bin/etcd``), or ``None``."""
    path = os.environ.get("ETCD_BIN") or shutil.which("etcd")
    if path is None and os.access("/usr/bin/etcd", os.X_OK):
        path = "/usr/bin/etcd"
    return path


def require_etcd_binary() -> str:
    """The path of an ``etcd`` binary; fails under ``CI``, skips elsewhere, when it is missing."""
    path = find_etcd_binary()
    if path is None:
        message = "etcd is not on PATH (install the etcd-server package or set ETCD_BIN)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


class MemberExited(RuntimeError):
    """A member's process ended while the cluster was waiting for it to serve."""


class EtcdMember:
    """One etcd process: a client port, a peer port and a data directory."""

    def __init__(self, binary: str, workdir: Path, name: str, scheme: str) -> None:
        self.binary = binary
        self.workdir = workdir
        self.name = name
        self.scheme = scheme
        self.client_port = free_port()
        self.peer_port = free_port()
        self.args: list[str] = []
        self._process: Optional[subprocess.Popen[bytes]] = None
        self._log: Optional[object] = None

    @property
    def endpoint(self) -> str:
        """The member's client URL."""
        return f"{self.scheme}://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        """The member's peer URL."""
        return f"http://127.0.0.1:{self.peer_port}"

    @property
    def pid(self) -> int:
        """The running member's process id."""
        if self._process is None:
            raise RuntimeError("the member is not running")
        return self._process.pid

    @property
    def running(self) -> bool:
        """``True`` while the process is alive."""
        return self._process is not None and self._process.poll() is None

    @property
    def logfile(self) -> Path:
        """The member's log file (its stderr)."""
        return self.workdir / "etcd.log"

    def start(self) -> EtcdMember:
        """Start (again) on the member's ports and data directory; does not wait."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        with open(self.logfile, "ab") as log:
            self._process = subprocess.Popen(
                [self.binary, *self.args], stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir
            )
        return self

    def stop(self) -> None:
        """Stop the member (SIGCONT in case it is paused, SIGTERM, then SIGKILL). Idempotent."""
        process, self._process = self._process, None
        stop_process(process, resume=True)

    def kill(self) -> None:
        """Kill the member at once, as a crash would."""
        process, self._process = self._process, None
        kill_process(process)

    def pause(self) -> None:
        """SIGSTOP: the member keeps its sockets but answers nothing."""
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        os.kill(self.pid, signal.SIGCONT)

    def log(self, lines: int = 30) -> str:
        """The last ``lines`` lines of the member's log."""
        return log_tail(self.logfile, lines)


class EtcdCluster:
    """The members of one cluster, started together."""

    def __init__(self, members: list[EtcdMember], tls: Optional[dict[str, str]] = None) -> None:
        self.members = members
        self.tls = tls or {}

    @property
    def endpoints(self) -> list[str]:
        """Every member's client URL."""
        return [member.endpoint for member in self.members]

    @property
    def url(self) -> str:
        """An ``etcd://`` (or ``etcds://``) URL naming every member."""
        scheme = "etcds" if self.tls else "etcd"
        hosts = ",".join(f"127.0.0.1:{member.client_port}" for member in self.members)
        return f"{scheme}://{hosts}"

    def _post(
        self, member: EtcdMember, path: str, body: dict[str, object], timeout: float
    ) -> Optional[dict[str, object]]:
        import requests

        tls: dict[str, object] = {}
        if self.tls:
            tls = {"verify": self.tls["ca"], "cert": (self.tls["cert"], self.tls["key"])}
        try:
            answer = requests.post(member.endpoint + path, json=body, timeout=timeout, **tls).json()
        except (requests.RequestException, ValueError):
            return None
        return answer if isinstance(answer, dict) else None

    def _serves(self, member: EtcdMember) -> bool:
        answer = self._post(member, "/v3/kv/range", {"key": "AA=="}, 2.0)
        return answer is not None and "header" in answer

    def wait_serving(self, members: Optional[list[EtcdMember]] = None, timeout: float = _START_TIMEOUT) -> None:
        """Wait until every one of ``members`` (default: all running) answers a linearizable read."""
        waiting = [member for member in (members or self.members) if member.running]
        deadline = time.monotonic() + timeout
        while waiting:
            waiting = [member for member in waiting if not self._serves(member)]
            exited = [member.name for member in waiting if not member.running]
            if exited:
                raise MemberExited(f"etcd {', '.join(exited)} exited while starting; logs:\n{self.logs()}")
            if waiting and time.monotonic() > deadline:
                raise RuntimeError(f"etcd did not start serving; logs:\n{self.logs()}")
            if waiting:
                time.sleep(0.05)

    def leader(self) -> EtcdMember:
        """The member that leads now (asked of every running member)."""
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            for member in self.members:
                if not member.running:
                    continue
                status = self._post(member, "/v3/maintenance/status", {}, 1.0)
                header = status.get("header") if status else None
                if isinstance(header, dict) and status is not None and status.get("leader") == header.get("member_id"):
                    return member
            time.sleep(0.05)
        raise RuntimeError(f"no etcd leader; logs:\n{self.logs()}")

    def restart(self) -> None:
        """Stop every member, then start them all again on their data directories."""
        for member in self.members:
            member.stop()
        for member in self.members:
            member.start()
        self.wait_serving()

    def logs(self) -> str:
        """The log tails of every member."""
        return "\n".join(f"--- etcd {member.name} :{member.client_port}\n{member.log()}" for member in self.members)

    def close(self) -> None:
        """Stop every member."""
        for member in self.members:
            member.stop()


class EtcdFactory:
    """Starts private clusters on demand and stops all of them at :meth:`close`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.clusters: list[EtcdCluster] = []

    def cluster(self, members: int = 3, *, tls: bool = False, extra_args: tuple[str, ...] = ()) -> EtcdCluster:
        """A new cluster of ``members`` members, returned once every one serves reads."""
        binary = require_etcd_binary()
        workdir = Path(tempfile.mkdtemp(prefix="etcd-", dir=self.root))
        # The client certificate's name is the etcd user it authenticates as.
        certificates = make_certificates(workdir / "tls", "127.0.0.1", "localhost", common_name="root") if tls else None
        attempt = 0
        while True:
            attempt += 1
            cluster = self._start(binary, workdir / f"try{attempt}", members, certificates, extra_args)
            try:
                cluster.wait_serving()
                return cluster
            except MemberExited:
                # Another process bound one of the probed ports before the member did: the
                # log says "address already in use". A new set of ports and data directories.
                cluster.close()
                if attempt == _START_ATTEMPTS:
                    raise

    def _start(
        self,
        binary: str,
        workdir: Path,
        members: int,
        certificates: Optional[dict[str, str]],
        extra_args: tuple[str, ...],
    ) -> EtcdCluster:
        nodes = [
            EtcdMember(binary, workdir / f"m{index}", f"m{index}", "https" if certificates else "http")
            for index in range(members)
        ]
        initial = ",".join(f"{node.name}={node.peer_url}" for node in nodes)
        for node in nodes:
            node.args = [
                "--name", node.name,
                "--data-dir", str(node.workdir / "data"),
                "--listen-client-urls", node.endpoint,
                "--advertise-client-urls", node.endpoint,
                "--listen-peer-urls", node.peer_url,
                "--initial-advertise-peer-urls", node.peer_url,
                "--initial-cluster", initial,
                "--initial-cluster-state", "new",
                "--initial-cluster-token", workdir.name,
                *extra_args,
            ]
            if certificates is not None:
                node.args += [
                    "--cert-file", certificates["cert"],
                    "--key-file", certificates["key"],
                    "--trusted-ca-file", certificates["ca"],
                    "--client-cert-auth",
                ]
        cluster = EtcdCluster(nodes, certificates)
        self.clusters.append(cluster)
        for node in nodes:
            node.start()
        return cluster

    def logs(self) -> str:
        """The log tails of every member of every cluster."""
        return "\n".join(cluster.logs() for cluster in self.clusters)

    def close(self) -> None:
        """Stop every member this factory started."""
        for cluster in self.clusters:
            cluster.close()
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="session")
def etcd_factory() -> Iterator[EtcdFactory]:
    """Starts private etcd clusters for the session; stops them all at its end."""
    factory = EtcdFactory(Path(tempfile.mkdtemp(prefix="lease-lock-etcd-")))
    yield factory
    factory.close()


@pytest.fixture(scope="session")
def etcd_server(etcd_factory: EtcdFactory) -> EtcdCluster:
    """One private single-member cluster shared by the session (do not stop it)."""
    return etcd_factory.cluster(members=1)


@pytest.fixture
def etcd_backend(etcd_server: EtcdCluster) -> Iterator[Any]:
    """A plain ``EtcdBackend`` (no direct hand-off) on :func:`etcd_server`, closed at the end."""
    from lease_lock.backends.etcd import EtcdBackend

    backend = EtcdBackend.from_url(etcd_server.url)
    yield backend
    backend.close()


@pytest.fixture(scope="session")
def etcd_cluster(etcd_factory: EtcdFactory) -> EtcdCluster:
    """One private three-member cluster shared by the session (do not break it)."""
    return etcd_factory.cluster(members=3)


@pytest.fixture
def private_etcd_cluster(etcd_factory: EtcdFactory) -> Iterator[EtcdCluster]:
    """A three-member cluster of the test's own, to kill, pause or restart."""
    cluster = etcd_factory.cluster(members=3)
    yield cluster
    cluster.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Attach the log tails of the members a failing test used to its report."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and "etcd_factory" in getattr(item, "fixturenames", ()):
        factory = item.funcargs.get("etcd_factory") if hasattr(item, "funcargs") else None
        if isinstance(factory, EtcdFactory) and factory.clusters:
            report.sections.append(("etcd logs", factory.logs()))
