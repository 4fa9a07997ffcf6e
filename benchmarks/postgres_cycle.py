"""Acquire+release cycles and hand-off latency on PostgreSQL, side by side in one run.

    python benchmarks/postgres_cycle.py [--url postgresql://postgres@127.0.0.1:5432/test]
                                        [--seconds 3] [--handoffs 100]

Run it against a server with its real durability settings (the throwaway test cluster runs
with ``fsync=off`` and would flatter every contestant). The script prints the server's
``fsync``/``synchronous_commit`` so each figure can be read next to them.

Cycle contestants, each on its own autocommit connection, interleaved in rounds so that noise
hits everyone alike; the figure is the best round:

- ``raw SQL floor``: the backend's own two statements (grant, and the token-checked delete
  that also sends the release NOTIFY) typed by hand on a bare cursor: what the library's
  overhead is judged against. Two commits, two WAL flushes.
- ``minimal pair``: the smallest correct pair (``INSERT ... ON CONFLICT ... WHERE expired OR
  ours`` and a token-checked ``DELETE``, no contention filter, no NOTIFY), to show what the
  NOTIFY of every release costs.
- ``backend acquire/release`` and ``backend fenced``: ``PostgresBackend`` primitives (the
  release also sends the NOTIFY that wakes waiters; the fenced grant takes the per-key
  advisory lock and draws from the sequence).
- ``Locker`` and ``Locker fenced``: ``locker.acquire(key).release()``, the whole public path.
- ``pg_try_advisory_lock``: a session advisory lock and its unlock; no lease, no WAL, gone
  with the session, shown for scale only.
- Trade-offs a user may choose: the backend with ``synchronous_commit=False`` and on an
  ``UNLOGGED`` table (each next to its own raw floor on the same table).

Hand-off: a waiter blocks in ``Locker.acquire`` while another connection holds the key; the
time from the start of the holder's release to the waiter holding the lock (p50/p99), with
LISTEN/NOTIFY (the default) and with notifications turned off (polling every 50 ms), next to a
bare LISTEN/NOTIFY wake-up between two connections.
"""

from __future__ import annotations

import argparse
import select
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, ClassVar, Optional

import psycopg2
from lease_lock.backends.base import Capabilities
from lease_lock.backends.postgres import PostgresBackend, ddl
from lease_lock.locker import Locker
from lease_lock.retry import Retry

__all__ = ["main"]

TTL = 30.0
TOKEN = "b" * 32


def _connect(url: str) -> Any:
    conn = psycopg2.connect(url)
    conn.autocommit = True
    return conn


def _raw_cycle(conn: Any, grant: str, drop: str) -> Callable[[], None]:
    """Two statements by hand on one cursor, with nothing else around them."""
    cursor = conn.cursor()
    parameters = {"key": f"bench:raw:{uuid.uuid4().hex[:8]}", "token": TOKEN, "ttl": TTL,
                  "owner": "bench", "channel": "bench_unheard"}

    def cycle() -> None:
        cursor.execute(grant, parameters)
        cursor.execute(drop, parameters)
        cursor.fetchall()

    return cycle


def _minimal_pair(table: str) -> tuple[str, str]:
    """The smallest correct lease pair: no contention filter, no fence, no NOTIFY."""
    return (
        f'INSERT INTO "{table}" AS held (key, token, expires_at, owner)'
        " VALUES (%(key)s, %(token)s, clock_timestamp() + %(ttl)s * interval '1 second', 'b')"
        " ON CONFLICT (key) DO UPDATE SET token = EXCLUDED.token,"
        " expires_at = EXCLUDED.expires_at"
        " WHERE held.expires_at <= clock_timestamp() OR held.token = EXCLUDED.token",
        f'DELETE FROM "{table}" WHERE key = %(key)s AND token = %(token)s RETURNING 1',
    )


def _backend_cycle(backend: PostgresBackend, fenced: bool) -> Callable[[], None]:
    key = f"bench:backend:{uuid.uuid4().hex[:8]}"
    grant = backend.acquire_fenced if fenced else backend.acquire

    def cycle() -> None:
        grant(key, TOKEN, TTL, "bench")
        backend.release(key, TOKEN)

    return cycle


def _locker_cycle(locker: Locker) -> Callable[[], None]:
    key = f"bench:locker:{uuid.uuid4().hex[:8]}"

    def cycle() -> None:
        locker.acquire(key).release()

    return cycle


def _advisory_cycle(conn: Any) -> Callable[[], None]:
    cursor = conn.cursor()

    def cycle() -> None:
        cursor.execute("SELECT pg_try_advisory_lock(4242)")
        cursor.fetchone()
        cursor.execute("SELECT pg_advisory_unlock(4242)")
        cursor.fetchone()

    return cycle


def measure_cycles(
    contestants: dict[str, Callable[[], None]], seconds: float, rounds: int = 10
) -> dict[str, float]:
    """Best cycles/s of each contestant over interleaved rounds."""
    best = dict.fromkeys(contestants, 0.0)
    for _ in range(rounds):
        for name, cycle in contestants.items():
            count = 0
            started = time.perf_counter()
            deadline = started + seconds / rounds
            while time.perf_counter() < deadline:
                cycle()
                count += 1
            best[name] = max(best[name], count / (time.perf_counter() - started))
    return best


class _PollingBackend(PostgresBackend):
    """The same backend with release notifications switched off, so waiters poll."""

    capabilities: ClassVar[Capabilities] = Capabilities(
        server_clock=True, fencing=True, scan=True, batch_extend=True, counters=True
    )


