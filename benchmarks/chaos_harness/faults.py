"""Fault injectors. Each is small, runs in the runner process and logs a ``fault`` event.

Every injector has an ``inject(ctx)`` that performs one fault and returns when it is over (a
pause injector returns after SIGCONT). The runner calls it repeatedly, with a gap of one TTL in
between, for the length of the scenario. Targets are chosen among the current holders, found
through the backend's ``inspect`` (the owner label carries the worker number), so that a fault
hits someone it can hurt.

=============  ============================================================  ==================
name           what it does                                                  backends
=============  ============================================================  ==================
none           nothing: contention only                                      all
pause          SIGSTOP a holder for 1.5 TTL, then SIGCONT                    all
suspend        as ``pause``, and the holder's monotonic clock does not see   all
               the stop (only its wall clock does): a frozen VM; the pause
               detector of the lease clock must notice
clock-jump     step a holder's wall clock 2 TTL forward, next time back      all
restart        restart the server (Redis loses all data; PostgreSQL keeps    redis, postgres
               it), locks held
latency        add TTL/8 per direction to one holder's connections for 2 TTL redis, postgres
stall          hold all traffic of one holder for 1.5 TTL (silent peer)      redis, postgres
cut            reset every connection of one holder                          redis, postgres
kill           server-side: ``CLIENT KILL`` (Redis) or                       redis, postgres
               ``pg_terminate_backend`` (PostgreSQL) on every client
=============  ============================================================  ==================
"""

from __future__ import annotations

import os
import random
import signal
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from lease_lock.backends.base import Backend

from .clockctl import ClockControl
from .eventlog import EventLog, host_now
from .proxy import TcpProxy

__all__ = ["FAULTS", "FaultContext", "WorkerHandle", "supported"]


@dataclass
class WorkerHandle:
    """What an injector may touch of one worker."""

    index: int
    pid: int
    clock: Optional[ClockControl] = None
    proxy: Optional[TcpProxy] = None


@dataclass
class FaultContext:
    """What injectors work with."""

    backend: str
    ttl: float
    keys: list[str]
    workers: list[WorkerHandle]
    admin: Backend
    log: EventLog
    server: Any = None
    rng: random.Random = field(default_factory=random.Random)
    state: dict[str, Any] = field(default_factory=dict)

    def holder(self) -> WorkerHandle:
        """A worker that holds a key now (looked up for up to one TTL), else a random one."""
        deadline = host_now() + self.ttl
        while True:
            keys = list(self.keys)
            self.rng.shuffle(keys)
            for key in keys:
                try:
                    owner = self.admin.inspect(key).owner or ""
                except Exception:  # noqa: BLE001 - the server may be down (restart, kill)
                    owner = ""
                if owner.startswith("chaos-"):
                    index = int(owner[len("chaos-"):].split(":", 1)[0])
                    return self.workers[index]
            if host_now() > deadline:
                return self.rng.choice(self.workers)
            time.sleep(0.02)

    def record(self, kind: str, t0: float, **fields: Any) -> None:
        """Log one injected fault that lasted from ``t0`` until now."""
        self.log.write("fault", kind=kind, t0=t0, t1=host_now(), **fields)


def _stop(ctx: FaultContext, hide_from_clock: bool) -> None:
    worker = ctx.holder()
    t0 = host_now()
    os.kill(worker.pid, signal.SIGSTOP)
    try:
        time.sleep(1.5 * ctx.ttl)
    finally:
        if hide_from_clock and worker.clock is not None:
            # Written while the worker is stopped: it wakes to a monotonic clock that never moved.
            worker.clock.hide(host_now() - t0)
        os.kill(worker.pid, signal.SIGCONT)
    ctx.record("suspend" if hide_from_clock else "pause", t0, w=worker.index, stopped=True)


def pause(ctx: FaultContext) -> None:
    """SIGSTOP a holder for longer than its TTL, then SIGCONT."""
    _stop(ctx, hide_from_clock=False)


