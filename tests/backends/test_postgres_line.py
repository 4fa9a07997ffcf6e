"""Direct hand-off on PostgreSQL: a release hands the key to the oldest fresh waiter in line.

The waiter wakes up holding the key for a claim window, which its heartbeat turns into a full
lease; a waiter that dies, stops or leaves before then loses the key when the window ends, and
the next waiter gets it. Everything runs on a real PostgreSQL server; the stopped and killed
waiters are real processes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from typing import Any, Optional

import psycopg2
import psycopg2.pool
import pytest
from benchmarks.chaos_harness.proxy import TcpProxy
from lease_lock import Locker, Retry
from lease_lock.backends.base import WaitingLine
from lease_lock.backends.line import CLAIM_MAX, LINE_WAITERS
from lease_lock.backends.postgres import PostgresBackend, ddl
from lease_lock.errors import LockHeldError, ValidationError
from lease_lock.testing import wait_until

from tests.support.events import Recorder
from tests.support.handoff import (
    check_a_waiter_that_times_out_leaves_the_line,
    check_closing_the_locker_ends_a_wait_in_line,
    hand_key_round,
)
from tests.support.postgres_server import PostgresServer, sql
from tests.support.processes import kill_process
from tests.support.silent_wait import check_a_silent_line_ends_its_wait_as_an_outage

HOLDER = "h" * 32


@pytest.fixture
def table() -> str:
    return f"ln_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def key() -> str:
    return f"test:line:{uuid.uuid4().hex}"


def _in_line(admin: Any, table: str, key: str) -> int:
    """How many waiters have a place in ``key``'s line (the burst row has the empty token)."""
    return int(sql(admin, f"SELECT count(*) FROM \"{table}_queue\" WHERE key = %s AND token <> ''", key)[0][0])


def _holder(admin: Any, table: str, key: str) -> tuple[str, float, Any]:
    """The token, the seconds left (server clock) and the fence of ``key``'s live lease, or ``("", 0, None)``."""
    rows = sql(
        admin,
        f'SELECT token, extract(epoch FROM expires_at - clock_timestamp())::float8, fence FROM "{table}"'
        " WHERE key = %s AND expires_at > clock_timestamp()",
        key,
    )
    return (rows[0][0], rows[0][1], rows[0][2]) if rows else ("", 0.0, None)


def _locker(url: str, table: str, **options: Any) -> Locker:
    locker = Locker(PostgresBackend.from_url(url, table=table, direct_handoff=True), **options, owns_backend=True)
    return locker


def _waiting_thread(locker: Locker, key: str, out: list[Any], **options: Any) -> threading.Thread:
    def wait() -> None:
        out.append(locker.acquire(key, timeout=60, **options))

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    return thread


def test_the_postgres_backend_offers_a_line_once_its_tables_are_checked(
    postgres_server: PostgresServer, table: str, key: str
) -> None:
    backend = PostgresBackend.from_url(postgres_server.url, table=table, direct_handoff=True)
    try:
        # Nothing has checked the tables yet: no place, and nothing asked.
        assert not _direct(backend.join_line(key, "w" * 32, 30, "w", False, time.monotonic))
        assert backend.acquire(key, HOLDER, 30, "holder")
        line = backend.join_line(key, "w" * 32, 30, "w", False, time.monotonic)
        assert line is not None
        line.leave(False)
    finally:
        backend.close()


def test_without_direct_handoff_no_thread_waits_in_line_and_a_release_hands_nothing_over(
    postgres_server: PostgresServer, admin: Any, table: str, key: str
) -> None:
    backend = PostgresBackend.from_url(postgres_server.url, table=table)
    try:
        assert backend.direct_handoff is False
        assert backend.acquire(key, HOLDER, 30, "holder")
        assert not _direct(backend.join_line(key, "w" * 32, 30, "w", False, time.monotonic))
        # A place written by a process that has it on is not handed the key by this one.
        on = PostgresBackend.from_url(f"{postgres_server.url}?direct_handoff=true", table=table)
        try:
            assert on.direct_handoff is True
            assert on.acquire(f"{key}:other", HOLDER, 30, "holder")  # checks the tables
            line = on.join_line(key, "w" * 32, 30, "w", False, time.monotonic)
            assert line is not None
            assert line.ask() is None  # in line behind the holder
            assert backend.release(key, HOLDER)
            assert sql(admin, f'SELECT token FROM "{table}" WHERE key = %s', key) == []
            line.leave(False)
        finally:
            on.close()
    finally:
        backend.close()


