"""Direct hand-off on Redis: a release hands the key to the first live waiter in the key's line.

The waiter wakes up holding the key for a claim window, which its heartbeat turns into a full
lease; a waiter that dies, stops or leaves before then loses the key when the window ends, and
the next waiter gets it. Everything runs on a private real redis-server; the stopped and killed
waiters are real processes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from typing import Any

import pytest
import redis
from lease_lock import Locker, LockHeldError, Retry
from lease_lock.backends.redis import RedisBackend, line_keys
from lease_lock.backends.redis._line import CLAIM_MAX, LINE_WAITERS
from lease_lock.errors import ValidationError
from lease_lock.testing import wait_until
from redis.backoff import NoBackoff
from redis.retry import Retry as RedisRetry

from tests.support.events import Recorder
from tests.support.handoff import (
    check_a_waiter_that_times_out_leaves_the_line,
    check_closing_the_locker_ends_a_wait_in_line,
    hand_key_round,
)
from tests.support.processes import kill_process
from tests.support.redis_server import RedisServer


@pytest.fixture
def key() -> str:
    return f"test:line:{uuid.uuid4().hex}"


def _in_line(client: Any, key: str) -> int:
    """How many waiters have a place in ``key``'s line."""
    return int(client.llen(line_keys(key)[0]))


def _holder_token(client: Any, key: str) -> str:
    value = client.get(key)
    return "" if value is None else value.decode().split("|", 1)[0]


def _waiting_thread(locker: Locker, key: str, out: list[Any], **options: Any) -> threading.Thread:
    def wait() -> None:
        out.append(locker.acquire(key, timeout=60, **options))

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    return thread


def test_redis_backend_offers_a_line(redis_server: RedisServer) -> None:
    backend = RedisBackend.from_url(redis_server.url)
    try:
        line = backend.join_line("k", "w" * 32, 30, "w", False, time.monotonic)
        assert line is not None and line.direct
        line.leave(False)
    finally:
        backend.close()


def test_a_release_hands_the_key_to_the_waiter_without_another_attempt(redis_server: RedisServer, key: str) -> None:
    events = Recorder()
    holder = Locker(RedisBackend.from_url(redis_server.url), ttl=30, owns_backend=True)
    waiter = Locker(RedisBackend.from_url(redis_server.url), ttl=30, on_event=events, fencing=True, owns_backend=True)
    try:
        held = holder.acquire(key)
        got: list[Any] = []
        thread = _waiting_thread(waiter, key, got)
        assert wait_until(lambda: _in_line(holder.backend.client, key) == 1, 30)
        attempts_before = events.types().count("contended")
        held.release()
        thread.join(60)
        [lock] = got
        # Nothing was tried after the release: the release itself made the grant, for the claim
        # window only, with a fence of its own.
        assert events.types().count("contended") == attempts_before
        assert _holder_token(holder.backend.client, key) == lock.token
        assert 0 < lock.expires_in <= CLAIM_MAX
        assert 0 < holder.backend.client.pttl(key) <= CLAIM_MAX * 1000
        assert lock.fence is not None and lock.fence > 0
        assert _in_line(holder.backend.client, key) == 0
        lock.release()
        assert not holder.backend.inspect(key).held
    finally:
        holder.close()
        waiter.close()


def _blocked_waiters(client: Any) -> list[str]:
    """The ids of the connections blocked in a BLPOP (flag ``b``)."""
    entries = client.client_list()
    return [str(entry["id"]) for entry in entries if entry.get("cmd") == "blpop" and "b" in entry.get("flags", "")]


