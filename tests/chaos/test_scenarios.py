"""The short version of every reliability scenario (the long one is in docs/reliability.md).

Each scenario runs four worker processes for a few seconds against a real backend while one
kind of fault is injected, then the checker reads the logs. Every run must show zero double
grants, zero fences out of order, zero out-of-order accepted writes, zero unreported losses,
and every loss signalled no later than the local lease end plus one heartbeat interval.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
from benchmarks.chaos_harness.faults import supported
from benchmarks.chaos_harness.scenario import Settings, Target, run_scenario

#: Short runs: long enough for two or three faults, short enough for CI on two cores.
SHORT = Settings(workers=4, seconds=3.5, keys=2, ttl=1.2, hold=(0.2, 1.0))

#: The faults run briefly in CI for each backend. Faults of the lease clock (suspend,
#: clock-jump) act inside the worker's core, the same on every backend: CI runs them on SQLite
#: (and Redis, through the core's clock); the long run in the docs covers every pair. On etcd
#: (a three-member cluster) CI runs the cluster's own faults: a crashed leader, a lost quorum and
#: a full restart, besides a paused holder and a holder's stalled and cut connections.
CI_SCENARIOS = [
    *(("sqlite", fault) for fault in supported("sqlite")),
    *(("redis", fault) for fault in ("pause", "restart", "latency", "stall", "cut", "kill", "suspend")),
    *(("postgres", fault) for fault in ("pause", "restart", "stall", "cut", "kill")),
    *(("etcd", fault) for fault in ("pause", "restart", "leader-kill", "quorum-loss", "stall", "cut")),
    # The direct hand-off on etcd: a waiter handed the key while paused, stalled or cut off.
    *(("etcd-direct", fault) for fault in ("pause", "leader-kill", "stall", "cut")),
]

#: Faults that always cost the holder its lease (it is stopped for longer than the TTL).
ALWAYS_LOSE = {"pause", "suspend"}


@pytest.mark.chaos
@pytest.mark.parametrize(("backend", "fault"), CI_SCENARIOS, ids=[f"{b}-{f}" for b, f in CI_SCENARIOS])
def test_scenario(backend: str, fault: str, chaos_target: Callable[[str], Target], tmp_path: Path) -> None:
    report = run_scenario(chaos_target(backend), fault, SHORT, tmp_path / "run")
    assert report.problems() == [], f"logs in {tmp_path / 'run'}"
    assert report.grants > 0, "the workload never got a lock: the scenario proved nothing"
    assert report.writes_accepted > 0
    if fault != "none":
        assert report.faults_injected > 0
    if fault in ALWAYS_LOSE:
        assert report.losses_signalled > 0, "a holder stopped past its TTL must have been told"