def test_direct_handoff_must_be_a_bool(postgres_server: PostgresServer) -> None:
    with pytest.raises(ValidationError, match="direct_handoff"):
        PostgresBackend.from_url(f"{postgres_server.url}?direct_handoff=maybe")
    conn = psycopg2.connect(postgres_server.url)
    try:
        with pytest.raises(ValidationError, match="direct_handoff"):
            PostgresBackend(conn, direct_handoff="yes")  # type: ignore[arg-type]
    finally:
        conn.close()


def test_a_release_hands_the_key_to_the_waiter_without_another_attempt(
    postgres_server: PostgresServer, admin: Any, table: str, key: str
) -> None:
    events = Recorder()
    holder = _locker(postgres_server.url, table, ttl=30, fencing=True)
    waiter = _locker(postgres_server.url, table, ttl=30, on_event=events, fencing=True)
    try:
        held = holder.acquire(key)
        got: list[Any] = []
        thread = _waiting_thread(waiter, key, got)
        assert wait_until(lambda: _in_line(admin, table, key) == 1, 30)
        attempts_before = events.types().count("contended")
        held.release()
        thread.join(60)
        [lock] = got
        # Nothing was tried after the release: the release itself made the grant, for the
        # claim window only, with a fence of its own, larger than the holder's.
        assert events.types().count("contended") == attempts_before
        token, left, fence = _holder(admin, table, key)
        assert token == lock.token
        assert 0 < lock.expires_in <= CLAIM_MAX and 0 < left <= CLAIM_MAX
        assert lock.fence is not None and held.fence is not None and lock.fence == fence > held.fence
        assert _in_line(admin, table, key) == 0
        lock.release()
        assert not holder.backend.inspect(key).held
    finally:
        holder.close()
        waiter.close()


@pytest.mark.parametrize("auto_extend", [True, False], ids=["auto-extend", "no-auto-extend"])
def test_the_heartbeat_turns_a_handed_claim_into_a_full_lease(
    postgres_server: PostgresServer, admin: Any, table: str, key: str, auto_extend: bool
) -> None:
    # ttl 9 s: the claim window is CLAIM_MAX (6 s), so the full lease is longer than the claim.
    events = Recorder()
    holder = _locker(postgres_server.url, table, ttl=9)
    waiter = _locker(postgres_server.url, table, ttl=9, on_event=events)
    try:
        held = holder.acquire(key)
        got: list[Any] = []
        thread = _waiting_thread(waiter, key, got, auto_extend=auto_extend)
        assert wait_until(lambda: _in_line(admin, table, key) == 1, 30)
        held.release()
        thread.join(60)
        [lock] = got
        assert lock.expires_in <= CLAIM_MAX
        # Extended once, a third of the way into the claim window, whatever auto_extend says.
        assert events.wait_for("extended")
        assert lock.expires_in > CLAIM_MAX
        assert _holder(admin, table, key)[1] > CLAIM_MAX
        assert lock.is_held()
        lock.release()
    finally:
        holder.close()
        waiter.close()


_WAITER = textwrap.dedent(
    """
    import sys
    from lease_lock import Locker
    from lease_lock.backends.postgres import PostgresBackend
    from lease_lock.errors import LockHeldError

    url, table, key, timeout = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    locker = Locker(PostgresBackend.from_url(url, table=table, direct_handoff=True), ttl=2)
    print("waiting", flush=True)
    try:
        lock = locker.acquire(key, timeout=timeout)
    except LockHeldError:
        print("held", flush=True)
    else:
        print("granted", lock.token, flush=True)
        lock.release()
    locker.close()
    """
)


