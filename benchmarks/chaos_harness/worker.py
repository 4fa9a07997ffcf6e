"""The workload process: contend for keys with fencing on, write to the fenced resource, log.

Run as ``python -m benchmarks.chaos_harness.worker --url URL --resource URL --log FILE ...``.
Until ``--until`` (host clock) the worker repeatedly picks a random key, acquires it (blocking,
bounded by ``--acquire-timeout``), holds it for a random time while writing ``(fence, seq)`` to
the resource, and releases it. A holder behaves like ordinary application code: it checks
``lock.lost`` before each unit of work, then works for a while, then writes. A pause that hits
during the work therefore produces a write after the loss, which only the fence guard stops:
that is the risk the checker counts.

Log events (besides the backend ``call`` records of :mod:`.recording`): ``start``, ``grant``
(with the local lease end on the host clock), ``extended``, ``lost`` (from the event hook),
``observed-lost`` (the holder's own check), ``watchdog-lost`` (a thread waiting on
``lock.lost``), ``write``, ``release``, ``*-error`` and ``end``.
"""

from __future__ import annotations

import argparse
import os
import random
import threading
import time
from pathlib import Path
from typing import Optional

from lease_lock import Lock, Locker, LockEvent, Retry
from lease_lock.backends import backend_from_url

from .clockctl import ClockControl, controlled_clock
from .eventlog import EventLog, host_now
from .recording import RecordingBackend
from .resource import open_resource

__all__ = ["main", "parse_args"]

