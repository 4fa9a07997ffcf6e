"""Fault injectors. Each is small, runs in the runner process and logs a ``fault`` event.

Every injector has an ``inject(ctx)`` that performs one fault and returns when it is over (a
pause injector returns after SIGCONT). The runner calls it repeatedly, with a gap of one TTL in
between, for the length of the scenario. Targets are chosen among the current holders, found
through the backend's ``inspect`` (the owner label carries the worker number), so that a fault
hits someone it can hurt.

=============  ============================================================  ======================
name           what it does                                                  backends
=============  ============================================================  ======================
none           nothing: contention only                                      all
pause          SIGSTOP a holder for 1.5 TTL, then SIGCONT                    all
suspend        as ``pause``, and the holder's monotonic clock does not see   all
               the stop (only its wall clock does): a frozen VM; the pause
               detector of the lease clock must notice
clock-jump     step a holder's wall clock 2 TTL forward, next time back      all
restart        restart the server (Redis loses all data; PostgreSQL keeps    redis, postgres, etcd
               it; every etcd member is stopped, then all started on their
               data), locks held
leader-kill    SIGKILL the etcd leader; start it again once the others       etcd
               elected a new one
leader-pause   SIGSTOP the etcd leader for 1.5 TTL (a stuck leader the       etcd
               others replace), then SIGCONT
quorum-loss    SIGSTOP two of the three etcd members for 1.5 TTL: no         etcd
               quorum, so no writes and no renewals; then SIGCONT
latency        add TTL/8 per direction to one holder's connections for 2 TTL redis, postgres, etcd
stall          hold all traffic of one holder for 1.5 TTL (silent peer)      redis, postgres, etcd
cut            reset every connection of one holder                          redis, postgres, etcd
kill           server-side: ``CLIENT KILL`` (Redis) or                       redis, postgres
               ``pg_terminate_backend`` (PostgreSQL) on every client
=============  ============================================================  ======================

A proxy fault on etcd hits the holder's connections to every member at once (one proxy per
member), since the client fails over to the next member when one goes silent.
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
from .proxy import ProxyGroup

__all__ = ["FAULTS", "FaultContext", "WorkerHandle", "supported"]


@dataclass
class WorkerHandle:
    """What an injector may touch of one worker."""

    index: int
    pid: int
    clock: Optional[ClockControl] = None
    proxy: Optional[ProxyGroup] = None


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


def leader_kill(ctx: FaultContext) -> None:
    """Crash the etcd leader; bring it back once the survivors have a leader of their own."""
    t0 = host_now()
    leader = ctx.server.leader()
    leader.kill()
    try:
        successor = ctx.server.leader()
    finally:
        leader.start()
    ctx.server.wait_serving([leader])
    ctx.record("leader-kill", t0, member=leader.name, successor=successor.name)


def _pause_members(ctx: FaultContext, kind: str, members: list[Any]) -> None:
    t0 = host_now()
    for member in members:
        member.pause()
    try:
        time.sleep(1.5 * ctx.ttl)
    finally:
        for member in members:
            member.resume()
    ctx.record(kind, t0, members=[member.name for member in members])


def leader_pause(ctx: FaultContext) -> None:
    """SIGSTOP the etcd leader for longer than a TTL: the others elect a new one meanwhile."""
    _pause_members(ctx, "leader-pause", [ctx.server.leader()])


def quorum_loss(ctx: FaultContext) -> None:
    """SIGSTOP a majority of the etcd members for longer than a TTL: nothing commits."""
    members = list(ctx.server.members)
    ctx.rng.shuffle(members)
    _pause_members(ctx, "quorum-loss", members[: len(members) // 2 + 1])


def none(ctx: FaultContext) -> None:
    """No fault: plain contention."""


_EVERY = frozenset({"sqlite", "redis", "postgres", "etcd"})
_SERVERS = frozenset({"redis", "postgres", "etcd"})
_ETCD = frozenset({"etcd"})

#: Every injector by name, with the backends it applies to.
FAULTS: dict[str, tuple[Callable[[FaultContext], None], frozenset[str]]] = {
    "none": (none, _EVERY),
    "pause": (pause, _EVERY),
    "suspend": (suspend, _EVERY),
    "clock-jump": (clock_jump, _EVERY),
    "restart": (restart, _SERVERS),
    "leader-kill": (leader_kill, _ETCD),
    "leader-pause": (leader_pause, _ETCD),
    "quorum-loss": (quorum_loss, _ETCD),
    "latency": (latency, _SERVERS),
    "stall": (stall, _SERVERS),
    "cut": (cut, _SERVERS),
    "kill": (kill, frozenset({"redis", "postgres"})),
}

#: Faults whose workers need a controlled clock or a proxy.
NEEDS_CLOCK = frozenset({"suspend", "clock-jump"})
NEEDS_PROXY = frozenset({"latency", "stall", "cut"})
__all__ += ["NEEDS_CLOCK", "NEEDS_PROXY"]


def supported(backend: str) -> list[str]:
    """The fault names that apply to ``backend``, in table order."""
    return [name for name, (_, backends) in FAULTS.items() if backend in backends]
