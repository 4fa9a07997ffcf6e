"""The checker must catch what it exists to catch: each test feeds it logs with one defect.

Logs are written with the harness's own :class:`EventLog`, with made-up times (seconds on the
host clock); a TTL of 1 s and a heartbeat interval of 1/3 s throughout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import pytest
from benchmarks.chaos_harness.checker import Report, check
from benchmarks.chaos_harness.eventlog import EventLog

pytestmark = pytest.mark.chaos

KEY = "k:0"


class Logs:
    """Two workers' logs plus the fault log, written as a test describes them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.workers = [EventLog(root / f"worker-{index}.log", w=index) for index in range(2)]
        self.faults = EventLog(root / "faults.log")
        for index, log in enumerate(self.workers):
            log.write("start", pid=1000 + index, keys=[KEY], ttl=1.0, interval=1 / 3, t=0.0)
        self.history: list[tuple[int, str, int, str, int]] = []

    def hold(
        self, worker: int, hold: str, fence: int, granted: float, *, renewals: tuple[float, ...] = (),
        signal: Optional[float] = None, released: Optional[float] = None, result: Optional[bool] = True,
        writes: tuple[float, ...] = (),
    ) -> None:
        """One hold: grant call at ``granted``, extensions sent at ``renewals`` (each answered
        10 ms later and moving the local end to send + 0.99 s), an optional loss signal, fenced
        writes started at ``writes`` (accepted) and a release at ``released``."""
        log = self.workers[worker]
        log.write("call", op="acquire_fenced", key=KEY, hold=hold, ttl=1.0, t0=granted - 0.01, t1=granted,
                  result=fence, t=granted)
        log.write("grant", hold=hold, key=KEY, fence=fence, local_end=granted - 0.01 + 0.99, t=granted)
        for sent in renewals:
            log.write("call", op="extend", key=KEY, hold=hold, ttl=1.0, t0=sent, t1=sent + 0.01, result=True,
                      t=sent + 0.01)
            log.write("extended", hold=hold, key=KEY, local_end=sent + 0.99, t=sent + 0.01)
        for seq, start in enumerate(writes, 1):
            log.write("write", hold=hold, key=KEY, fence=fence, seq=seq, t0=start, accepted=True, t=start + 0.001)
            self.history.append((len(self.history) + 1, KEY, fence, hold, seq))
        if signal is not None:
            log.write("lost", hold=hold, key=KEY, reason="expired", t=signal)
        if released is not None:
            log.write("call", op="release", key=KEY, hold=hold, ttl=None, t0=released, t1=released + 0.01,
                      result=bool(result), t=released + 0.01)
            log.write("release", hold=hold, key=KEY, t0=released, result=result, t=released + 0.01)

    def fault(self, **fields: Any) -> None:
        self.faults.write("fault", **fields)

    def check(self) -> Report:
        for log in self.workers:
            log.write("end", t=100.0)
            log.close()
        self.faults.close()
        return check("test", "test", sorted(self.root.glob("worker-*.log")), self.root / "faults.log", self.history)


@pytest.fixture
def logs(tmp_path: Path) -> Logs:
    return Logs(tmp_path)


def test_clean_hand_over_passes(logs: Logs) -> None:
    logs.hold(0, "0.1", 10, 1.0, renewals=(1.3,), released=1.8, writes=(1.1, 1.5))
    logs.hold(1, "1.1", 11, 1.9, released=2.5, writes=(2.0,))
    report = logs.check()
    assert report.problems() == []
    assert (report.grants, report.writes_accepted, report.double_grants) == (2, 3, 0)


def test_double_grant_is_caught(logs: Logs) -> None:
    logs.hold(0, "0.1", 10, 1.0, renewals=(1.3,), released=2.5)
    logs.hold(1, "1.1", 11, 1.9, released=2.8)
    report = logs.check()
    assert report.double_grants == 1
    assert any("double grant" in problem for problem in report.problems())


def test_overlap_after_a_data_wiping_restart_is_told_apart(logs: Logs) -> None:
    logs.hold(0, "0.1", 10, 1.0, renewals=(1.3,), signal=1.7, released=1.8, result=False)
    logs.fault(kind="restart", t0=1.5, t1=1.55, data_loss=True)
    logs.hold(1, "1.1", 11, 1.6, released=2.0)
    report = logs.check()
    assert (report.double_grants, report.overlaps_after_data_loss) == (0, 1)
    assert report.problems() == []


def test_fences_out_of_grant_order_are_caught(logs: Logs) -> None:
    logs.hold(0, "0.1", 10, 1.0, released=1.2)
    logs.hold(1, "1.1", 9, 1.5, released=1.7)
    assert logs.check().fence_order_violations == 1


def test_accepted_write_with_a_lower_fence_is_caught(logs: Logs) -> None:
    logs.hold(0, "0.1", 10, 1.0, released=1.2)
    logs.hold(1, "1.1", 11, 1.5, released=1.7)
    logs.history = [(1, KEY, 11, "1.1", 1), (2, KEY, 10, "0.1", 1)]
    report = logs.check()
    assert report.out_of_order_accepted == 1
    assert report.problems()


def test_loss_without_a_signal_is_an_unreported_loss(logs: Logs) -> None:
    # Granted at 1.0 for one second, never renewed, given back at 2.5 with no signal.
    logs.hold(0, "0.1", 10, 1.0, released=2.5, result=False)
    report = logs.check()
    assert (report.lost_at_backend, report.unreported_losses) == (1, 1)
    assert report.problems()


def test_signal_later_than_one_interval_after_the_local_end_is_a_problem(logs: Logs) -> None:
    logs.hold(0, "0.1", 10, 1.0, signal=1.98 + 0.5, released=2.6, result=False)
    report = logs.check()
    assert report.max_lateness == pytest.approx(0.5)
    assert any("after the local lease end" in problem for problem in report.problems())


def test_a_stopped_worker_is_judged_from_when_it_runs_again(logs: Logs) -> None:
    logs.fault(kind="pause", w=0, t0=1.5, t1=3.0, stopped=True)
    logs.hold(0, "0.1", 10, 1.0, signal=3.05, released=3.1, result=False, writes=(1.2, 3.02))
    report = logs.check()
    assert report.problems() == []
    assert report.max_lateness == pytest.approx(0.05)
    assert report.expiry_to_signal == [pytest.approx(3.05 - (0.99 + 1.0 - 0.005))]
    # The write started at 3.02 came after the local lease end (1.98): a late write.
    assert (report.late_writes, report.late_writes_accepted) == (1, 1)


def test_a_release_that_deleted_the_key_proves_no_loss_during_a_wipe_window(logs: Logs) -> None:
    # The restart's data loss happens somewhere in [t0, t1]; the release ran inside that window
    # and deleted our key, so the lease was still there (seen in the 30 s Redis restart run).
    logs.fault(kind="restart", t0=1.5, t1=1.6, data_loss=True)
    logs.hold(0, "0.1", 10, 1.0, renewals=(1.3,), released=1.52, result=True)
    assert logs.check().problems() == []


def test_a_release_that_found_nothing_inside_a_wipe_window_is_still_a_loss(logs: Logs) -> None:
    logs.fault(kind="restart", t0=1.5, t1=1.6, data_loss=True)
    logs.hold(0, "0.1", 10, 1.0, renewals=(1.3,), released=1.58, result=False)
    report = logs.check()
    assert (report.lost_at_backend, report.unreported_losses) == (1, 1)