def test_a_waiter_whose_blocked_connection_is_killed_still_gets_the_key(redis_server: RedisServer, key: str) -> None:
    # An operator's CLIENT KILL (or a proxy's idle cut) drops the connection a waiter blocks
    # on: the connection's retry policy blocks again on a new one, and the release finds the
    # waiter's place as before.
    holder = Locker(RedisBackend.from_url(redis_server.url), ttl=30, owns_backend=True)
    waiter = Locker(RedisBackend.from_url(redis_server.url), ttl=30, owns_backend=True)
    client = holder.backend.client
    try:
        held = holder.acquire(key)
        got: list[Any] = []
        thread = _waiting_thread(waiter, key, got)
        assert wait_until(lambda: _in_line(client, key) == 1 and len(_blocked_waiters(client)) == 1, 30)
        [killed] = _blocked_waiters(client)
        client.client_kill_filter(_id=killed)
        assert wait_until(lambda: _blocked_waiters(client) not in ([], [killed]), 30)
        held.release()
        thread.join(60)
        [lock] = got
        assert _holder_token(client, key) == lock.token
        lock.release()
    finally:
        holder.close()
        waiter.close()


def test_a_waiter_gives_its_connection_back_when_it_leaves_and_close_returns_it_to_the_pool(
    redis_server: RedisServer, key: str
) -> None:
    # A waiter blocks on a connection the backend keeps between commands, and gives it back to
    # that free list when it leaves the line (timed out or handed the key): repeated waits take
    # no more connections out of the pool than the first, and close() returns every one.
    holder = Locker(RedisBackend.from_url(redis_server.url), ttl=30, owns_backend=True)
    waiter = Locker(RedisBackend.from_url(redis_server.url), ttl=30, owns_backend=True)
    pool = waiter.backend.client.connection_pool
    try:
        held = holder.acquire(key)
        out_of_the_pool = []
        for _ in range(3):
            with pytest.raises(LockHeldError):
                waiter.acquire(key, timeout=0.3, retry=Retry(delay=0.05))
            out_of_the_pool.append(len(pool._in_use_connections))
        got: list[Any] = []
        thread = _waiting_thread(waiter, key, got)
        assert wait_until(lambda: _in_line(holder.backend.client, key) == 1, 30)
        held.release()
        thread.join(60)
        [lock] = got
        lock.release()
        out_of_the_pool.append(len(pool._in_use_connections))
        # At most the kept connection and the one an attempt in line took while the first was
        # lent to the BLPOP; a connection not given back would add one per wait.
        assert max(out_of_the_pool) <= 2, out_of_the_pool
    finally:
        holder.close()
        waiter.close()
    assert len(pool._in_use_connections) == 0


@pytest.mark.parametrize("retries", [0, 1], ids=["no-retries", "one-retry"])
def test_a_waiter_whose_connection_is_cut_while_it_waits_in_line_still_gets_the_key(
    private_redis_server: RedisServer, key: str, retries: int
) -> None:
    # The waiter's BLPOP blocks on a connection the backend lent it from the ones it keeps
    # between commands; the server closes it (CLIENT KILL, as a restarted proxy would). The
    # client's retry policy reconnects it; without one, the broken BLPOP is one failed attempt
    # of the wait, which goes on in line and is handed the key all the same.
    client = redis.Redis(
        host="127.0.0.1", port=private_redis_server.port, client_name="line-cut",
        retry=RedisRetry(NoBackoff(), retries), socket_timeout=10,
    )
    holder = Locker(RedisBackend.from_url(private_redis_server.url), ttl=30, owns_backend=True)
    waiter = Locker(RedisBackend(client), ttl=30)
    admin = redis.Redis(host="127.0.0.1", port=private_redis_server.port)
    try:
        held = holder.acquire(key)
        got: list[Any] = []
        thread = _waiting_thread(waiter, key, got, retry=Retry(delay=0.05))
        assert wait_until(lambda: _in_line(admin, key) == 1, 30)

        def lent() -> list[str]:
            # The connection lent to the wait for its BLPOPs, kept out of the pool until the wait
            # ends (between two BLPOPs too): the pool's idle ones stay alive.
            return [found["id"] for found in admin.client_list()
                    if found.get("name") == "line-cut" and found.get("cmd") == "blpop"]

        seen: list[str] = []

        def one_lent() -> bool:
            seen[:] = lent()
            return len(seen) == 1

        assert wait_until(one_lent, 30)
        [cut] = seen
        assert admin.client_kill_filter(_id=cut) == 1
        # The wait has dropped the cut connection and blocks over a new one. Released before
        # that, the key could reach the waiter by its own look, and the cut connection, cut
        # between two BLPOPs, would go back to the pool to fail whatever call drew it next.
        assert wait_until(lambda: any(other != cut for other in lent()), 30)
        held.release()
        thread.join(60)
        [lock] = got
        assert _holder_token(admin, key) == lock.token
        lock.release()
    finally:
        admin.close()
        holder.close()
        waiter.close()
        client.close()


