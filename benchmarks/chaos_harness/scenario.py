"""Runs one scenario: start the workers, inject one kind of fault repeatedly, check the logs.

A :class:`Target` names the backend under test: its URL, the server handle the restart and kill
injectors need, and where the fenced resource lives. :func:`run_scenario` returns the checker's
:class:`~.checker.Report`; the logs stay in the work directory for a closer look.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from lease_lock.backends import backend_from_url

from .checker import Report, check
from .clockctl import ClockControl
from .eventlog import EventLog, host_now, read_log
from .faults import FAULTS, NEEDS_CLOCK, NEEDS_PROXY, FaultContext, WorkerHandle
from .proxy import ProxyGroup
from .resource import open_resource

__all__ = ["REPO_ROOT", "Settings", "Target", "run_scenario"]

#: The repository root: workers run with it on ``sys.path`` so ``benchmarks`` imports.
REPO_ROOT = Path(__file__).resolve().parents[2]
_WORKER_START_TIMEOUT = 30.0


@dataclass
class Target:
    """A backend under test.

    ``url`` is the backend URL; ``server`` the handle with ``restart()`` (a private server) or
    ``None``; ``resource`` the fenced resource URL.
    """

    backend: str
    url: str
    resource: str
    server: Any = None

    def servers(self) -> list[tuple[str, int]]:
        """The ``(host, port)`` of every server ``url`` names (an etcd URL names several,
        comma-separated)."""
        hosts = urllib.parse.urlsplit(self.url).netloc.rpartition("@")[2]
        named = [urllib.parse.urlsplit(f"//{item}") for item in hosts.split(",")]
        return [(parts.hostname or "127.0.0.1", parts.port or 0) for parts in named]

    def via(self, ports: list[int]) -> str:
        """``url`` with its servers replaced by ``127.0.0.1:port`` for each of ``ports`` (the
        proxies, in the order of :meth:`servers`)."""
        parts = urllib.parse.urlsplit(self.url)
        userinfo = parts.netloc.rpartition("@")[0]
        hosts = ",".join(f"127.0.0.1:{port}" for port in ports)
        netloc = f"{userinfo}@{hosts}" if userinfo else hosts
        return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


@dataclass
class Settings:
    """Workload size and timing of one scenario."""

    workers: int = 8
    seconds: float = 30.0
    keys: int = 4
    ttl: float = 2.0
    hold: tuple[float, float] = (0.2, 1.5)
    work: float = 0.05
    seed: int = 0


def _spawn(target: Target, settings: Settings, workdir: Path, index: int, url: str,
           clock: Optional[Path], namespace: str) -> subprocess.Popen[bytes]:
    command = [
        sys.executable, "-m", "benchmarks.chaos_harness.worker",
        "--url", url, "--resource", target.resource, "--log", str(workdir / f"worker-{index}.log"),
        "--worker", str(index), "--keys", str(settings.keys), "--namespace", namespace,
        "--go", str(workdir / "go"), "--ttl", repr(settings.ttl), "--hold", *map(repr, settings.hold),
        "--work", repr(settings.work), "--acquire-timeout", repr(settings.ttl), "--seed", str(settings.seed),
    ]
    if clock is not None:
        command += ["--clock-file", str(clock)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    stderr = open(workdir / f"worker-{index}.err", "wb")  # noqa: SIM115 - handed to the child
    try:
        return subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=stderr, stderr=stderr)
    finally:
        stderr.close()


def _wait_started(workdir: Path, count: int, processes: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + _WORKER_START_TIMEOUT
    while time.monotonic() < deadline:
        started = sum(
            1 for index in range(count)
            if (workdir / f"worker-{index}.log").exists()
            and any(event["ev"] == "start" for event in read_log(workdir / f"worker-{index}.log"))
        )
        if started == count:
            return
        if any(process.poll() not in (None, 0) for process in processes):
            break
        time.sleep(0.05)
    raise RuntimeError(f"workers did not start; see {workdir}/worker-*.err")


def run_scenario(target: Target, fault: str, settings: Settings, workdir: Path) -> Report:
    """Run ``fault`` against ``target`` with ``settings``; logs go to ``workdir``."""
    inject, backends = FAULTS[fault]
    if target.backend not in backends:
        raise ValueError(f"fault {fault!r} does not apply to {target.backend}")
    workdir.mkdir(parents=True, exist_ok=True)
    namespace = f"chaos-{fault}-{os.getpid()}-{int(time.time() * 1000) % 10**8}"
    keys = [f"{namespace}:{index}" for index in range(settings.keys)]
    resource = open_resource(target.resource)
    resource.setup(keys)
    admin = backend_from_url(target.url)
    log = EventLog(workdir / "faults.log")
    proxies: list[ProxyGroup] = []
    processes: list[subprocess.Popen[bytes]] = []
    try:
        handles = []
        for index in range(settings.workers):
            url, proxy, clock = target.url, None, None
            if fault in NEEDS_PROXY:
                proxy = ProxyGroup(target.servers())
                proxies.append(proxy)
                url = target.via(proxy.ports)
            if fault in NEEDS_CLOCK:
                clock = ClockControl(workdir / f"clock-{index}.bin", create=True)
            process = _spawn(target, settings, workdir, index, url, clock.path if clock else None, namespace)
            processes.append(process)
            handles.append(WorkerHandle(index, process.pid, clock, proxy))
        _wait_started(workdir, settings.workers, processes)
        # Every worker is connected: start the clock for all of them at once.
        until = host_now() + settings.seconds
        (workdir / "go.tmp").write_text(repr(until))
        (workdir / "go.tmp").rename(workdir / "go")
        context = FaultContext(
            target.backend, settings.ttl, keys, handles, admin, log, target.server,
            rng=random.Random(settings.seed),
        )
        # Inject at least once, then until two TTLs before the end, so the last fault's effects
        # play out while the workers still run.
        while True:
            time.sleep(settings.ttl)
            inject(context)
            if host_now() + 3 * settings.ttl >= until:
                break
        for process in processes:
            remaining = max(1.0, until - host_now() + _WORKER_START_TIMEOUT)
            try:
                process.wait(remaining)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        for proxy in proxies:
            proxy.close()
        log.close()
        resource.close()
        admin.close()
    # A fresh connection: the setup one may have been cut by the faults (restart, kill).
    reader = open_resource(target.resource)
    try:
        history = reader.history()
    finally:
        reader.close()
    report = check(target.backend, fault, sorted(workdir.glob("worker-*.log")), workdir / "faults.log", history)
    report.seconds, report.ttl = settings.seconds, settings.ttl
    for index, process in enumerate(processes):
        if process.returncode != 0:
            tail = (workdir / f"worker-{index}.err").read_text(errors="replace")[-800:]
            report.worker_failures.append(f"worker {index} exited {process.returncode}: {tail}")
    return report
