"""Contended hand-offs: several processes looping acquire/release on one key, Redis and PostgreSQL.

    python -m benchmarks.contended [--workers 8] [--seconds 10] [--rounds 5] [--stores redis,postgres]
        [--redis-url redis://127.0.0.1:6379/0] [--postgres-url postgresql://postgres@127.0.0.1:5432/test]
        [--spinners 0] [--limit 1] [--hold 0]

Each worker is its own process with its own connection and Locker (default options, the
default retry policy with a timeout longer than the run) and loops ``locker.acquire(key)`` /
``lock.release()`` on the same key. The rows of a store take turns ``--rounds`` times, each
turn lasting ``--seconds / --rounds`` (a fresh key and fresh processes each time), and each row
adds up its turns, so that a change in the machine's load weighs on all rows alike. Rows, per
store, all in one run:

- ``Locker, 1 process``: the same loop alone, the uncontended cycle rate the contended rows are
  compared with (``vs 1 proc``).
- ``Locker, N processes``: the contended loop.
- PostgreSQL: ``Locker direct_handoff, N processes``: the same loop with the opt-in direct
  hand-off (``direct_handoff=True`` on every worker's backend), where a release grants the key
  to the waiter first in line.
- Redis: ``python-redis-lock, N processes`` (its blocking ``acquire()``, which waits on a
  ``BLPOP`` signal list); PostgreSQL: ``pg_advisory_lock, N processes`` (a session advisory
  lock, the server's own wait queue): peers that wait in the server.

With ``--limit N`` (N > 1), each store whose backend grants counting leases adds the row
``Locker limit=N, W processes``: the same loop on one counting key of N places (``locker.lock``
with ``limit=N``), so up to N workers hold it at once, printed against the exclusive row's
grants per second. Hand-offs are not counted there (holders overlap by design).

With ``--hold S`` as well, the counting row and an exclusive row beside it stay S seconds inside
each hold (a sleep, as work that waits on I/O does). The other rows hold the key for no time at
all: they measure how fast the lock changes hands, which is CPU-bound on a small machine whatever
the limit; with work inside the holds, a counting key lets N workers do it at once.

With ``--spinners N``, N processes spin at nice 19 for the whole run, so that no CPU is ever
idle (see :func:`benchmarks.measure.spinning`): on a virtual machine whose idle CPUs halt, the
one-process row otherwise pays a CPU's wake-up at every round trip, which the contended rows,
whose CPUs are rarely idle, mostly do not.

Columns: grants per second by all workers together; of those, the ones that went to another
worker than the grant before (``handoffs/s``: the rest were taken back by the releasing worker
before a waiter got there); the fewest and most grants of one worker
and the fewest as a fraction of a fair share (total / N; under 0.25 is called starvation);
``p50``/``p99`` hand-off latency, the time from a worker's last look at the clock before its
``release()`` to the next grant *to another worker* (read right after its ``acquire()``
returned). Both are ``time.monotonic()``, which on Linux is one system-wide clock, so the
stamps of different processes compare. ``overlaps`` counts grants stamped while as many holds
as the key admits (1, or N with ``--limit``) had not started their release yet (must be 0: one
holder too many at once).
"""

from __future__ import annotations

import argparse
import heapq
import multiprocessing
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Optional

from benchmarks.measure import add_json_argument, machine, percentile, spinning, write_json

__all__ = ["Run", "main"]

TTL = 30.0
#: Seconds the parent waits for every worker to connect and report ready.
_READY_TIMEOUT = 60.0

# A worker's loop: given its deadline, returns [(granted_at, releasing_at), ...] (monotonic).
Loop = Callable[[float], list[tuple[float, float]]]