@pytest.mark.parametrize("auto_extend", [True, False], ids=["auto-extend", "no-auto-extend"])
def test_the_heartbeat_turns_a_handed_claim_into_a_full_lease(
    redis_server: RedisServer, key: str, auto_extend: bool
) -> None:
    # ttl 9 s: the claim window is CLAIM_MAX (6 s), so the full lease is longer than the claim.
    events = Recorder()
    holder = Locker(RedisBackend.from_url(redis_server.url), ttl=9, owns_backend=True)
    waiter = Locker(RedisBackend.from_url(redis_server.url), ttl=9, on_event=events, owns_backend=True)
    try:
        held = holder.acquire(key)
        got: list[Any] = []
        thread = _waiting_thread(waiter, key, got, auto_extend=auto_extend)
        assert wait_until(lambda: _in_line(holder.backend.client, key) == 1, 30)
        held.release()
        thread.join(60)
        [lock] = got
        assert lock.expires_in <= CLAIM_MAX
        # Extended once, a third of the way into the claim window, whatever auto_extend says.
        assert events.wait_for("extended")
        assert lock.expires_in > CLAIM_MAX
        assert holder.backend.client.pttl(key) > CLAIM_MAX * 1000
        assert lock.is_held()
        lock.release()
    finally:
        holder.close()
        waiter.close()