_GO_TIMEOUT = 60.0


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    """The worker's command line."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True, help="lease_lock backend URL")
    parser.add_argument("--resource", required=True, help="fenced resource URL")
    parser.add_argument("--log", required=True, type=Path)
    parser.add_argument("--worker", required=True, type=int)
    parser.add_argument("--keys", type=int, default=4)
    parser.add_argument("--namespace", default="chaos", help="keys are NAMESPACE:0 .. NAMESPACE:KEYS-1")
    parser.add_argument("--go", type=Path, required=True,
                        help="file the runner writes the host-clock end time into once every worker started")
    parser.add_argument("--ttl", type=float, default=2.0)
    parser.add_argument("--hold", type=float, nargs=2, default=(0.2, 1.5), metavar=("MIN", "MAX"))
    parser.add_argument("--work", type=float, default=0.05, help="longest work step between writes")
    parser.add_argument("--acquire-timeout", type=float, default=2.0)
    parser.add_argument("--clock-file", type=Path, help="shared clock offsets (see clockctl)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


class Worker:
    """One workload process's state: the locker, the current lock and the logs."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.log = EventLog(args.log, w=args.worker)
        self.random = random.Random(args.seed * 1000 + args.worker)
        self.holds: dict[str, str] = {}
        self.current: Optional[Lock] = None
        self.current_hold = ""
        clock = controlled_clock(ClockControl(args.clock_file)) if args.clock_file else None
        backend = RecordingBackend(backend_from_url(args.url), self.log, self.holds)
        self.locker = Locker(
            backend,
            ttl=args.ttl,
            fencing=True,
            owner=f"chaos-{args.worker}:{os.getpid()}",
            on_event=self.on_event,
            clock=clock,
            retry=Retry(delay=0.05, timeout=args.acquire_timeout),
        )
        self.resource = open_resource(args.resource)
        self.keys = [f"{args.namespace}:{index}" for index in range(args.keys)]

    def local_end(self, lock: Lock) -> float:
        """The host-clock time at which ``lock``'s local lease ends, as of now."""
        return host_now() + lock.expires_in

    def on_event(self, event: LockEvent) -> None:
        """The Locker's event hook: log extensions and losses of the current hold."""
        lock = self.current
        if lock is None or event.key != lock.key:
            return
        if event.type == "extended":
            self.log.write("extended", hold=self.current_hold, key=event.key, local_end=self.local_end(lock))
        elif event.type == "lost":
            self.log.write("lost", hold=self.current_hold, key=event.key, reason=event.reason)
        elif event.type == "extend_failed":
            self.log.write("extend-failed", hold=self.current_hold, key=event.key, error=repr(event.error))

    def run(self) -> None:
        """The main loop (see the module docstring)."""
        self.log.write("start", pid=os.getpid(), keys=self.keys, ttl=self.args.ttl, interval=self.args.ttl / 3)
        self.until = self.wait_for_go()
        number = 0
        try:
            while host_now() < self.until:
                number += 1
                self.hold_once(f"{self.args.worker}.{number}", self.random.choice(self.keys))
        finally:
            self.locker.close()
            self.resource.close()
            self.log.write("end")
            self.log.close()

    def wait_for_go(self) -> float:
        """Block until the runner says go; the file holds the end time on the host clock."""
        deadline = time.monotonic() + _GO_TIMEOUT
        while not self.args.go.exists():
            if time.monotonic() > deadline:
                raise SystemExit("the runner never said go")
            time.sleep(0.01)
        return float(self.args.go.read_text())

    def hold_once(self, hold: str, key: str) -> None:
        """Acquire ``key``, write under it, release it."""
        lock = self.locker.lock(key)
        self.holds[lock.token] = hold
        self.current, self.current_hold = lock, hold
        try:
            acquired = lock.acquire()
        except Exception as error:  # noqa: BLE001 - a driver error is part of the experiment
            self.log.write("acquire-error", hold=hold, key=key, error=repr(error))
            time.sleep(0.05)
            return
        if not acquired:
            return
        fence = lock.fence
        assert fence is not None
        self.log.write("grant", hold=hold, key=key, fence=fence, local_end=self.local_end(lock))
        done = threading.Event()
        watchdog = threading.Thread(target=self.watch, args=(hold, lock, done), name=f"watchdog-{hold}", daemon=True)
        watchdog.start()
        try:
            self.work(hold, key, lock, fence)
        finally:
            done.set()
            watchdog.join()

    def watch(self, hold: str, lock: Lock, done: threading.Event) -> None:
        """A watchdog thread, as a careful application would run one: it waits on ``lock.lost``
        and logs the moment the signal reaches a waiter."""
        while not done.is_set():
            if lock.lost.wait(0.1):
                self.log.write("watchdog-lost", hold=hold, key=lock.key, reason=lock.lost_reason)
                return

    def work(self, hold: str, key: str, lock: Lock, fence: int) -> None:
        """Write under ``lock`` until the hold time is over or the lock reads lost; release."""
        until = min(host_now() + self.random.uniform(*self.args.hold), self.until)
        seq = 0
        while host_now() < until:
            if lock.lost.is_set():
                self.log.write("observed-lost", hold=hold, key=key, reason=lock.lost_reason)
                break
            time.sleep(self.random.uniform(0, self.args.work))
            seq += 1
            self.write(hold, key, fence, seq)
        self.release(hold, lock)

    def write(self, hold: str, key: str, fence: int, seq: int) -> None:
        """One fenced write, logged with its times and outcome."""
        t0 = host_now()
        try:
            accepted = self.resource.write(key, fence, hold, seq)
        except Exception as error:  # noqa: BLE001 - a resource outage is part of the experiment
            self.log.write("write-error", hold=hold, key=key, fence=fence, seq=seq, t0=t0, error=repr(error))
            return
        self.log.write("write", hold=hold, key=key, fence=fence, seq=seq, t0=t0, accepted=accepted)

    def release(self, hold: str, lock: Lock) -> None:
        """Give the key back, logging the outcome.

        A release that raises leaves the lock held with its heartbeat running, so a
        careful holder tries again until it succeeds or the lock reads lost; giving up silently
        would hide a loss from the holder, and from the checker.
        """
        if lock.lost.is_set():
            self.log.write("observed-lost", hold=hold, key=lock.key, reason=lock.lost_reason)
        while True:
            t0 = host_now()
            try:
                released = lock.release()
            except Exception as error:  # noqa: BLE001 - retried below: the lock stays held
                self.log.write("release-error", hold=hold, key=lock.key, t0=t0, error=repr(error))
                if lock.lost.wait(0.05):
                    # Lost: the lease runs out on its own, nothing is left to give back.
                    self.log.write("observed-lost", hold=hold, key=lock.key, reason=lock.lost_reason)
                    return
                continue
            self.log.write("release", hold=hold, key=lock.key, t0=t0, result=released, state=lock.state,
                           reason=lock.lost_reason)
            return


def main(argv: Optional[list[str]] = None) -> None:
    """Entry point of the worker process."""
    Worker(parse_args(argv)).run()


if __name__ == "__main__":
    main()