def _timed_holds(take: Callable[[], Callable[[], None]], hold: float) -> Loop:
    """A worker's loop: ``take()`` blocks until it holds the key and returns how to give it back;
    each hold lasts ``hold`` seconds (the work done under the lock, slept).

    Each hold is recorded as (granted, releasing) on the system-wide monotonic clock, so holds
    of different processes can be compared; the grant at or after the deadline ends the loop.
    """

    def loop(deadline: float) -> list[tuple[float, float]]:
        holds: list[tuple[float, float]] = []
        now = time.monotonic
        while True:
            release = take()
            granted = now()
            if granted >= deadline:
                release()
                return holds
            if hold:
                time.sleep(hold)
            releasing = now()
            release()
            holds.append((granted, releasing))

    return loop


def _backend_class(store: str) -> Any:
    if store == "redis":
        from lease_lock.backends.redis import RedisBackend

        return RedisBackend
    from lease_lock.backends.postgres import PostgresBackend

    return PostgresBackend


@contextmanager
def _locker_loop(
    store: str, url: str, key: str, seconds: float, hold: float, *, direct_handoff: bool = False, limit: int = 1
) -> Iterator[Loop]:
    from lease_lock import Locker, Retry

    if store == "redis":
        backend: Any = _backend_class(store).from_url(url)
    else:
        backend = _backend_class(store).from_url(url, table=_TABLE, direct_handoff=direct_handoff)
    # A waiter must outlast the run: a timeout would be a failure of the benchmark, not a result.
    locker = Locker(backend, ttl=TTL, retry=Retry(timeout=seconds + 60.0))
    locker.acquire(key, limit=limit).release()  # connect and warm up before the start

    try:
        yield _timed_holds(lambda: locker.acquire(key, limit=limit).release, hold)
    finally:
        locker.close()
        backend.close()


@contextmanager
def _redis_lock_loop(url: str, key: str, hold: float) -> Iterator[Loop]:
    import redis
    import redis_lock

    client = redis.Redis.from_url(url)
    warm = redis_lock.Lock(client, key, expire=int(TTL))
    warm.acquire()
    warm.release()

    def take() -> Callable[[], None]:
        lock = redis_lock.Lock(client, key, expire=int(TTL))
        lock.acquire()
        return lock.release

    try:
        yield _timed_holds(take, hold)
    finally:
        client.close()


@contextmanager
def _advisory_loop(url: str, key: str, hold: float) -> Iterator[Loop]:
    import psycopg2

    conn = psycopg2.connect(url)
    conn.autocommit = True
    cursor = conn.cursor()
    slot = int(uuid.UUID(key.rsplit(":", 1)[-1].ljust(32, "0")).int % (2**62))

    def release() -> None:
        cursor.execute("SELECT pg_advisory_unlock(%s)", (slot,))

    def take() -> Callable[[], None]:
        cursor.execute("SELECT pg_advisory_lock(%s)", (slot,))
        return release

    try:
        yield _timed_holds(take, hold)
    finally:
        conn.close()


_TABLE = "bench_contended"
#: The PostgreSQL row with the opt-in direct hand-off.
_DIRECT = "Locker direct_handoff"


def _worker(
    contestant: str, store: str, url: str, key: str, seconds: float, limit: int, hold: float, ready: Any, go: Any,
    out: Any,
) -> None:
    if contestant in ("Locker", _DIRECT):
        loops = _locker_loop(store, url, key, seconds, hold, direct_handoff=contestant == _DIRECT, limit=limit)
    elif contestant == "python-redis-lock":
        loops = _redis_lock_loop(url, key, hold)
    else:
        loops = _advisory_loop(url, key, hold)
    with loops as loop:
        ready.put(True)
        go.wait()
        out.put(loop(time.monotonic() + seconds))


