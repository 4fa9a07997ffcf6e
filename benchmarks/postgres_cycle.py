"""Acquire+release cycles and hand-off latency on PostgreSQL, side by side in one run.

    python -m benchmarks.postgres_cycle [--url postgresql://postgres@127.0.0.1:5432/test]
                                        [--seconds 4] [--handoffs 100]

Run it against a server with its real durability settings (the throwaway test cluster runs
with ``fsync=off`` and would flatter every contestant). The script prints the server's
``fsync``/``synchronous_commit`` so each figure can be read next to them.

Cycle contestants, each on its own autocommit connection; each alternates with its floor one
cycle at a time and is judged on the median cycle time (see ``measure.py``):

- ``raw SQL floor``: the backend's own two statements (grant, and the token-checked delete
  that also sends the release NOTIFY on the backend's channel) typed by hand on a bare cursor,
  reading what each returns (the fence of a fenced grant, the release's row): what the
  library's overhead is judged against. Two commits, two WAL flushes, the same round trips.
  Like the backend, it runs the server-side prepared statements the backend makes (``EXECUTE``);
  ``raw SQL, prepared vs sent as text`` shows what preparing saves the server.
- ``minimal pair``: the smallest correct pair (``INSERT ... ON CONFLICT ... WHERE expired OR
  ours`` and a token-checked ``DELETE``, no contention filter, no NOTIFY), to show what the
  NOTIFY of every release costs.
- ``backend acquire/release`` and ``backend fenced``: ``PostgresBackend`` primitives (the
  release also sends the NOTIFY that wakes waiters; the fenced grant takes the per-key
  advisory lock and draws from the sequence).
- ``floor lock``: ``with`` the lock of ``benchmarks.floor_lock``, which does only the steps no
  correct lock can skip (the lease rules alone), on the backend's primitives.
- ``Locker`` and ``Locker fenced``: ``locker.acquire(key).release()``, the whole public path.
- ``pg_try_advisory_lock``: a session advisory lock and its unlock; no lease, no WAL, gone
  with the session, shown for scale only.
- Trade-offs a user may choose: the backend with ``synchronous_commit=False`` and on an
  ``UNLOGGED`` table (each next to its own raw floor on the same table).

Core CPU: this thread's CPU time per ``Locker`` cycle outside the backend's calls (the core's
own work) and inside them, between real PostgreSQL round trips and in a hot loop on the memory
backend. The same core code costs more between round trips, where the process slept while the
server ran and its caches went cold, which is why the core's share of a database cycle is larger
than its hot-loop cost suggests.

Hand-off: a waiter blocks in ``Locker.acquire`` while another connection holds the key; the
time from the start of the holder's release to the waiter holding the lock (p50/p99), with
LISTEN/NOTIFY (the default), with the release handing the key to the waiter in line
(``direct_handoff=True`` on both sides) and with notifications turned off (polling every
50 ms), next to a bare LISTEN/NOTIFY wake-up between two connections and the smallest durable
hand-off: one committed statement that updates a row and notifies (the floor of any hand-off
that writes the lease, as the direct one does). The rows take turns, one sample each, and the
Locker's rows are also given as their p50 over the durable floor's.
"""

from __future__ import annotations

import argparse
import dataclasses
import select
import threading
import time
import uuid
from collections.abc import Callable, Generator
from typing import Any, ClassVar, Optional

import psycopg2
from lease_lock.backends.base import Capabilities
from lease_lock.backends.memory import MemoryBackend
from lease_lock.backends.postgres import PostgresBackend, ddl
from lease_lock.backends.postgres._backend import _key_slot
from lease_lock.lock import Lock
from lease_lock.locker import Locker
from lease_lock.retry import Retry

from benchmarks.floor_lock import floor_cycle
from benchmarks.measure import add_json_argument, grant_cycle, in_turns, locker_cycle, paired, percentile, write_json

__all__ = ["main"]

TTL = 30.0
TOKEN = "b" * 32


def _connect(url: str) -> Any:
    conn = psycopg2.connect(url)
    conn.autocommit = True
    return conn