_WAITER = textwrap.dedent(
    """
    import sys
    from lease_lock import Locker
    from lease_lock.backends.redis import RedisBackend
    from lease_lock.errors import LockHeldError

    url, key, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
    locker = Locker(RedisBackend.from_url(url), ttl=2)
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


def _waiter_process(url: str, key: str, timeout: float) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    process = subprocess.Popen(
        [sys.executable, "-c", _WAITER, url, key, str(timeout)], stdout=subprocess.PIPE, text=True, env=env
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "waiting"
    return process


@pytest.mark.parametrize("fate", ["killed", "stopped"])
def test_a_waiter_that_cannot_take_a_handed_key_loses_it_at_the_end_of_its_claim(
    redis_server: RedisServer, key: str, fate: str
) -> None:
    holder = Locker(RedisBackend.from_url(redis_server.url), ttl=2, owns_backend=True)
    client = holder.backend.client
    held = holder.acquire(key)
    process = _waiter_process(redis_server.url, key, 5.0)
    try:
        assert wait_until(lambda: _in_line(client, key) == 1, 30)
        process.send_signal(signal.SIGKILL if fate == "killed" else signal.SIGSTOP)
        if fate == "killed":
            process.wait(30)
        held.release()
        # The release handed the key to the waiter, which cannot take it: for the claim window
        # (ttl 2 s here) at most.
        handed = _holder_token(client, key)
        assert handed not in ("", held.token)
        assert 0 < client.pttl(key) <= 2000
        # Then it is free again, and another waiter gets it.
        taken = holder.acquire(key, timeout=30)
        assert taken.token != handed
        if fate == "stopped":
            process.send_signal(signal.SIGCONT)
            # The waiter wakes long after its claim ended: it must not take that grant, and
            # its own wait runs out while the key is held here.
            out, _ = process.communicate(timeout=60)
            assert out.split() == ["held"]
            assert taken.is_held() and _holder_token(client, key) == taken.token
        taken.release()
        assert not holder.backend.inspect(key).held
    finally:
        if fate == "stopped":
            process.send_signal(signal.SIGCONT)
        kill_process(process)
        if process.stdout is not None:
            process.stdout.close()
        holder.close()


def test_a_waiter_that_times_out_in_line_leaves_it(redis_server: RedisServer, key: str) -> None:
    holder = Locker(RedisBackend.from_url(redis_server.url), ttl=30, owns_backend=True)
    waiter = Locker(RedisBackend.from_url(redis_server.url), ttl=30, owns_backend=True)
    client = holder.backend.client
    try:
        check_a_waiter_that_times_out_leaves_the_line(holder, waiter, key, lambda: _in_line(client, key))
    finally:
        holder.close()
        waiter.close()


def test_waiters_beyond_the_bound_wait_without_a_place_and_all_get_the_key(redis_server: RedisServer, key: str) -> None:
    backend = RedisBackend.from_url(redis_server.url)
    holder = Locker(backend, ttl=30)
    # The bound is the backend's: threads of Lockers of their own on it (the threads of one
    # Locker would queue in that Locker behind a single place).
    lockers = [Locker(backend, ttl=30) for _ in range(LINE_WAITERS + 2)]
    client = backend.client
    taken: list[str] = []

    def take_once(locker: Locker) -> None:
        with locker.lock(key, timeout=60) as lock:
            taken.append(lock.token)

    try:
        held = holder.acquire(key)
        threads = [threading.Thread(target=take_once, args=(locker,), daemon=True) for locker in lockers]
        for thread in threads:
            thread.start()
        # One connection per waiter in line, up to the bound; the others wait without a place.
        assert wait_until(lambda: _in_line(client, key) == LINE_WAITERS, 30)
        held.release()
        for thread in threads:
            thread.join(60)
        assert len(set(taken)) == len(threads)
        assert _in_line(client, key) == 0
        assert not backend.inspect(key).held
    finally:
        for locker in [holder, *lockers]:
            locker.close()
        backend.close()


def test_lockers_in_line_hand_a_key_round_many_times(redis_server: RedisServer, key: str) -> None:
    lockers = [Locker(RedisBackend.from_url(redis_server.url), ttl=30, owns_backend=True) for _ in range(4)]
    try:
        hand_key_round(lockers, key, 25)
    finally:
        for locker in lockers:
            locker.close()


@pytest.mark.parametrize("name", ["{orders}:line", "{orders}:42:entries", "lease_lock:granted:" + "a" * 32])
def test_the_lines_own_names_are_refused_as_keys(redis_server: RedisServer, name: str) -> None:
    backend = RedisBackend.from_url(redis_server.url)
    try:
        with pytest.raises(ValidationError, match=r"line|grant list"):
            backend.check_key(name)
    finally:
        backend.close()


def test_releases_during_a_holders_burst_leave_the_key_free_and_the_head_of_the_line_asks_when_it_ends(
    redis_server: RedisServer, key: str
) -> None:
    backend = RedisBackend.from_url(redis_server.url)
    client = backend.client
    holder, waiter = "h" * 32, "w" * 32
    line = backend.join_line(key, waiter, 30, "waiter", False, time.monotonic)
    assert line is not None
    try:
        assert backend.acquire(key, holder, 30, "holder")
        assert line.ask() is None
        # A hand-over gave the holder a burst that runs another minute (the entries' "!"
        # field, in server ms).
        entries = line_keys(key)[1]
        seconds, micros = client.time()
        client.hset(entries, "!", seconds * 1000 + micros // 1000 + 60_000)
        granted = "lease_lock:granted:" + waiter
        for _ in range(3):
            # The holder releases and takes the key straight back: it keeps it, and nothing
            # is handed over. The head of the line hears of the first release only (once per
            # burst): the key is free, and when the burst ends.
            assert backend.release(key, holder)
            assert not client.exists(key)
            [word] = client.lrange(granted, 0, -1)
            assert word.startswith(b"!") and 0 < int(word[1:]) <= 60_000
            assert backend.acquire(key, holder, 30, "holder")
        client.delete(granted)
        # The head of the line is told when the burst ends: its next ask is due then, no
        # sooner than its usual refresh would be.
        assert line.ask() is None
        assert _in_line(client, key) == 1
        assert backend.release(key, holder)
        assert line.ask() == 0  # the key was left free for it
        line.leave(True)
        assert _in_line(client, key) == 0 and not client.exists(granted)
    finally:
        line.leave(False)
        backend.force_release(key)
        backend.close()


def _burst_runs_for(client: Any, key: str, milliseconds: int) -> None:
    """Make the burst of the holder handed ``key`` run ``milliseconds`` from now (server ms)."""
    seconds, micros = client.time()
    client.hset(line_keys(key)[1], "!", seconds * 1000 + micros // 1000 + milliseconds)


def test_one_shot_holders_hand_a_key_along_the_line_even_when_they_release_inside_their_burst(
    redis_server: RedisServer, key: str
) -> None:
    # Six waiters in line, each releasing the key as soon as it holds it. A holder that was
    # handed the key releases inside its burst, which hands nothing over: the next waiter must
    # still hear of it (and ask when the burst ends) rather than wait for its next refresh. Each
    # wait here is shorter than the refresh interval (a quarter of the claim window), so only a
    # hand-over or word of the release can end it with the key.
    backend = RedisBackend.from_url(redis_server.url)
    client = backend.client
    holder = "h" * 32
    tokens = [str(index) * 32 for index in range(1, 7)]
    lines = [backend.join_line(key, token, 30, token[0], True, time.monotonic) for token in tokens]
    try:
        assert backend.acquire_fenced(key, holder, 30, "holder") is not None
        for line in lines:
            assert line is not None and line.ask() is None
        assert _in_line(client, key) == len(tokens)
        assert backend.release(key, holder)
        fences, handed = [], []
        for index, (token, line) in enumerate(zip(tokens, lines)):
            assert line is not None
            grant = line.wait(CLAIM_MAX / 6)
            assert grant is not None, f"waiter {index} was not told the key was free"
            assert _holder_token(client, key) == token
            fences.append(grant.fence)
            handed.append(grant.claimed)
            line.leave(True)
            if grant.claimed:
                # The burst the hand-over gave runs past the release below, however slow the
                # machine: the release surely comes inside it.
                _burst_runs_for(client, key, 100)
            assert backend.release(key, token)
        assert fences == sorted(fences) and len(set(fences)) == len(fences)
        assert True in handed and False in handed  # some were handed the key, some asked after a burst
        assert _in_line(client, key) == 0
    finally:
        for line in lines:
            if line is not None:
                line.leave(False)
        backend.force_release(key)
        backend.close()


def test_leaving_with_a_handed_key_hands_it_to_the_next_waiter_even_inside_its_burst(
    redis_server: RedisServer, key: str
) -> None:
    backend = RedisBackend.from_url(redis_server.url)
    client = backend.client
    holder, first, second = "h" * 32, "a" * 32, "b" * 32
    lines = [backend.join_line(key, token, 30, token[0], True, time.monotonic) for token in (first, second)]
    try:
        assert backend.acquire_fenced(key, holder, 30, "holder") is not None
        assert lines[0] is not None and lines[1] is not None
        assert lines[0].ask() is None and lines[1].ask() is None  # both in line, oldest first
        assert backend.release(key, holder)
        handed = lines[0].wait(30)
        assert handed is not None and handed.claimed and _holder_token(client, key) == first
        # The hand-over gave the first waiter a burst; it runs another minute here, so that the
        # leave below surely comes inside it.
        seconds, micros = client.time()
        client.hset(line_keys(key)[1], "!", seconds * 1000 + micros // 1000 + 60_000)
        # The first waiter leaves without using the grant: the key goes on to the second at
        # once, its burst notwithstanding (a burst is for a holder that takes the key back).
        lines[0].leave(False)
        assert _holder_token(client, key) == second
        grant = lines[1].wait(30)
        assert grant is not None and grant.fence > handed.fence
        lines[1].leave(True)
        assert _in_line(client, key) == 0
    finally:
        for line in lines:
            if line is not None:
                line.leave(False)
        backend.force_release(key)
        backend.close()


def test_a_burst_ends_and_the_next_release_hands_the_key_over(redis_server: RedisServer, key: str) -> None:
    # Two lockers cycle on one key for a while: every one of them gets grants, and most
    # grants stay with the holder of a burst (see the performance page for the figures).
    lockers = [Locker(RedisBackend.from_url(redis_server.url), ttl=30, owns_backend=True) for _ in range(3)]
    grants = [0, 0, 0]
    stop = threading.Event()

    def cycle(index: int) -> None:
        while not stop.is_set():
            with lockers[index].lock(key, timeout=30):
                grants[index] += 1

    try:
        threads = [threading.Thread(target=cycle, args=(index,), daemon=True) for index in range(3)]
        for thread in threads:
            thread.start()
        assert wait_until(lambda: min(grants) >= 20, 60)
        stop.set()
        for thread in threads:
            thread.join(60)
        assert not any(thread.is_alive() for thread in threads)
    finally:
        for locker in lockers:
            locker.close()


def test_a_user_that_may_not_run_info_waits_without_a_line_and_still_gets_the_key(
    redis_server: RedisServer, key: str
) -> None:
    admin = RedisBackend.from_url(redis_server.url)
    user = f"noinfo{uuid.uuid4().hex[:8]}"
    admin.client.acl_setuser(user, enabled=True, passwords=["+secret"], keys=["*"], channels=["*"],
                             commands=["+@all", "-info"])
    waiter = Locker(
        RedisBackend.from_url(f"redis://{user}:secret@127.0.0.1:{redis_server.port}/0"), ttl=30, owns_backend=True
    )
    holder = Locker(RedisBackend.from_url(redis_server.url), ttl=30, owns_backend=True)

    def refused_infos() -> int:
        stats = admin.client.info("commandstats").get("cmdstat_info", {})
        return int(stats.get("rejected_calls", 0))

    refused_before = refused_infos()
    try:
        for _ in range(2):
            held = holder.acquire(key)
            got: list[Any] = []
            thread = _waiting_thread(waiter, key, got)
            threading.Event().wait(0.3)  # not a timing assertion: the waiter has queued, or not
            assert _in_line(admin.client, key) == 0
            held.release()
            thread.join(60)
            assert len(got) == 1 and got[0].state == "held"
            got[0].release()
        # Asked once: a refusal is not asked again at every wait.
        assert refused_infos() - refused_before == 1
    finally:
        holder.close()
        waiter.close()
        admin.client.acl_deluser(user)
        admin.close()


def test_closing_the_locker_ends_a_wait_in_line(redis_server: RedisServer, key: str) -> None:
    holder = Locker(RedisBackend.from_url(redis_server.url), ttl=30, owns_backend=True)
    waiter = Locker(RedisBackend.from_url(redis_server.url), ttl=30, retry=Retry(delay=600, timeout=1200))
    client = holder.backend.client
    try:
        check_closing_the_locker_ends_a_wait_in_line(holder, waiter, key, lambda: _in_line(client, key))
    finally:
        holder.close()
        waiter.close()
        waiter.backend.close()