def suspend(ctx: FaultContext) -> None:
    """A pause the holder's monotonic clock does not see (a frozen VM)."""
    _stop(ctx, hide_from_clock=True)


def clock_jump(ctx: FaultContext) -> None:
    """Step a holder's wall clock by two TTLs, forward and back in turn."""
    worker = ctx.holder()
    assert worker.clock is not None
    step = 2 * ctx.ttl * (1 if ctx.state.setdefault("jumps", 0) % 2 == 0 else -1)
    ctx.state["jumps"] += 1
    t0 = host_now()
    worker.clock.jump_wall(step)
    ctx.record("clock-jump", t0, w=worker.index, step=step)


def restart(ctx: FaultContext) -> None:
    """Restart the server while locks are held."""
    t0 = host_now()
    ctx.server.restart()
    # Redis runs without persistence here: every lease and fence counter is gone.
    ctx.record("restart", t0, data_loss=ctx.backend == "redis")


def latency(ctx: FaultContext) -> None:
    """Slow one holder's network for two TTLs."""
    worker = ctx.holder()
    assert worker.proxy is not None
    t0 = host_now()
    worker.proxy.latency = ctx.ttl / 8
    try:
        time.sleep(2 * ctx.ttl)
    finally:
        worker.proxy.latency = 0.0
    ctx.record("latency", t0, w=worker.index)


def stall(ctx: FaultContext) -> None:
    """Hold one holder's traffic for longer than its TTL."""
    worker = ctx.holder()
    assert worker.proxy is not None
    t0 = host_now()
    worker.proxy.stall()
    try:
        time.sleep(1.5 * ctx.ttl)
    finally:
        worker.proxy.resume()
    ctx.record("stall", t0, w=worker.index)


def cut(ctx: FaultContext) -> None:
    """Reset every connection of one holder."""
    worker = ctx.holder()
    assert worker.proxy is not None
    t0 = host_now()
    count = worker.proxy.cut()
    ctx.record("cut", t0, w=worker.index, connections=count)


def kill(ctx: FaultContext) -> None:
    """Kill every client connection from the server side."""
    t0 = host_now()
    if ctx.backend == "redis":
        client = ctx.server.client()
        try:
            count = sum(int(client.client_kill_filter(_type=kind)) for kind in ("normal", "pubsub"))
        finally:
            client.close()
    else:
        import psycopg2

        connection = psycopg2.connect(ctx.server.dsn)
        try:
            connection.autocommit = True
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'"
                )
                count = cursor.fetchone()[0]
        finally:
            connection.close()
    ctx.record("kill", t0, connections=count)


def none(ctx: FaultContext) -> None:
    """No fault: plain contention."""


#: Every injector by name, with the backends it applies to.
FAULTS: dict[str, tuple[Callable[[FaultContext], None], frozenset[str]]] = {
    "none": (none, frozenset({"sqlite", "redis", "postgres"})),
    "pause": (pause, frozenset({"sqlite", "redis", "postgres"})),
    "suspend": (suspend, frozenset({"sqlite", "redis", "postgres"})),
    "clock-jump": (clock_jump, frozenset({"sqlite", "redis", "postgres"})),
    "restart": (restart, frozenset({"redis", "postgres"})),
    "latency": (latency, frozenset({"redis", "postgres"})),
    "stall": (stall, frozenset({"redis", "postgres"})),
    "cut": (cut, frozenset({"redis", "postgres"})),
    "kill": (kill, frozenset({"redis", "postgres"})),
}

#: Faults whose workers need a controlled clock or a proxy.
NEEDS_CLOCK = frozenset({"suspend", "clock-jump"})
NEEDS_PROXY = frozenset({"latency", "stall", "cut"})
__all__ += ["NEEDS_CLOCK", "NEEDS_PROXY"]


def supported(backend: str) -> list[str]:
    """The fault names that apply to ``backend``, in table order."""
    return [name for name, (_, backends) in FAULTS.items() if backend in backends]