def _raw_cycle(conn: Any, grant: str, drop: str, channel: str = "bench_unheard",
               read_grant: bool = False, prepare: tuple[str, ...] = (), **extra: Any) -> Callable[[], None]:
    """Two statements by hand on one cursor, with nothing else around them.

    ``read_grant``: the grant returns a row (the fence), read as the caller that asked must.
    ``prepare``: queries run once first (they prepare the statements the cycle executes).
    """
    cursor = conn.cursor()
    key = f"bench:raw:{uuid.uuid4().hex[:8]}"
    parameters = {"key": key, "token": TOKEN, "ttl": TTL, "owner": "bench", "channel": channel,
                  **{name: make(key) for name, make in extra.items()}}
    for query in prepare:
        cursor.execute(query, parameters)

    def cycle() -> None:
        cursor.execute(grant, parameters)
        cursor.execute(drop, parameters)
        cursor.fetchall()

    def fenced_cycle() -> None:
        cursor.execute(grant, parameters)
        cursor.fetchall()
        cursor.execute(drop, parameters)
        cursor.fetchall()

    return fenced_cycle if read_grant else cycle


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
    return grant_cycle(backend.acquire_fenced if fenced else backend.acquire, backend.release, TOKEN, TTL)


class _CpuCounted:
    """Mixed into a backend: adds up this thread's CPU time inside its grant and release."""

    inside = 0.0

    def acquire(self, key: str, token: str, ttl: float, owner: str) -> bool:
        started = time.thread_time()
        try:
            return super().acquire(key, token, ttl, owner)  # type: ignore[misc, no-any-return]
        finally:
            self.inside += time.thread_time() - started

    def release(self, key: str, token: str) -> bool:
        started = time.thread_time()
        try:
            return super().release(key, token)  # type: ignore[misc, no-any-return]
        finally:
            self.inside += time.thread_time() - started


class _CountedPostgres(_CpuCounted, PostgresBackend):
    pass


class _CountedMemory(_CpuCounted, MemoryBackend):
    pass


def _core_cpu(backend: Any, cycles: int) -> tuple[float, float]:
    """Microseconds of this thread's CPU per ``Locker`` cycle outside and inside the calls of
    ``backend`` (a :class:`_CpuCounted` backend); the run of three with the least outside."""
    locker = Locker(backend, ttl=TTL)
    key = f"bench:cpu:{uuid.uuid4().hex[:8]}"
    runs = []
    for _ in range(3):
        backend.inside = 0.0
        started = time.thread_time()
        for _ in range(cycles):
            locker.acquire(key).release()
        total = time.thread_time() - started
        runs.append(((total - backend.inside) / cycles * 1e6, backend.inside / cycles * 1e6))
    locker.close()
    return min(runs, key=lambda run: run[0])


def _advisory_cycle(conn: Any) -> Callable[[], None]:
    cursor = conn.cursor()

    def cycle() -> None:
        cursor.execute("SELECT pg_try_advisory_lock(4242)")
        cursor.fetchone()
        cursor.execute("SELECT pg_advisory_unlock(4242)")
        cursor.fetchone()

    return cycle


class _PollingBackend(PostgresBackend):
    """The same backend with release notifications switched off, so waiters poll."""

    capabilities: ClassVar[Capabilities] = dataclasses.replace(PostgresBackend.capabilities, release_notify=False)


def _handoff_samples(
    url: str, table: str, waiter: Locker, *, direct: bool = False
) -> Generator[float, None, None]:
    """Hand-offs from a holder of its own to ``waiter``, one latency (seconds) per ``next()``."""
    holder = PostgresBackend(_connect(url), table=table, direct_handoff=direct)
    key = f"bench:handoff:{uuid.uuid4().hex[:8]}"
    try:
        first = True
        while True:
            assert holder.acquire(key, TOKEN, TTL, "holder")
            done: list[float] = []
            taken: list[Lock] = []

            def wait_for_key(done: list[float], taken: list[Lock]) -> None:
                # Kept until the sample ends: a held lock that is dropped is given back by the library.
                taken.append(waiter.acquire(key, timeout=10))
                done.append(time.perf_counter())

            thread = threading.Thread(target=wait_for_key, args=(done, taken))
            thread.start()
            # Let the waiter make its failed attempt and settle into its wait.
            time.sleep(0.03)
            started = time.perf_counter()
            holder.release(key, TOKEN)
            thread.join(15)
            assert taken[0].release()
            if not first:  # the first one also waits for the listener to connect
                yield done[0] - started
            first = False
    finally:
        holder.connection.close()


