"""The log checker: what the backend granted, what holders believed, what the resource accepted.

Inputs: every worker log (backend ``call`` records plus the holder's own events), the fault
log of the runner, and the resource's history of accepted writes. All times are on the host
clock of :mod:`.eventlog`. A backend call that left at ``t0`` and came back at ``t1`` took
effect on the server somewhere in ``[t0, t1]``; the checker only claims what those bounds prove.

Definitions (per backend and fault):

- *grant*: an ``acquire_fenced`` call that returned a fence. Its lease is **certainly live**
  from the call's ``t1`` until the last successful renewal's ``t0`` plus its TTL (less
  :data:`CLOCK_SLACK` for millisecond rounding and clock-rate noise), or the ``t0`` of any
  release call of that hold, whichever comes first.
- *backend overlap*: a grant to another hold whose call lies entirely inside a certainly-live
  interval. If a fault that wipes the server's data (a Redis restart without persistence) falls
  between the two grants it is counted under ``overlaps_after_data_loss`` — expected without
  persistence, survived only through fencing — otherwise under ``double_grants`` (a defect).
- *fence order violation*: two grants of one key, one certainly before the other, whose fences
  do not increase.
- *out-of-order accepted write*: in the resource's acceptance order, a write whose fence is
  lower than an earlier accepted write of the same key (the guard failed).
- *belief end* of a hold: the first of its loss signal, its local lease end and its release. A
  *late write* started at or after it: the holder wrote after its loss was signalled (or would
  have been, had it looked); only the fence guard can stop such a write.
- *stale accepted write*: accepted although a grant with a larger fence had already been made
  (the newer holder had not written yet, so the guard could not know).
- *server end* of a hold: the earliest moment the server may have dropped its lease (the
  certainly-live end, or a data-wiping restart). A hold whose server end came before it gave the
  key back was *lost at the backend*; if no loss signal fired for it, it is an *unreported loss*.
  ``expiry_to_signal`` is loss signal minus server end (negative: the holder knew in time).
- *loss signal*: the first of the ``lost`` event hook, the holder's own ``lock.lost.is_set()``
  check and a watchdog thread blocked in ``lock.lost.wait()``; the hook alone is also reported
  (``max_hook_lateness``), because it depends on the heartbeat thread being free to run it.
- *lateness*: loss signal minus the local lease end, or minus the moment the worker ran again if
  it was stopped at its local lease end (a stopped process runs no code; a resumed one must know
  at once, which is what the pause detector is for). The issue bounds it by one heartbeat
  interval.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

from .eventlog import read_log

__all__ = ["CLOCK_SLACK", "Report", "check"]

#: Seconds a certainly-live interval is shortened by: Redis keeps TTLs in whole milliseconds
#: (rounded) and servers' clocks may drift a little from the host clock over one lease.
CLOCK_SLACK = 0.005


@dataclass
class _Segment:
    """One backend grant and its renewals."""

    hold: str
    key: str
    fence: int
    t0: float
    t1: float
    renewed_t0: float
    ttl: float
    released_t0: float = math.inf

    @property
    def live_end(self) -> float:
        return min(self.renewed_t0 + self.ttl - CLOCK_SLACK, self.released_t0)


@dataclass
class _Hold:
    """One worker-level hold: what the holder saw."""

    hold: str
    worker: int
    key: str
    fence: int
    granted: float
    local_end: float
    signal: Optional[float] = None
    hook: Optional[float] = None
    reason: Optional[str] = None
    released: Optional[float] = None
    release_result: Optional[bool] = None
    writes: list[dict[str, Any]] = field(default_factory=list)

    @property
    def belief_end(self) -> float:
        ends = [self.local_end]
        if self.signal is not None:
            ends.append(self.signal)
        if self.released is not None:
            ends.append(self.released)
        return min(ends)


def _percentile(values: list[float], fraction: float) -> Optional[float]:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, math.ceil(fraction * len(ordered)) - 1))
    return ordered[index]


@dataclass
class Report:
    """The figures of one scenario run; :meth:`problems` lists what must never happen."""

    backend: str
    fault: str
    workers: int = 0
    seconds: float = 0.0
    ttl: float = 0.0
    interval: float = 0.0
    faults_injected: int = 0
    grants: int = 0
    double_grants: int = 0
    overlaps_after_data_loss: int = 0
    holder_overlaps: int = 0
    fence_order_violations: int = 0
    writes_accepted: int = 0
    out_of_order_accepted: int = 0
    late_writes: int = 0
    late_writes_accepted: int = 0
    stale_accepted: int = 0
    losses_signalled: int = 0
    lost_at_backend: int = 0
    unreported_losses: int = 0
    expiry_to_signal: list[float] = field(default_factory=list)
    max_lateness: float = -math.inf
    max_hook_lateness: float = -math.inf
    errors: int = 0
    worker_failures: list[str] = field(default_factory=list)
    examples: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
        """Every violated guarantee, in words (empty when the run was clean)."""
        found = []
        for name in ("double_grants", "fence_order_violations", "out_of_order_accepted", "unreported_losses"):
            if getattr(self, name):
                found.append(f"{name} = {getattr(self, name)}")
        if self.max_lateness > self.interval:
            found.append(f"loss signalled {self.max_lateness:.3f}s after the local lease end (> {self.interval:.3f}s)")
        found.extend(f"worker failed: {failure}" for failure in self.worker_failures)
        return found + (self.examples[:5] if found else [])

    def latency(self, fraction: float) -> Optional[float]:
        """A percentile of ``expiry_to_signal`` (seconds), ``None`` without losses."""
        return _percentile(self.expiry_to_signal, fraction)

    def row(self) -> list[str]:
        """The summary table row (see :data:`COLUMNS`)."""

        def ms(value: Optional[float]) -> str:
            return "–" if value is None or not math.isfinite(value) else f"{value * 1000:.0f}"

        def joined(*values: object) -> str:
            return "/".join(str(value) for value in values)

        fault = self.fault if self.fault == "none" else f"{self.fault} ×{self.faults_injected}"
        return [
            self.backend, fault, str(self.grants),
            joined(self.double_grants, self.fence_order_violations, self.out_of_order_accepted, self.unreported_losses),
            joined(self.overlaps_after_data_loss, self.holder_overlaps),
            joined(self.writes_accepted, f"{self.late_writes} ({self.late_writes_accepted})", self.stale_accepted),
            joined(self.losses_signalled, self.lost_at_backend),
            joined(*(ms(self.latency(q)) for q in (0.5, 0.99, 1.0))),
            joined(ms(self.max_lateness), ms(self.max_hook_lateness)), str(self.errors),
        ]


#: Column headers of :meth:`Report.row`; several counters share a cell (``a/b``) so that the
#: table fits a page: docs/reliability.md says which is which.
COLUMNS = [
    "backend", "fault", "grants", "must be 0", "overlaps", "writes", "losses", "expiry→signal ms", "lateness ms",
    "errors",
]
__all__ += ["COLUMNS"]


class _Run:
    """Everything read from one scenario's logs."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.holds: dict[str, _Hold] = {}
        self.stopped: dict[int, list[tuple[float, float]]] = defaultdict(list)
        self.wipes: list[tuple[float, float]] = []
        self.faults = 0
        self.errors = 0
        self.interval = 0.0
        self.pids: dict[int, int] = {}
        self.ended: set[int] = set()

    def read_worker(self, path: Path) -> None:
        for event in read_log(path):
            kind, hold = event["ev"], event.get("hold")
            record = self.holds.get(hold) if hold else None
            if kind == "start":
                self.pids[event["w"]] = event["pid"]
                self.interval = event["interval"]
            elif kind == "call":
                self.calls.append(event)
            elif kind == "grant":
                self.holds[hold] = _Hold(hold, event["w"], event["key"], event["fence"], event["t"], event["local_end"])
            elif kind == "end":
                self.ended.add(event["w"])
            elif kind.endswith("-error"):
                self.errors += 1
            if record is None:
                continue
            if kind == "extended":
                record.local_end = event["local_end"]
            elif kind in ("lost", "observed-lost", "watchdog-lost"):
                if record.signal is None or event["t"] < record.signal:
                    record.signal = event["t"]
                if kind == "lost" and record.hook is None:
                    record.hook = event["t"]
                record.reason = record.reason or event.get("reason")
            elif kind == "write":
                record.writes.append(event)
            elif kind in ("release", "release-error"):
                record.released = event["t0"]
                record.release_result = event.get("result")

    def read_faults(self, path: Path) -> None:
        for event in read_log(path):
            if event["ev"] != "fault":
                continue
            self.faults += 1
            if event.get("stopped"):
                self.stopped[event["w"]].append((event["t0"], event["t1"]))
            if event.get("data_loss"):
                self.wipes.append((event["t0"], event["t1"]))

    def segments(self) -> list[_Segment]:
        by_hold: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for call in self.calls:
            by_hold[call["hold"]].append(call)
        segments: list[_Segment] = []
        for hold, calls in by_hold.items():
            current: Optional[_Segment] = None
            for call in sorted(calls, key=lambda item: item["t0"]):
                op, result = call["op"], call.get("result")
                if op == "acquire_fenced" and isinstance(result, int):
                    if current is not None and current.fence == result and current.released_t0 == math.inf:
                        current.renewed_t0, current.ttl = call["t0"], call["ttl"]
                    else:
                        current = _Segment(hold, call["key"], result, call["t0"], call["t1"], call["t0"], call["ttl"])
                        segments.append(current)
                elif current is None:
                    continue
                elif op == "extend" and result is True and current.released_t0 == math.inf:
                    current.renewed_t0, current.ttl = call["t0"], call["ttl"]
                elif op == "release":
                    current.released_t0 = min(current.released_t0, call["t0"])
        return segments

    def wiped_between(self, start: float, end: float) -> Optional[float]:
        """Start of the first data-wiping fault overlapping ``[start, end]``."""
        hits = [t0 for t0, t1 in self.wipes if t1 >= start and t0 <= end]
        return min(hits) if hits else None

    def running_again(self, worker: int, moment: float) -> float:
        """The first time at or after ``moment`` at which ``worker`` was not stopped."""
        for t0, t1 in sorted(self.stopped.get(worker, ())):
            if t0 <= moment < t1:
                moment = t1
        return moment