@dataclass(frozen=True)
class Run:
    """What one contestant's workers did together."""

    name: str
    workers: int
    seconds: float
    counts: list[int]
    latencies: list[float]
    overlaps: int
    #: How many holders the key admits at once (1: exclusive).
    limit: int = 1

    def __add__(self, other: Run) -> Run:
        """This run and a later round of the same contestant, as one run."""
        counts = [mine + theirs for mine, theirs in zip(self.counts, other.counts)]
        return Run(
            self.name, self.workers, self.seconds + other.seconds, counts,
            self.latencies + other.latencies, self.overlaps + other.overlaps, self.limit,
        )

    @property
    def handoffs(self) -> Optional[float]:
        """Grants per second that went to another worker than the grant before (``None`` for a
        counting key, whose holders overlap)."""
        return len(self.latencies) / self.seconds if self.limit == 1 else None

    @property
    def rate(self) -> float:
        """Grants per second by all workers together."""
        return sum(self.counts) / self.seconds

    @property
    def fairness(self) -> float:
        """The fewest grants of one worker as a fraction of an equal share."""
        share = sum(self.counts) / len(self.counts)
        return min(self.counts) / share if share else 0.0


def _summarise(name: str, seconds: float, per_worker: list[list[tuple[float, float]]], limit: int = 1) -> Run:
    holds = sorted(
        (granted, releasing, worker) for worker, spans in enumerate(per_worker) for granted, releasing in spans
    )
    overlaps = 0
    # The releases (stamped as they start) of the holds not yet released at each grant.
    holding: list[float] = []
    for granted, releasing, _ in holds:
        while holding and holding[0] <= granted:
            heapq.heappop(holding)
        if len(holding) >= limit:
            overlaps += 1
        heapq.heappush(holding, releasing)
    latencies: list[float] = []
    if limit == 1:
        for (_, released, before), (granted, _, after) in zip(holds, holds[1:]):
            if granted >= released and after != before:
                latencies.append(granted - released)
    return Run(name, len(per_worker), seconds, [len(spans) for spans in per_worker], latencies, overlaps, limit)


def run(
    contestant: str, store: str, url: str, workers: int, seconds: float, limit: int = 1, hold: float = 0.0
) -> Run:
    """Start ``workers`` processes on one fresh key (of ``limit`` places), let them loop for
    ``seconds`` (each hold lasting ``hold`` seconds), collect."""
    context = multiprocessing.get_context("spawn")
    ready, go, out = context.Queue(), context.Event(), context.Queue()
    key = f"bench:contended:{uuid.uuid4().hex}"
    processes = [
        context.Process(
            target=_worker, args=(contestant, store, url, key, seconds, limit, hold, ready, go, out), daemon=True
        )
        for _ in range(workers)
    ]
    for process in processes:
        process.start()
    try:
        for _ in processes:
            ready.get(timeout=_READY_TIMEOUT)
        go.set()
        per_worker = [out.get(timeout=seconds + _READY_TIMEOUT) for _ in processes]
    finally:
        for process in processes:
            process.join(_READY_TIMEOUT)
            if process.is_alive():
                process.kill()
    failed = [process.exitcode for process in processes if process.exitcode]
    if failed:
        raise RuntimeError(f"{contestant} workers exited with {failed}")
    counting = f" limit={limit}" if limit > 1 else ""
    held = f", hold {hold * 1000:g} ms" if hold else ""
    label = f"{contestant}{counting}, {workers} process{'es' if workers > 1 else ''}{held}"
    return _summarise(label, seconds, per_worker, limit)


def _ms(latencies: list[float], fraction: float) -> str:
    return f"{percentile(latencies, fraction) * 1000:.2f}" if latencies else "-"


def _print_row(run: Run, single: Run) -> None:
    handoffs = "-" if run.handoffs is None else f"{run.handoffs:,.0f}"
    print(
        f"{run.name:<42} {run.rate:>9,.0f} {run.rate / single.rate:>8.2f}x {handoffs:>10} "
        f"{min(run.counts):>7,} {max(run.counts):>7,} {run.fairness:>9.2f} {_ms(run.latencies, 0.5):>8} "
        f"{_ms(run.latencies, 0.99):>8} {run.overlaps:>8}"
    )