def _handoffs(url: str, table: str, waiter: Locker, samples: int) -> list[float]:
    holder = PostgresBackend(_connect(url), table=table)
    key = f"bench:handoff:{uuid.uuid4().hex[:8]}"
    latencies: list[float] = []
    for index in range(samples + 1):
        assert holder.acquire(key, TOKEN, TTL, "holder")
        done: list[float] = []

        def wait_for_key(done: list[float]) -> None:
            waiter.acquire(key, timeout=10)
            done.append(time.perf_counter())

        thread = threading.Thread(target=wait_for_key, args=(done,))
        thread.start()
        # Let the waiter make its failed attempt and settle into its wait.
        time.sleep(0.03)
        started = time.perf_counter()
        holder.release(key, TOKEN)
        thread.join(15)
        assert waiter.force_release(key)
        if index:  # the first one also waits for the listener to connect
            latencies.append(done[0] - started)
    holder.connection.close()
    return latencies


def _bare_wakeups(url: str, samples: int) -> list[float]:
    listener, notifier = _connect(url), _connect(url)
    listener.cursor().execute("LISTEN bench_wake")
    cursor = notifier.cursor()
    latencies = []
    for _ in range(samples):
        started = time.perf_counter()
        cursor.execute("NOTIFY bench_wake, 'k'")
        while not listener.notifies:
            select.select([listener], [], [], 5)
            listener.poll()
        latencies.append(time.perf_counter() - started)
        listener.notifies.clear()
    listener.close()
    notifier.close()
    return latencies


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] * 1000


def main(argv: Optional[list[str]] = None) -> None:
    """Run both measurements and print the tables."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", 1)[0])
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--seconds", type=float, default=3.0, help="per contestant, in total")
    parser.add_argument("--handoffs", type=int, default=100)
    args = parser.parse_args(argv)

    admin = _connect(args.url)
    tables = {"logged": f"bench_pg_{uuid.uuid4().hex[:6]}", "unlogged": f"bench_pgu_{uuid.uuid4().hex[:6]}"}
    for statement in ddl(tables["logged"]) + ddl(tables["unlogged"], unlogged=True):
        admin.cursor().execute(statement)
    with admin.cursor() as cursor:
        cursor.execute("SELECT version(), current_setting('fsync'), current_setting('synchronous_commit')")
        version, fsync, sync_commit = cursor.fetchone()
    print(f"{version.split(',')[0]}; fsync={fsync}, synchronous_commit={sync_commit}; psycopg2 {psycopg2.__version__}")

    opened: list[Any] = []

    def backend(table: str, **options: Any) -> PostgresBackend:
        conn = _connect(args.url)
        opened.append(conn)
        return PostgresBackend(conn, table=table, **options)

    def raw(table: str, minimal: bool = False) -> Callable[[], None]:
        conn = _connect(args.url)
        opened.append(conn)
        if minimal:
            return _raw_cycle(conn, *_minimal_pair(table))
        # The backend's own two statements, typed by hand: the floor its overhead is judged on.
        statements = PostgresBackend(conn, table=table)._sql
        return _raw_cycle(conn, statements["acquire"], statements["release"])

    logged, unlogged = tables["logged"], tables["unlogged"]
    advisory = _connect(args.url)
    opened.append(advisory)
    contestants = {
        "raw SQL floor": raw(logged),
        "minimal pair (no NOTIFY, no filter)": raw(logged, minimal=True),
        "backend acquire/release": _backend_cycle(backend(logged), fenced=False),
        "backend fenced": _backend_cycle(backend(logged), fenced=True),
        "Locker": _locker_cycle(Locker(backend(logged), ttl=TTL)),
        "Locker fenced": _locker_cycle(Locker(backend(logged), ttl=TTL, fencing=True)),
        "pg_try_advisory_lock/unlock": _advisory_cycle(advisory),
        "backend, synchronous_commit=False": _backend_cycle(backend(logged, synchronous_commit=False), fenced=False),
        "raw SQL floor, UNLOGGED table": raw(unlogged),
        "minimal pair, UNLOGGED table": raw(unlogged, minimal=True),
        "backend, UNLOGGED table": _backend_cycle(backend(unlogged), fenced=False),
    }
    rates = measure_cycles(contestants, args.seconds)
    floor = rates["raw SQL floor"]
    print("\nUncontended acquire+release cycles (best of 10 interleaved rounds)")
    print(f"{'contestant':<38} {'cycles/s':>10} {'vs floor':>9}")
    for name, rate in rates.items():
        print(f"{name:<38} {rate:>10,.0f} {rate / floor:>8.2f}x")

    notified = Locker(backend(logged), ttl=TTL)
    polling_conn = _connect(args.url)
    opened.append(polling_conn)
    polling = Locker(_PollingBackend(polling_conn, table=logged), ttl=TTL, retry=Retry(delay=0.05))
    results = {
        "bare LISTEN/NOTIFY wake-up": _bare_wakeups(args.url, args.handoffs),
        "Locker hand-off, LISTEN/NOTIFY": _handoffs(args.url, logged, notified, args.handoffs),
        "Locker hand-off, polling every 50 ms": _handoffs(args.url, logged, polling, args.handoffs),
    }
    print(f"\nHand-off latency, release -> waiter holds ({args.handoffs} samples)")
    print(f"{'contestant':<38} {'p50 ms':>9} {'p99 ms':>9}")
    for name, latencies in results.items():
        print(f"{name:<38} {_percentile(latencies, 0.5):>9.2f} {_percentile(latencies, 0.99):>9.2f}")
    print(f"(median of all samples: {statistics.median(results['Locker hand-off, LISTEN/NOTIFY']) * 1000:.2f} ms)")

    notified.close()
    polling.close()
    for conn in opened:
        conn.close()
    for table in tables.values():
        admin.cursor().execute(f'DROP TABLE "{table}", "{table}_count"; DROP SEQUENCE "{table}_fence"')
    admin.close()


if __name__ == "__main__":
    main()