def _await_notification(listener: Any) -> None:
    """Block until ``listener`` has a notification, then drop what it received."""
    while not listener.notifies:
        select.select([listener], [], [], 5)
        listener.poll()
    listener.notifies.clear()


def _bare_wakeup_samples(url: str) -> Generator[float, None, None]:
    """A listener woken by a NOTIFY alone, one latency (seconds) per ``next()``."""
    listener, notifier = _connect(url), _connect(url)
    listener.cursor().execute("LISTEN bench_wake")
    cursor = notifier.cursor()
    try:
        while True:
            started = time.perf_counter()
            cursor.execute("NOTIFY bench_wake, 'k'")
            _await_notification(listener)
            yield time.perf_counter() - started
    finally:
        listener.close()
        notifier.close()


def _durable_wakeup_samples(url: str) -> Generator[float, None, None]:
    """A listener woken by the smallest durable hand-off there is, one latency (seconds) per
    ``next()``: one statement that updates a row and notifies, committed as the server commits
    (``synchronous_commit`` as set), after the same pause as each Locker hand-off sample. A
    NOTIFY alone writes nothing, so the bare wake-up has no commit to wait for; every hand-off
    of a lease row has one."""
    listener, writer = _connect(url), _connect(url)
    table = f"bench_pg_floor_{uuid.uuid4().hex[:6]}"
    cursor = writer.cursor()
    cursor.execute(f'CREATE TABLE "{table}" (key text PRIMARY KEY, holder bigint NOT NULL)')
    cursor.execute(f'INSERT INTO "{table}" VALUES (%s, 0)', ("k",))
    listener.cursor().execute("LISTEN bench_durable")
    handing = (
        f'WITH handed AS (UPDATE "{table}" SET holder = holder + 1 WHERE key = %s RETURNING key)'
        " SELECT pg_notify('bench_durable', key) FROM handed"
    )
    try:
        while True:
            time.sleep(0.03)
            started = time.perf_counter()
            cursor.execute(handing, ("k",))
            _await_notification(listener)
            yield time.perf_counter() - started
    finally:
        cursor.execute(f'DROP TABLE "{table}"')
        listener.close()
        writer.close()