def _as_json(run: Run, single: Run) -> dict[str, Any]:
    return {
        "name": run.name, "workers": run.workers, "limit": run.limit, "seconds": run.seconds, "rate": run.rate,
        "vs_single": run.rate / single.rate, "handoffs_per_second": run.handoffs,
        "min": min(run.counts), "max": max(run.counts), "min_share": run.fairness, "overlaps": run.overlaps,
        "p50_ms": percentile(run.latencies, 0.5) * 1000 if run.latencies else None,
        "p99_ms": percentile(run.latencies, 0.99) * 1000 if run.latencies else None,
        "mean_latency_ms": statistics.fmean(run.latencies) * 1000 if run.latencies else None,
    }


def main(argv: Optional[list[str]] = None) -> None:
    """Run every contestant on every store and print one table per store."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", 1)[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0, help="per row, all rounds together")
    parser.add_argument("--rounds", type=int, default=5, help="turns the rows take, each for seconds/rounds")
    parser.add_argument("--stores", default="redis,postgres")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--postgres-url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument(
        "--limit", type=int, default=1,
        help="above 1: add a row of the workers on one counting key of this many places",
    )
    parser.add_argument(
        "--hold", type=float, default=0.0,
        help="with --limit: seconds the counting row and an exclusive row beside it stay in each hold (slept)",
    )
    parser.add_argument(
        "--spinners", type=int, default=0,
        help="keep this many processes busy at nice 19 throughout (see benchmarks.measure.spinning)",
    )
    add_json_argument(parser)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.spinners < 0:
        parser.error("--spinners must be at least 0")
    if args.limit < 1:
        parser.error("--limit must be at least 1")
    if args.hold < 0:
        parser.error("--hold must be at least 0")
    with spinning(args.spinners):
        _run_stores(args, argv)


def _run_stores(args: argparse.Namespace, argv: Optional[list[str]]) -> None:
    stores = [store.strip() for store in args.stores.split(",") if store.strip()]
    info = machine()
    busy = f"; {args.spinners} spinning at nice 19" if args.spinners else ""
    print(f"{info['cpus']} CPUs, {info['system']}, Python {info['python']}; "
          f"{args.workers} workers, {args.seconds:g} s per row in {args.rounds} turns{busy}")
    output: dict[str, Any] = {}
    for store in stores:
        url = args.redis_url if store == "redis" else args.postgres_url
        peer = "python-redis-lock" if store == "redis" else "pg_advisory_lock"
        # The rows take turns, round after round, so that a change in the machine's load during
        # the run weighs on every row alike instead of on whichever ran at that moment.
        contestants = [("Locker", 1, 1, 0.0), ("Locker", args.workers, 1, 0.0), (peer, args.workers, 1, 0.0)]
        if store == "postgres":
            contestants.append((_DIRECT, args.workers, 1, 0.0))
        counting = args.limit > 1 and _backend_class(store).capabilities.counting
        if counting:
            if args.hold:
                contestants.append(("Locker", args.workers, 1, args.hold))
            contestants.append(("Locker", args.workers, args.limit, args.hold))
        rows: list[Run] = []
        for round_index in range(args.rounds):
            results = [
                run(name, store, url, workers, args.seconds / args.rounds, limit, hold)
                for name, workers, limit, hold in contestants
            ]
            rows = results if round_index == 0 else [total + result for total, result in zip(rows, results)]
        single = rows[0]
        print(f"\n{store}: one key, each process loops acquire/release")
        print(f"{'contestant':<42} {'grants/s':>9} {'vs 1 proc':>9} {'handoffs/s':>10} {'min':>7} {'max':>7} "
              f"{'min/share':>9} {'p50 ms':>8} {'p99 ms':>8} {'overlaps':>8}")
        for row in rows:
            _print_row(row, single)
        contended, peer_run = rows[1], rows[2]
        print(f"Locker, {args.workers} processes vs {peer}: {contended.rate / peer_run.rate:.2f}x")
        if counting:
            exclusive = rows[-2] if args.hold else contended
            print(f"{rows[-1].name} vs {exclusive.name}: {rows[-1].rate / exclusive.rate:.2f}x grants/s")
        output[store] = [_as_json(row, single) for row in rows]
    write_json(args.json, "contended", argv, output)


if __name__ == "__main__":
    main()