def check(
    backend: str,
    fault: str,
    worker_logs: Iterable[Path],
    fault_log: Optional[Path],
    history: list[tuple[int, str, int, str, int]],
) -> Report:
    """Read one scenario's logs and history; return its :class:`Report`."""
    run = _Run()
    for path in worker_logs:
        run.read_worker(path)
    if fault_log is not None and fault_log.exists():
        run.read_faults(fault_log)
    report = Report(backend, fault, workers=len(run.pids), interval=run.interval)
    report.faults_injected, report.errors = run.faults, run.errors
    report.worker_failures = [f"worker {w} has no end record" for w in sorted(set(run.pids) - run.ended)]
    segments = run.segments()
    report.grants = len(segments)
    by_key: dict[str, list[_Segment]] = defaultdict(list)
    for segment in segments:
        by_key[segment.key].append(segment)
    for key_segments in by_key.values():
        key_segments.sort(key=lambda item: item.t0)
        _check_grants(run, report, key_segments)
    _check_history(report, history, segments, run.holds)
    _check_holds(run, report, segments)
    return report


def _check_grants(run: _Run, report: Report, segments: list[_Segment]) -> None:
    for index, earlier in enumerate(segments):
        for later in segments[index + 1:]:
            if later.hold == earlier.hold:
                continue
            if earlier.t1 < later.t0 and earlier.fence >= later.fence:
                report.fence_order_violations += 1
                report.examples.append(
                    f"fence order: {earlier.hold} got {earlier.fence} before {later.hold} got {later.fence}"
                )
            if later.t0 >= earlier.t1 and later.t1 <= earlier.live_end:
                if run.wiped_between(earlier.t1, later.t1) is not None:
                    report.overlaps_after_data_loss += 1
                else:
                    report.double_grants += 1
                    report.examples.append(
                        f"double grant on {earlier.key}: {later.hold} granted at {later.t1:.3f} while "
                        f"{earlier.hold}'s lease was certainly live until {earlier.live_end:.3f}"
                    )