def main(argv: Optional[list[str]] = None) -> None:
    """Run both measurements and print the tables."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", 1)[0])
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--seconds", type=float, default=4.0, help="per contestant")
    parser.add_argument("--handoffs", type=int, default=100)
    add_json_argument(parser)
    args = parser.parse_args(argv)
    output: dict[str, Any] = {"cycles": [], "core_cpu": [], "handoffs": []}

    admin = _connect(args.url)
    tables = {"logged": f"bench_pg_{uuid.uuid4().hex[:6]}", "unlogged": f"bench_pgu_{uuid.uuid4().hex[:6]}"}
    for statement in ddl(tables["logged"]) + ddl(tables["unlogged"], unlogged=True):
        admin.cursor().execute(statement)
    with admin.cursor() as cursor:
        cursor.execute("SELECT version(), current_setting('fsync'), current_setting('synchronous_commit')")
        version, fsync, sync_commit = cursor.fetchone()
    print(f"{version.split(',')[0]}; fsync={fsync}, synchronous_commit={sync_commit}; psycopg2 {psycopg2.__version__}")

    opened: list[Any] = []

    def connection() -> Any:
        conn = _connect(args.url)
        opened.append(conn)
        return conn

    def backend(table: str, **options: Any) -> PostgresBackend:
        return PostgresBackend(connection(), table=table, **options)

    def floor_on(backend: PostgresBackend, fenced: bool = False, prepared: bool = True) -> Callable[[], None]:
        # The backend's own two statements typed by hand on the backend's own connection, so
        # that the pair shares one server process and only the client-side work differs.
        # The release notifies on the backend's own channel, so both sides send the same NOTIFY.
        # prepared: EXECUTE the statements the backend prepares (prepared first, once), as the
        # backend does; otherwise send their text, parsed and planned on every call.
        grant, drop = backend._sql["acquire_fenced" if fenced else "acquire"], backend._sql["release"]
        extra: dict[str, Callable[[str], int]] = {}
        if fenced:
            extra = {"gate": lambda key: backend.names.gate, "slot": _key_slot}
        if prepared:
            return _raw_cycle(backend.connection, grant.sql, drop.sql, backend.names.channel, fenced,
                              (grant.prepare_then_sql, drop.prepare_then_sql), **extra)
        return _raw_cycle(backend.connection, grant.text, drop.text, backend.names.channel, fenced, **extra)

    def raw(table: str) -> Callable[[], None]:
        return floor_on(backend(table))

    logged, unlogged = tables["logged"], tables["unlogged"]
    # (contestant, its cycle, the floor it alternates with)
    contestants: list[tuple[str, Callable[[], None], Callable[[], None]]] = []

    def add(name: str, table: str, make_cycle: Callable[[PostgresBackend], Callable[[], None]],
            fenced: bool = False, **options: Any) -> None:
        contestant_backend = backend(table, **options)
        contestants.append((name, make_cycle(contestant_backend), floor_on(contestant_backend, fenced)))

    def on_same_connection(
        make_cycle: Callable[[Any], Callable[[], None]], table: str
    ) -> tuple[Callable[[], None], Callable[[], None]]:
        """A contestant built on a bare connection, and the floor on that same connection.

        These contestants send their statements as text, so their floor does too.
        """
        shared = backend(table)
        return make_cycle(shared.connection), floor_on(shared, prepared=False)

    add("backend acquire/release", logged, lambda b: _backend_cycle(b, fenced=False))
    add("backend fenced", logged, lambda b: _backend_cycle(b, fenced=True), fenced=True)
    add("floor lock (lease rules alone)", logged, lambda b: floor_cycle(b, f"bench:floor:{uuid.uuid4().hex[:8]}", TTL))
    add("Locker", logged, lambda b: locker_cycle(Locker(b, ttl=TTL)))
    add("Locker fenced", logged, lambda b: locker_cycle(Locker(b, ttl=TTL, fencing=True)), fenced=True)
    add("backend, synchronous_commit=False", logged, lambda b: _backend_cycle(b, fenced=False),
        synchronous_commit=False)
    add("backend, UNLOGGED table", unlogged, lambda b: _backend_cycle(b, fenced=False))
    # Against the same plain floor: what the line's gate and lean release cost a cycle that
    # finds nobody in line.
    add("backend, direct_handoff=True", logged, lambda b: _backend_cycle(b, fenced=False), direct_handoff=True)
    for name, table, make_cycle in (
        ("minimal pair (no NOTIFY, no filter)", logged, lambda c: _raw_cycle(c, *_minimal_pair(logged))),
        ("minimal pair, UNLOGGED table", unlogged, lambda c: _raw_cycle(c, *_minimal_pair(unlogged))),
        ("pg_try_advisory_lock/unlock", logged, _advisory_cycle),
    ):
        cycle, floor = on_same_connection(make_cycle, table)
        contestants.append((name, cycle, floor))
    unlogged_floor = raw(unlogged)
    contestants.append(("raw SQL, UNLOGGED table", unlogged_floor, raw(logged)))
    as_text = backend(logged)
    contestants.append(("raw SQL, prepared vs sent as text", floor_on(as_text), floor_on(as_text, prepared=False)))

    print("\nUncontended acquire+release cycles: each contestant alternates one cycle at a time")
    print("with its floor, the backend's own two statements (fenced ones for fenced rows) typed by")
    print("hand on the same connection and table, EXECUTEd as the backend prepares them (the minimal")
    print("pair and advisory rows: sent as text, against the floor sent as text; the last two rows:")
    print("the UNLOGGED floor against the logged, the prepared floor against the floor as text).")
    print(f"{args.seconds:g} s each; rates at the median cycle time of each side")
    print(f"{'contestant':<38} {'cycles/s':>9} {'floor/s':>8} {'vs floor':>9}")
    for name, cycle, floor in contestants:
        pairing = paired(floor, cycle, args.seconds)
        print(f"{name:<38} {pairing.rate:>9,.0f} {pairing.floor_rate:>8,.0f} {pairing.ratio:>8.2f}x")
        output["cycles"].append({"name": name, "rate": pairing.rate, "floor_rate": pairing.floor_rate,
                                 "ratio": pairing.ratio})

    # Where the Locker's own time goes: the same core code costs more CPU between two real round
    # trips (the caches went cold while the process slept) than in a hot loop on memory.
    cpu_cycles = max(200, int(args.seconds * 500))
    between = _core_cpu(_CountedPostgres(connection(), table=logged), cpu_cycles)
    hot = _core_cpu(_CountedMemory(), cpu_cycles * 20)
    print("\nThis thread's CPU per Locker cycle (µs; the best of three runs), outside the backend's")
    print("calls (the core) and inside them")
    print(f"{'where':<38} {'core':>9} {'backend':>9}")
    for name, (outside, inside) in (
        ("between PostgreSQL round trips", between), ("hot loop on the memory backend", hot)
    ):
        print(f"{name:<38} {outside:>9.1f} {inside:>9.1f}")
        output["core_cpu"].append({"name": name, "core_us": outside, "backend_us": inside})

    notified = Locker(backend(logged), ttl=TTL)
    direct = Locker(backend(logged, direct_handoff=True), ttl=TTL)
    polling_conn = _connect(args.url)
    opened.append(polling_conn)
    polling = Locker(_PollingBackend(polling_conn, table=logged), ttl=TTL, retry=Retry(delay=0.05))
    samplers = {
        "bare LISTEN/NOTIFY wake-up": _bare_wakeup_samples(args.url),
        "bare durable update + NOTIFY wake-up": _durable_wakeup_samples(args.url),
        "Locker hand-off, LISTEN/NOTIFY": _handoff_samples(args.url, logged, notified),
        "Locker hand-off, direct_handoff=True": _handoff_samples(args.url, logged, direct, direct=True),
        "Locker hand-off, polling every 50 ms": _handoff_samples(args.url, logged, polling),
    }
    results = in_turns(samplers, args.handoffs)
    # Every lease hand-off waits for a durable commit and a wake-up, so the Locker's rows are set
    # against the durable floor's p50 (1.00: as fast as the commit and the wake-up themselves).
    floor_p50 = percentile(results["bare durable update + NOTIFY wake-up"], 0.5)
    print(f"\nHand-off latency, release -> waiter holds ({args.handoffs} samples)")
    print(f"{'contestant':<38} {'p50 ms':>9} {'p99 ms':>9} {'vs durable floor':>17}")
    for name, latencies in results.items():
        p50, p99 = percentile(latencies, 0.5), percentile(latencies, 0.99)
        row: dict[str, Any] = {"name": name, "p50_ms": p50 * 1000, "p99_ms": p99 * 1000}
        versus = "-"
        if name.startswith("Locker"):
            row["ratio_to_durable_floor"] = p50 / floor_p50
            versus = f"{p50 / floor_p50:.2f}"
        print(f"{name:<38} {p50 * 1000:>9.2f} {p99 * 1000:>9.2f} {versus:>17}")
        output["handoffs"].append(row)
    write_json(args.json, "postgres_cycle", argv, output)

    notified.close()
    direct.close()
    polling.close()
    for conn in opened:
        conn.close()
    for table in tables.values():
        admin.cursor().execute(
            f'DROP TABLE "{table}", "{table}_count", "{table}_queue"; DROP SEQUENCE "{table}_fence"'
        )
    admin.close()


if __name__ == "__main__":
    main()