def _waiter_process(url: str, table: str, key: str, timeout: float) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    process = subprocess.Popen(
        [sys.executable, "-c", _WAITER, url, table, key, str(timeout)], stdout=subprocess.PIPE, text=True, env=env
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "waiting"
    return process


@pytest.mark.parametrize("fate", ["killed", "stopped"])
def test_a_waiter_that_cannot_take_a_handed_key_loses_it_at_the_end_of_its_claim(
    postgres_server: PostgresServer, admin: Any, table: str, key: str, fate: str
) -> None:
    holder = _locker(postgres_server.url, table, ttl=2)
    held = holder.acquire(key)
    process = _waiter_process(postgres_server.url, table, key, 5.0)
    try:
        assert wait_until(lambda: _in_line(admin, table, key) == 1, 30)
        process.send_signal(signal.SIGKILL if fate == "killed" else signal.SIGSTOP)
        if fate == "killed":
            process.wait(30)
        held.release()
        # The release handed the key to the waiter, which cannot take it: for the claim window
        # (ttl 2 s here) at most.
        handed, left, _ = _holder(admin, table, key)
        assert handed not in ("", held.token)
        assert 0 < left <= 2
        # Then it is free again, and another waiter gets it.
        taken = holder.acquire(key, timeout=30)
        assert taken.token != handed
        if fate == "stopped":
            process.send_signal(signal.SIGCONT)
            # The waiter wakes long after its claim ended: it must not take that grant, and
            # its own wait runs out while the key is held here.
            out, _ = process.communicate(timeout=60)
            assert out.split() == ["held"]
            assert taken.is_held() and _holder(admin, table, key)[0] == taken.token
        taken.release()
        assert not holder.backend.inspect(key).held
    finally:
        if fate == "stopped":
            process.send_signal(signal.SIGCONT)
        kill_process(process)
        if process.stdout is not None:
            process.stdout.close()
        holder.close()


def test_a_waiter_that_times_out_in_line_leaves_it(
    postgres_server: PostgresServer, admin: Any, table: str, key: str
) -> None:
    holder = _locker(postgres_server.url, table, ttl=30)
    waiter = _locker(postgres_server.url, table, ttl=30)
    try:
        check_a_waiter_that_times_out_leaves_the_line(holder, waiter, key, lambda: _in_line(admin, table, key))
    finally:
        holder.close()
        waiter.close()


def test_a_release_racing_a_waiters_timeout_never_leaves_the_key_held_by_nobody(
    postgres_server: PostgresServer, admin: Any, table: str, key: str
) -> None:
    # The release comes about when the waiter's wait runs out, a little before or after, round
    # after round. Whichever wins, once the wait has ended the key is held exactly when the
    # waiter got a lock (a grant the leaving waiter was handed goes back, to nobody here).
    holder = _locker(postgres_server.url, table, ttl=30)
    waiter = _locker(postgres_server.url, table, ttl=30)
    outcomes = {"granted": 0, "timeout": 0}
    try:
        for round_ in range(12):
            held = holder.acquire(key, timeout=30)
            got: list[Any] = []

            def wait(got: list[Any] = got) -> None:
                try:
                    got.append(waiter.acquire(key, timeout=0.5))
                except LockHeldError as error:
                    got.append(error)

            thread = threading.Thread(target=wait, daemon=True)
            thread.start()
            assert wait_until(lambda t=thread: _in_line(admin, table, key) == 1 or not t.is_alive(), 30)
            time.sleep(0.4 + 0.02 * round_)  # not a timing assertion: spreads the release around the timeout
            held.release()
            thread.join(60)
            [result] = got
            if isinstance(result, LockHeldError):
                outcomes["timeout"] += 1
                assert result.reason == "timeout"
                assert not holder.backend.inspect(key).held
            else:
                outcomes["granted"] += 1
                assert _holder(admin, table, key)[0] == result.token
                result.release()
            assert _in_line(admin, table, key) == 0
        assert sum(outcomes.values()) == 12
    finally:
        holder.close()
        waiter.close()


def test_leaving_with_a_handed_key_hands_it_to_the_next_waiter(
    postgres_server: PostgresServer, admin: Any, table: str, key: str
) -> None:
    backend = PostgresBackend.from_url(postgres_server.url, table=table, direct_handoff=True)
    first, second = "a" * 32, "b" * 32
    try:
        assert backend.acquire_fenced(key, HOLDER, 30, "holder") is not None
        lines = [backend.join_line(key, token, 30, token[0], True, time.monotonic) for token in (first, second)]
        assert lines[0] is not None and lines[1] is not None
        assert lines[0].ask() is None and lines[1].ask() is None  # both in line, oldest first
        assert backend.release(key, HOLDER)
        handed = lines[0].wait(30)
        assert handed is not None and handed.claimed and handed.lease <= CLAIM_MAX
        assert _holder(admin, table, key)[0] == first
        # The hand-over gave the first waiter a burst; it runs another minute here, so that the
        # leave below surely comes inside it.
        sql(
            admin,
            f"UPDATE \"{table}_queue\" SET fresh_until = clock_timestamp() + interval '60 seconds'"
            " WHERE key = %s AND token = ''",
            key,
        )
        # The first waiter leaves without using the grant: the key goes on to the second at once,
        # its burst notwithstanding (a burst is for a holder that takes the key back).
        lines[0].leave(False)
        token, left, fence = _holder(admin, table, key)
        assert token == second and 0 < left <= CLAIM_MAX and fence > handed.fence
        grant = lines[1].wait(30)
        assert grant is not None and grant.fence == fence
        lines[1].leave(True)
        assert _in_line(admin, table, key) == 0
    finally:
        backend.force_release(key)
        backend.close()


def test_fences_grow_across_direct_grants_and_ordinary_ones(
    postgres_server: PostgresServer, admin: Any, table: str, key: str
) -> None:
    lockers = [_locker(postgres_server.url, table, ttl=30, fencing=True) for _ in range(3)]
    fences: list[int] = []
    try:
        lock = lockers[0].acquire(key)
        for index in range(6):
            got: list[Any] = []
            waiter = lockers[(index + 1) % 3]
            thread = _waiting_thread(waiter, key, got)
            assert wait_until(lambda: _in_line(admin, table, key) == 1, 30)
            assert lock.fence is not None
            fences.append(lock.fence)
            lock.release()
            thread.join(60)
            [lock] = got
        assert lock.fence is not None
        fences.append(lock.fence)
        lock.release()
        later = lockers[0].acquire(key)
        assert later.fence is not None
        fences.append(later.fence)
        later.release()
        assert fences == sorted(set(fences)), fences
    finally:
        for locker in lockers:
            locker.close()


def test_stale_places_are_skipped_and_swept(postgres_server: PostgresServer, admin: Any, table: str, key: str) -> None:
    backend = PostgresBackend.from_url(postgres_server.url, table=table, direct_handoff=True)
    try:
        assert backend.acquire(key, HOLDER, 30, "holder")
        line = backend.join_line(key, "w" * 32, 30, "w", False, time.monotonic)
        assert line is not None and line.ask() is None
        # The waiter died without a word: its place goes stale.
        sql(admin, f'UPDATE "{table}_queue" SET fresh_until = clock_timestamp() - interval \'1 second\'')
        assert backend.release(key, HOLDER)
        # Not handed to the stale place: the key is free; the sweep deletes the place.
        assert not backend.inspect(key).held
        assert _in_line(admin, table, key) == 1
        backend.sweep_expired()
        assert _in_line(admin, table, key) == 0
        # A release that hands the key on drops the stale places it meets on the way.
        second = backend.join_line(key, "v" * 32, 30, "v", False, time.monotonic)
        assert second is not None
        assert backend.acquire(key, HOLDER, 30, "holder") and line.ask() is None and second.ask() is None
        sql(
            admin,
            f'UPDATE "{table}_queue" SET fresh_until = clock_timestamp() - interval \'1 second\' WHERE token = %s',
            "w" * 32,
        )
        assert backend.release(key, HOLDER)
        assert backend.inspect(key).owner == "v"
        assert _in_line(admin, table, key) == 0
        second.leave(False)
        assert not backend.inspect(key).held
        line.leave(False)
    finally:
        backend.force_release(key)
        backend.close()


def test_releases_during_a_holders_burst_leave_the_key_free_and_the_head_of_the_line_asks_when_it_ends(
    postgres_server: PostgresServer, admin: Any, table: str, key: str
) -> None:
    backend = PostgresBackend.from_url(postgres_server.url, table=table, direct_handoff=True)
    waiter = "w" * 32
    try:
        assert backend.acquire(key, HOLDER, 30, "holder")
        line = backend.join_line(key, waiter, 30, "waiter", False, time.monotonic)
        assert line is not None and line.ask() is None
        # A hand-over gave the holder a burst that runs another minute (the key's row of the
        # line with the empty token).
        sql(
            admin,
            f"INSERT INTO \"{table}_queue\" VALUES (%s, '', '', 0, false, '', '', clock_timestamp(),"
            " clock_timestamp() + interval '60 seconds')",
            key,
        )
        for _ in range(3):
            # The holder releases and takes the key straight back: it keeps it, and nothing is
            # handed over.
            assert backend.release(key, HOLDER)
            assert not backend.inspect(key).held
            assert backend.acquire(key, HOLDER, 30, "holder")
        assert _in_line(admin, table, key) == 1
        # The head of the line is told when the burst ends: its next ask is due then (here: its
        # usual refresh, which comes sooner than a minute).
        assert line.ask() is None
        assert backend.release(key, HOLDER)
        assert line.ask() == 0  # the key was left free for it
        line.leave(True)
        assert _in_line(admin, table, key) == 0
    finally:
        backend.force_release(key)
        backend.close()


def _long_claims(monkeypatch: pytest.MonkeyPatch, burst: float = 0.0) -> None:
    """Claim windows as long as the lease asked for, so that a waiter's own refresh (a quarter of
    its window) comes minutes later and only a word from a release can bring its next ask; with
    ``burst``, every hand-over gives a burst that long, so that the releases after it surely
    come inside it."""
    monkeypatch.setattr("lease_lock.backends.postgres._backend.claim_for", lambda ttl: ttl)
    if burst:
        monkeypatch.setattr("lease_lock.backends.postgres._backend.BURST", burst)


def test_a_release_during_a_burst_tells_the_head_of_the_line_once(
    postgres_server: PostgresServer, admin: Any, table: str, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _long_claims(monkeypatch)
    backend = PostgresBackend.from_url(postgres_server.url, table=table, direct_handoff=True)
    waiter = "w" * 32
    try:
        assert backend.acquire(key, HOLDER, 600, "holder")
        line = backend.join_line(key, waiter, 600, "waiter", False, time.monotonic)
        assert line is not None and line.ask() is None
        [(channel,)] = sql(admin, f'SELECT channel FROM "{table}_queue" WHERE key = %s AND token = %s', key, waiter)
        sql(admin, f'LISTEN "{channel}"')
        # A hand-over gave the holder a burst that runs another ten minutes.
        sql(
            admin,
            f"INSERT INTO \"{table}_queue\" VALUES (%s, '', '', 0, false, '', '', clock_timestamp(),"
            " clock_timestamp() + interval '600 seconds')",
            key,
        )
        for _ in range(3):
            # The holder releases and takes the key straight back: only the first release tells
            # the head of the line that the key went free (it then asks, and learns when the
            # burst ends); the holder's next ones wake nobody.
            assert backend.release(key, HOLDER)
            assert backend.acquire(key, HOLDER, 600, "holder")
        sql(admin, "SELECT pg_notify(%s, 'end')", channel)
        payloads: list[str] = []
        while "end" not in payloads:
            assert wait_until(lambda: bool(admin.poll() or admin.notifies), 30)
            payloads += [note.payload for note in admin.notifies]
            admin.notifies.clear()
        assert len(payloads) == 2, payloads
        # Released for good inside the burst: the head of the line, told, asks at once and takes
        # the key, though its own refresh is minutes away.
        sql(admin, f'UNLISTEN "{channel}"')
        assert backend.release(key, HOLDER)
        grant = line.wait(60)
        assert grant is not None and not grant.claimed
        line.leave(True)
        assert backend.inspect(key).owner == "waiter"
    finally:
        backend.force_release(key)
        backend.close()


def test_one_shot_holders_hand_the_key_along_the_line_through_bursts(
    postgres_server: PostgresServer, admin: Any, table: str, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every release below comes inside the burst of a hand-over, and no waiter asks again by
    # itself for minutes: a release that told nobody would leave the rest of the line to time out.
    _long_claims(monkeypatch, burst=600)
    patient = Retry(delay=600, timeout=1200)
    holder = _locker(postgres_server.url, table, ttl=600)
    waiters = [_locker(postgres_server.url, table, ttl=600, retry=patient) for _ in range(4)]
    taken: list[str] = []
    errors: list[BaseException] = []

    def take_once(locker: Locker) -> None:
        try:
            with locker.lock(key, timeout=20) as lock:
                taken.append(lock.token)
        except BaseException as error:  # noqa: BLE001 - handed to the test thread
            errors.append(error)

    try:
        held = holder.acquire(key)
        threads = [threading.Thread(target=take_once, args=(locker,), daemon=True) for locker in waiters]
        for thread in threads:
            thread.start()
        assert wait_until(lambda: _in_line(admin, table, key) == len(waiters), 30)
        held.release()
        for thread in threads:
            thread.join(120)
        assert errors == [] and len(set(taken)) == len(waiters)
        assert not holder.backend.inspect(key).held
        assert _in_line(admin, table, key) == 0
    finally:
        holder.close()
        for locker in waiters:
            locker.close()


@pytest.mark.parametrize(
    ("joined", "pooled"), [(True, False), (False, False), (False, True)],
    ids=["in line", "first wait", "first wait, caller's pool"],
)
def test_a_silent_network_ends_a_wait_in_line_as_an_outage_in_bounded_time(
    postgres_server: PostgresServer, table: str, key: str, joined: bool, pooled: bool
) -> None:
    # The waiter reaches the server through a proxy that then holds every byte back: its
    # connections stay open and nothing is answered. Its place needs a refresh every half
    # second (a 2 s claim window), so the wait sends a statement into the silence; it must end
    # as an outage a little after the three seconds it was given, not block for ever, and so
    # must the leave that follows it. A waiter whose first wait meets the silence has its
    # listening connection still to open: the statement before it meets the silence, and the
    # leave then has nothing to take out (a caller's pool, which would open a connection of its
    # own without any connect_timeout, is not asked for one).
    proxy = TcpProxy(postgres_server.host, postgres_server.port)
    silent = postgres_server.url.replace(f":{postgres_server.port}/", f":{proxy.port}/", 1)
    holder = PostgresBackend.from_url(postgres_server.url, table=table, direct_handoff=True)
    pool = psycopg2.pool.ThreadedConnectionPool(1, 4, silent) if pooled else None
    backend = (
        PostgresBackend(pool, table=table, direct_handoff=True)
        if pool is not None
        else PostgresBackend.from_url(silent, table=table, direct_handoff=True)
    )
    try:
        assert holder.acquire(key, HOLDER, 30, "holder")
        assert backend.acquire(f"{key}:other", HOLDER, 30, "holder")  # checks the tables
        line = backend.join_line(key, "w" * 32, 2, "w", False, time.monotonic)
        assert line is not None
        if joined:
            assert line.ask() is None
        proxy.stall()
        check_a_silent_line_ends_its_wait_as_an_outage(line, psycopg2.Error)
    finally:
        proxy.close()
        backend.close()
        if pool is not None:
            pool.closeall()
        holder.force_release(key)
        holder.close()


def test_waiters_beyond_the_bound_wait_without_a_place_and_all_get_the_key(
    postgres_server: PostgresServer, admin: Any, table: str, key: str
) -> None:
    backend = PostgresBackend.from_url(postgres_server.url, table=table, direct_handoff=True)
    holder = Locker(backend, ttl=30)
    # The bound is the backend's: threads of Lockers of their own on it (the threads of one
    # Locker would queue in that Locker behind a single place).
    lockers = [Locker(backend, ttl=30) for _ in range(LINE_WAITERS + 2)]
    taken: list[str] = []

    def take_once(locker: Locker) -> None:
        with locker.lock(key, timeout=60) as lock:
            taken.append(lock.token)

    try:
        held = holder.acquire(key)
        threads = [threading.Thread(target=take_once, args=(locker,), daemon=True) for locker in lockers]
        for thread in threads:
            thread.start()
        # One listening connection per waiter in line, up to the bound; the others wait
        # without a place.
        assert wait_until(lambda: _in_line(admin, table, key) == LINE_WAITERS, 30)
        held.release()
        for thread in threads:
            thread.join(60)
        assert len(set(taken)) == len(threads)
        assert _in_line(admin, table, key) == 0
        assert not backend.inspect(key).held
    finally:
        for locker in [holder, *lockers]:
            locker.close()
        backend.close()


def test_lockers_in_line_hand_a_key_round_many_times(postgres_server: PostgresServer, table: str, key: str) -> None:
    lockers = [_locker(postgres_server.url, table, ttl=30) for _ in range(4)]
    try:
        hand_key_round(lockers, key, 25)
    finally:
        for locker in lockers:
            locker.close()


def test_closing_the_locker_ends_a_wait_in_line(
    postgres_server: PostgresServer, admin: Any, table: str, key: str
) -> None:
    holder = _locker(postgres_server.url, table, ttl=30)
    waiter = _locker(postgres_server.url, table, ttl=30, retry=Retry(delay=600, timeout=1200))
    try:
        check_closing_the_locker_ends_a_wait_in_line(holder, waiter, key, lambda: _in_line(admin, table, key))
    finally:
        holder.close()
        waiter.close()


def test_a_database_made_by_an_older_release_keeps_working_without_the_line(
    postgres_server: PostgresServer, admin: Any, table: str, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The DDL of a release without lines: everything but the queue table, and a role that may
    # use only those (create_table=False, as for a role without DDL rights).
    for statement in ddl(table)[:-1]:
        sql(admin, statement)
    role = f"r_{uuid.uuid4().hex[:8]}"
    sql(admin, f"CREATE ROLE {role} LOGIN PASSWORD 'secret-pw'")
    lockers: list[Locker] = []
    events = Recorder()
    try:
        sql(admin, f'GRANT SELECT, INSERT, UPDATE, DELETE ON "{table}", "{table}_count" TO {role}')
        sql(admin, f'GRANT USAGE ON SEQUENCE "{table}_fence" TO {role}')
        dsn = f"{postgres_server.dsn} user={role} password=secret-pw"
        with caplog.at_level("INFO", logger="lease_lock"):
            lockers = [
                Locker(
                    PostgresBackend(psycopg2.connect(dsn), table=table, create_table=False, direct_handoff=True),
                    ttl=30,
                    on_event=events,
                    owns_backend=True,
                )
                for _ in range(2)
            ]
            held = lockers[0].acquire(key)
        assert any("no direct hand-off" in record.getMessage() for record in caplog.records)
        assert not _direct(lockers[0].backend.join_line(key, "w" * 32, 30, "w", False, time.monotonic))
        # Waiters are handed the key through the listener, as before.
        got: list[Any] = []
        thread = _waiting_thread(lockers[1], key, got)
        assert events.wait_for("contended")  # the waiter found the key held, and waits
        held.release()
        thread.join(60)
        assert len(got) == 1 and got[0].state == "held"
        got[0].release()
        assert not lockers[0].backend.inspect(key).held
    finally:
        for locker in lockers:
            locker.close()
        with contextlib.suppress(psycopg2.Error):
            sql(admin, f"DROP OWNED BY {role}; DROP ROLE {role}")


def _direct(line: Optional[WaitingLine]) -> bool:
    """Whether ``line`` is a direct one (a release hands it the key in the store's step); an
    announced line offered instead is left at once."""
    if line is None:
        return False
    line.leave(False)
    return line.direct