def _check_history(
    report: Report, history: list[tuple[int, str, int, str, int]], segments: list[_Segment], holds: dict[str, _Hold]
) -> None:
    highest: dict[str, int] = {}
    started: dict[tuple[str, int], float] = {}
    for hold in holds.values():
        for write in hold.writes:
            started[(hold.hold, write["seq"])] = write["t0"]
    grants_by_key: dict[str, list[_Segment]] = defaultdict(list)
    for segment in segments:
        grants_by_key[segment.key].append(segment)
    for _id, key, fence, hold, seq in history:
        report.writes_accepted += 1
        if fence < highest.get(key, 0):
            report.out_of_order_accepted += 1
            report.examples.append(f"accepted out of order on {key}: fence {fence} after {highest[key]}")
        highest[key] = max(highest.get(key, 0), fence)
        begun = started.get((hold, seq))
        if begun is not None and any(
            other.fence > fence and other.t1 < begun for other in grants_by_key[key]
        ):
            report.stale_accepted += 1


def _check_holds(run: _Run, report: Report, segments: list[_Segment]) -> None:
    by_fence = {(segment.hold, segment.fence): segment for segment in segments}
    holds_by_key: dict[str, list[_Hold]] = defaultdict(list)
    for hold in run.holds.values():
        holds_by_key[hold.key].append(hold)
        for write in hold.writes:
            if write["t0"] >= hold.belief_end:
                report.late_writes += 1
                report.late_writes_accepted += bool(write["accepted"])
        if hold.signal is not None:
            report.losses_signalled += 1
            lateness = hold.signal - run.running_again(hold.worker, hold.local_end)
            if lateness > report.max_lateness:
                report.max_lateness = lateness
            if lateness > run.interval:
                report.examples.append(f"late signal: {hold.hold} learned {lateness:.3f}s after its local end")
        if hold.hook is not None:
            hook_lateness = hold.hook - run.running_again(hold.worker, hold.local_end)
            report.max_hook_lateness = max(report.max_hook_lateness, hook_lateness)
        segment = by_fence.get((hold.hold, hold.fence))
        if segment is None or hold.released is None or hold.release_result is True:
            # A release that deleted our token's key proves the backend still held the lease
            # when the release ran: a wipe whose window overlaps it came later for this lease
            # (a restart's data loss happens at some unknown moment between t0 and t1).
            continue
        server_end = segment.renewed_t0 + segment.ttl - CLOCK_SLACK
        wiped = run.wiped_between(segment.t1, hold.released)
        if wiped is not None:
            server_end = min(server_end, wiped)
        if server_end >= hold.released:
            continue
        report.lost_at_backend += 1
        if hold.signal is None:
            report.unreported_losses += 1
            report.examples.append(
                f"unreported loss: {hold.hold} on {hold.key}, server end {server_end:.3f}, gave back at "
                f"{hold.released:.3f} (release -> {hold.release_result})"
            )
        else:
            report.expiry_to_signal.append(hold.signal - server_end)
    for holds in holds_by_key.values():
        holds.sort(key=lambda item: item.granted)
        for index, earlier in enumerate(holds):
            for later in holds[index + 1:]:
                if later.granted >= earlier.belief_end:
                    break
                report.holder_overlaps += 1
