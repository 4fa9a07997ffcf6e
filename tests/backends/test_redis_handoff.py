"""Wake-one hand-off on Redis: a release wakes one waiting watcher, never the whole herd.

Each watcher stands for one process (its own connection and thread); all run on a private real
redis-server, whose blocked clients the tests read with ``CLIENT LIST``.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable, Optional

import pytest
from lease_lock import Locker
from lease_lock.backends.handoff import HandoffSource
from lease_lock.backends.line import Announcements
from lease_lock.backends.redis import RedisBackend, handoff_keys
from lease_lock.backends.redis._watch import OUTSTANDING_MS, TURN_RETRIES, TURN_RETRY_MS
from lease_lock.errors import LockHeldError, ValidationError
from lease_lock.server.waits import WaitRoom
from lease_lock.testing import wait_until

from tests.support.handoff import WakeCounter, hand_key_round, hand_over
from tests.support.redis_server import RedisServer

TOKEN_A = "a" * 32
TOKEN_B = "b" * 32


@pytest.fixture
def backend(redis_server: RedisServer) -> Iterator[RedisBackend]:
    backend = RedisBackend.from_url(redis_server.url)
    yield backend
    backend.close()


@pytest.fixture
def key() -> str:
    return f"test:handoff:{uuid.uuid4().hex}"


def _blocked(client: Any) -> int:
    """How many connections are blocked in a BLPOP."""
    return sum(1 for entry in client.client_list() if entry.get("cmd") == "blpop" and "b" in entry.get("flags", ""))


def _queued(backend: RedisBackend, key: str, callbacks: list[Callable[[str], bool]]) -> list[Any]:
    """Start one watcher per callback, queue each for ``key`` and wait until all are blocked."""
    watchers = [backend.watch_handoffs(callback) for callback in callbacks]
    for watcher in watchers:
        watcher.want(key)
    _, wake = handoff_keys(key)
    assert wait_until(lambda: all(wake in watcher._blocking for watcher in watchers), 30)
    assert wait_until(lambda: _blocked(backend.client) >= len(watchers), 30)
    return watchers


def test_redis_backend_offers_wake_one_hand_off(backend: RedisBackend) -> None:
    assert isinstance(backend, HandoffSource) and backend.handoff_ready


def test_each_release_wakes_exactly_one_watcher(backend: RedisBackend, key: str) -> None:
    counters = [WakeCounter(), WakeCounter(), WakeCounter()]
    watchers = _queued(backend, key, list(counters))
    _, wake = handoff_keys(key)
    try:
        for release in range(1, 4):
            assert backend.acquire(key, TOKEN_A, 30, "holder")
            assert backend.release(key, TOKEN_A)
            assert wait_until(lambda done=release: sum(len(counter.calls) for counter in counters) >= done, 30)
            # The one wake was taken by one watcher: nothing is left for another.
            assert wait_until(lambda: backend.client.llen(wake) == 0, 30)
        # Redis serves its blocked clients oldest first: three releases reached three watchers.
        assert sorted(len(counter.calls) for counter in counters) == [1, 1, 1]
        assert all(counter.calls in ([], [key]) for counter in counters)
    finally:
        for watcher in watchers:
            watcher.close()


def test_a_wake_nobody_here_wants_goes_to_another_watcher(backend: RedisBackend, key: str) -> None:
    refusing, taking = WakeCounter(answer=False), WakeCounter()
    watchers = _queued(backend, key, [refusing, taking])
    try:
        assert backend.acquire(key, TOKEN_A, 30, "holder")
        assert backend.release(key, TOKEN_A)
        assert wait_until(lambda: taking.calls == [key], 30)
    finally:
        for watcher in watchers:
            watcher.close()


def test_no_marker_no_wake_and_releases_stay_cheap(backend: RedisBackend, key: str) -> None:
    marker, wake = handoff_keys(key)
    assert backend.acquire(key, TOKEN_A, 30, "holder")
    assert backend.release(key, TOKEN_A)
    assert backend.client.exists(marker, wake) == 0
    # Neither name is a string, so listing keys never shows them.
    watcher = backend.watch_handoffs(WakeCounter())
    try:
        watcher.want(key)
        assert backend.acquire(key, TOKEN_A, 30, "holder")
        assert backend.force_release(key)
        assert wait_until(lambda: backend.client.exists(marker) == 1, 30)
        assert [state.key for state in backend.scan(key)] == []
    finally:
        watcher.close()


def test_want_reads_the_lease_left(backend: RedisBackend, key: str) -> None:
    watcher = backend.watch_handoffs(WakeCounter())
    try:
        assert watcher.want(key) == 0.0  # free: a release before queueing is not missed
        watcher.unwant(key)
        other = f"{key}:held"
        assert backend.acquire(other, TOKEN_A, 30, "holder")
        left = watcher.want(other)
        assert left is not None and 0 < left <= 30
    finally:
        watcher.close()


def test_dispatcher_wakes_at_once_for_a_key_freed_before_queueing(backend: RedisBackend, key: str) -> None:
    dispatcher = Announcements(backend)
    try:
        event = dispatcher.register(key)
        assert event.is_set()
        assert dispatcher.lease_left(key) == 0.0
        dispatcher.unregister(key, event)
        held = f"{key}:held"
        assert backend.acquire(held, TOKEN_A, 30, "holder")
        waiting = dispatcher.register(held)
        assert not waiting.is_set()
        left = dispatcher.lease_left(held)
        assert left is not None and 0 < left <= 30
        # Read once: a later wait follows a lost race and knows no holder's lease.
        assert dispatcher.lease_left(held) is None
        dispatcher.unregister(held, waiting)
    finally:
        dispatcher.close()


@contextmanager
def _after_a_lost_woken_attempt(
    backend: RedisBackend, key: str
) -> Iterator[tuple[RedisBackend, Announcements, threading.Event]]:
    """A waiter of ``backend``'s process was woken for ``key`` and lost to a holder that took it
    back: yields the holder, the waiter's dispatcher and its registered event."""
    _wake_taken(backend, key)
    holder = RedisBackend(backend.client)
    assert holder.acquire(key, TOKEN_A, 30, "holder")
    dispatcher = Announcements(backend)
    try:
        waiting = dispatcher.register(key)
        backend._turns.woken(key)
        assert not backend.acquire(key, TOKEN_B, 30, "woken waiter")
        yield holder, dispatcher, waiting
    finally:
        dispatcher.close()


def test_a_waiter_whose_woken_attempt_lost_looks_again_when_its_turn_is_due(
    backend: RedisBackend, key: str
) -> None:
    # What the core's attempt loop asks before it sleeps after a lost attempt: with a kept turn,
    # the few milliseconds of the turn, not the holder's lease (nor a second).
    with _after_a_lost_woken_attempt(backend, key) as (_, dispatcher, waiting):
        left = dispatcher.lease_left(key)
        assert left is not None and 0.0 <= left <= TURN_RETRY_MS / 1000
        dispatcher.unregister(key, waiting)


def test_a_turn_kept_for_a_waiter_that_leaves_is_passed_on(backend: RedisBackend, key: str) -> None:
    # The loser of a woken attempt times out during its kept turn: a release in that turn woke
    # nobody, so leaving pushes a wake for another process.
    with _after_a_lost_woken_attempt(backend, key) as (holder, dispatcher, waiting):
        assert holder.release(key, TOKEN_A)
        # Within the kept turn this release woke nobody; on a machine slow enough to get past
        # the turn first it did, and that wake is taken here, so only the leaving waiter's
        # wake can be found below.
        _take_wake(backend, key)
        dispatcher.unregister(key, waiting)
        # (This process's own watcher may still be blocked on the key's list for a moment; a
        # wake it catches goes back to the list, since nobody here waits any more.)
        assert wait_until(lambda: _take_wake(backend, key), 30)


def test_an_unused_wake_is_passed_on_when_its_waiter_leaves(backend: RedisBackend, key: str) -> None:
    first, second = Announcements(backend), Announcements(backend)
    try:
        assert backend.acquire(key, TOKEN_A, 30, "holder")
        events = {first: first.register(key), second: second.register(key)}
        assert wait_until(lambda: _blocked(backend.client) >= 2, 30)
        assert backend.release(key, TOKEN_A)
        assert wait_until(lambda: any(event.is_set() for event in events.values()), 30)
        woken = next(dispatcher for dispatcher, event in events.items() if event.is_set())
        other = second if woken is first else first
        # The woken waiter gives up without trying (a timeout, a cancel): the other gets the wake.
        woken.unregister(key, events[woken])
        assert wait_until(events[other].is_set, 30)
        other.unregister(key, events[other])
    finally:
        first.close()
        second.close()


def test_lockers_hand_a_key_round_without_losing_a_release(redis_server: RedisServer, key: str) -> None:
    lockers = [Locker(RedisBackend.from_url(redis_server.url), ttl=30, owns_backend=True) for _ in range(4)]
    hand_key_round(lockers, key, rounds=25)


def test_a_release_through_a_client_passed_in_wakes_a_watcher(redis_server: RedisServer, key: str) -> None:
    # A client passed in takes its own path through release (it does not count redis-py's
    # retries); its releases must wake a waiting process all the same.
    import redis

    client = redis.Redis.from_url(redis_server.url)
    backend = RedisBackend(client)
    counter = WakeCounter()
    watchers = _queued(backend, key, [counter])
    try:
        assert backend.acquire(key, TOKEN_A, 30, "holder")
        assert backend.release(key, TOKEN_A)
        assert wait_until(lambda: counter.calls == [key], 30)
    finally:
        for watcher in watchers:
            watcher.close()
        backend.close()
        client.connection_pool.disconnect()  # the caller's client: closing it is the caller's part


def _take_wake(backend: RedisBackend, key: str) -> bool:
    """Pop the key's wake as a watcher would; ``True`` if there was one."""
    _, wake = handoff_keys(key)
    return backend.client.lpop(wake) is not None


def _wake_taken(backend: RedisBackend, key: str) -> None:
    """A process waits for ``key`` (its marker is up); a release wakes it and it takes the wake."""
    marker, _ = handoff_keys(key)
    backend.client.hset(marker, "w", "1")
    backend.client.pexpire(marker, 30_000)
    assert backend.acquire(key, TOKEN_A, 30, "holder")
    assert backend.release(key, TOKEN_A)
    assert _take_wake(backend, key)


def test_releases_while_a_wake_is_outstanding_push_no_other(backend: RedisBackend, key: str) -> None:
    # The holder takes the key again at once, before the woken waiter tried: no wake for that.
    # A wake is outstanding for OUTSTANDING_MS at most, so only a round that fits in that window
    # on the server's clock says anything; a busy machine gets more rounds to fit one in.
    marker, _ = handoff_keys(key)
    for _ in range(50):
        backend.client.hdel(marker, "o")  # a fresh round: the release below pushes a wake
        _wake_taken(backend, key)
        due = _outstanding_until(backend, key)
        pushed = []
        for _ in range(3):
            assert backend.acquire(key, TOKEN_A, 30, "holder")
            assert backend.release(key, TOKEN_A)
            pushed.append(_take_wake(backend, key))
        if due is not None and _server_ms(backend) < due:
            break
    else:
        pytest.fail(f"no round of three cycles fit in {OUTSTANDING_MS} ms")
    assert not any(pushed)
    # The woken process tries and wins: the wake is answered, so the next release wakes a
    # waiter again.
    woken = RedisBackend(backend.client)
    woken._turns.woken(key)
    assert woken.acquire(key, TOKEN_B, 30, "woken waiter")
    assert woken.release(key, TOKEN_B)
    assert _take_wake(backend, key)


def _server_ms(backend: RedisBackend) -> int:
    seconds, micros = backend.client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _outstanding_until(backend: RedisBackend, key: str) -> Optional[int]:
    """The server time (ms) until which the key's wake is outstanding, or None."""
    marker, _ = handoff_keys(key)
    due = backend.client.hget(marker, "o")
    return None if due is None else int(due)


def test_a_woken_attempt_that_loses_keeps_its_turn_a_moment(backend: RedisBackend, key: str) -> None:
    # The holder took the key straight back before the woken waiter tried: the waiter loses,
    # and the store keeps its turn (the wake stays outstanding) for TURN_RETRY_MS, doubling on
    # each further loss, while the waiter is told to try again on its own when the turn is due.
    _wake_taken(backend, key)
    assert backend.acquire(key, TOKEN_A, 30, "holder")
    woken = RedisBackend(backend.client)
    woken._turns.woken(key)
    for losses in range(TURN_RETRIES):
        before = _server_ms(backend)
        assert not woken.acquire(key, TOKEN_B, 30, "woken waiter")
        after = _server_ms(backend)
        kept = TURN_RETRY_MS << losses
        due = _outstanding_until(backend, key)
        assert due is not None and before + kept <= due <= after + kept
        # The waiter's next look at the key is due when the turn's pause ends, and is told once.
        wait = woken._turns.kept_turn(key)
        assert wait is not None and 0.0 <= wait <= kept / 1000
        assert woken._turns.kept_turn(key) is None
    # The last kept turn lost too: the turn is given up, the wake answered, and the next
    # release wakes a waiter again.
    assert not woken.acquire(key, TOKEN_B, 30, "woken waiter")
    assert _outstanding_until(backend, key) is None
    assert woken._turns.kept_turn(key) is None
    assert backend.release(key, TOKEN_A)
    assert _take_wake(backend, key)


def test_a_kept_turn_that_wins_answers_the_wake(backend: RedisBackend, key: str) -> None:
    _wake_taken(backend, key)
    assert backend.acquire(key, TOKEN_A, 30, "holder")
    woken = RedisBackend(backend.client)
    woken._turns.woken(key)
    assert not woken.acquire(key, TOKEN_B, 30, "woken waiter")
    assert _outstanding_until(backend, key) is not None
    # The holder lets go for good; the waiter's own retry (no wake needed) takes the key.
    assert backend.release(key, TOKEN_A)
    assert woken._turns.kept_turn(key) is not None
    assert woken.acquire(key, TOKEN_B, 30, "woken waiter")
    assert _outstanding_until(backend, key) is None
    # Nothing of the turn is left: the next attempt is a plain one.
    assert woken._turns.answering(key) is None


def test_a_woken_grant_if_free_answers_the_wake_too(backend: RedisBackend, key: str) -> None:
    # The lock service's waiting requests take the key with grant_if_free: it must end the
    # outstanding wake as an acquire does, or the next release would wake nobody.
    _wake_taken(backend, key)
    woken = RedisBackend(backend.client)
    woken._turns.woken(key)
    assert isinstance(woken.grant_if_free(key, "b" * 32, 30, "woken"), int)
    assert woken.release(key, "b" * 32)
    assert _take_wake(backend, key)


def test_an_unanswered_wake_stops_holding_back_others(backend: RedisBackend, key: str) -> None:
    # A woken process that died before trying must not keep every later waiter asleep.
    _wake_taken(backend, key)

    def release_wakes() -> bool:
        assert backend.acquire(key, TOKEN_A, 30, "holder")
        assert backend.release(key, TOKEN_A)
        return _take_wake(backend, key)

    assert wait_until(release_wakes, 30, interval=0.05)


def test_a_woken_locker_hands_the_key_on_while_a_holder_cycles(redis_server: RedisServer, key: str) -> None:
    # A holder that releases and re-takes in a loop, and a waiter in another locker: the waiter
    # is woken, tries, and gets the key within the holder's loop (no wake is lost to the
    # suppression of wakes while one is outstanding).
    holder = Locker(RedisBackend.from_url(redis_server.url), ttl=30, owns_backend=True)
    waiter = Locker(RedisBackend.from_url(redis_server.url), ttl=30, owns_backend=True)
    stop = threading.Event()

    def cycle() -> None:
        while not stop.is_set():
            holder.acquire(key, timeout=60).release()

    first_client = RedisBackend.from_url(redis_server.url).client
    try:
        first = holder.acquire(key)
        loop = threading.Thread(target=cycle)
        got: list[bool] = []
        waiting = threading.Thread(target=lambda: got.append(waiter.acquire(key, timeout=60).release()))
        waiting.start()
        assert wait_until(lambda: _blocked(first_client) >= 1, 30)
        first.release()
        loop.start()
        waiting.join(timeout=60)
        assert got == [True]
    finally:
        stop.set()
        if "loop" in locals():
            loop.join(timeout=60)
        holder.close()
        waiter.close()
        first_client.close()


@pytest.mark.parametrize("takes", [False, True], ids=["read", "acquisition"])
def test_a_waiting_read_hands_the_wake_it_took_on(redis_server: RedisServer, key: str, takes: bool) -> None:
    # The lock service's waiting requests: a release wakes one waiting process. A read woken
    # that way takes nothing, so the wake goes on (to a process that will take the key); an
    # acquisition that took the key keeps it.
    room_backend = RedisBackend.from_url(redis_server.url)
    holder = RedisBackend.from_url(redis_server.url)
    room = WaitRoom(room_backend, max_waits=1, max_wait=60.0)
    answers: list[Optional[bool]] = []

    def held_for() -> Optional[float]:
        if takes:
            return None if room_backend.acquire(key, "b" * 32, 30, "waiter") else 30.0
        return 30.0 if room_backend.inspect(key).held else None

    try:
        assert holder.acquire(key, TOKEN_A, 30, "holder")
        waiting = threading.Thread(target=lambda: answers.append(room.wait_until_free(key, held_for, 60, takes=takes)))
        waiting.start()
        assert wait_until(lambda: _blocked(holder.client) >= 1 and room.waiting == 1, 30)
        assert holder.release(key, TOKEN_A)
        waiting.join(30)
        assert answers == [True]
        wakes = handoff_keys(key)[1]
        if takes:
            assert holder.client.llen(wakes) == 0
        else:
            # Handed on, whichever way the read learnt the key was free (the wake, or its own look
            # just before the wake arrived): the wake waits in the list for the next process,
            # never swallowed.
            assert wait_until(lambda: holder.client.llen(wakes) == 1, 30)
    finally:
        room.close()
        room_backend.close()
        holder.close()


# -- names the store uses for itself ------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "what"),
    [
        ("{orders}:wake", "wake list"),
        ("{orders}:42:wake", "wake list"),
        ("{orders}:waiting", "waiting marker"),
        ("{orders}:42:waiting", "waiting marker"),
        ("{orders}:fence", "fence counter"),
        ("lease_lock:window:billing", "rate counter"),
        ("lease_lock:handoff:0123abcd", "hand-off control list"),
    ],
)
def test_keys_named_like_the_stores_own_structures_are_refused(
    redis_server: RedisServer, name: str, what: str
) -> None:
    locker = Locker(RedisBackend.from_url(redis_server.url), ttl=30, owns_backend=True)
    try:
        with pytest.raises(ValidationError, match=what):
            locker.acquire(name)
        assert not locker.backend.inspect(name).held  # refused before anything was written
    finally:
        locker.close()


@pytest.mark.parametrize("name", ["orders:wake", "{orders}:wake:x", "wake", "lease_lock:other", "{}:wake:1"])
def test_names_only_like_a_structure_are_usable_keys(backend: RedisBackend, name: str) -> None:
    backend.check_key(name)


@pytest.mark.parametrize("squatted", [0, 1], ids=["waiting-marker", "wake-list"])
@pytest.mark.parametrize("tagged", [False, True], ids=["plain", "hash-tag"])
def test_a_lease_under_a_hand_off_name_survives_waits_and_releases_of_its_key(
    redis_server: RedisServer, tagged: bool, squatted: int
) -> None:
    # The bare backend API skips check_key, so a lease can still sit under one of the hand-off
    # names of a key: waits on the key and its releases must neither fail nor touch it.
    key = f"{{test}}:{uuid.uuid4().hex}" if tagged else f"test:{uuid.uuid4().hex}"
    name = handoff_keys(key)[squatted]
    squatter = RedisBackend.from_url(redis_server.url)
    holder = Locker(RedisBackend.from_url(redis_server.url), ttl=30, owns_backend=True)
    waiter = Locker(RedisBackend.from_url(redis_server.url), ttl=30, owns_backend=True)
    try:
        assert squatter.acquire(name, TOKEN_A, 60, "squatter")
        hand_over(holder, waiter, key, 3, pause=0.3)
        assert squatter.is_held(name, TOKEN_A)
        assert squatter.client.type(name) == b"string"
        assert squatter.client.pttl(name) > 0
    finally:
        squatter.force_release(name)
        squatter.close()
        holder.close()
        waiter.close()


def test_a_lease_written_under_a_wake_list_a_watcher_blocks_on_costs_the_other_keys_nothing(
    backend: RedisBackend, key: str
) -> None:
    # The squatting lease arrives while the watcher already blocks on that wake list: the
    # watcher must drop that list (at its next refresh, or after its next BLPOP met WRONGTYPE)
    # and keep serving the other keys.
    other = f"{key}:other"
    counter = WakeCounter()
    squatter = RedisBackend(backend.client)  # the bare backend API, on the same server
    [watcher] = _queued(backend, key, [counter])
    try:
        watcher.want(other)
        assert wait_until(lambda: handoff_keys(other)[1] in watcher._blocking, 30)
        squatted = handoff_keys(key)[1]
        assert squatter.acquire(squatted, TOKEN_B, 60, "squatter")
        assert wait_until(lambda: squatted not in watcher._wanted, 30)
        assert backend.acquire(other, TOKEN_A, 30, "holder")
        assert backend.release(other, TOKEN_A)
        assert wait_until(lambda: counter.calls == [other], 30)
        assert watcher.active
        assert squatter.is_held(squatted, TOKEN_B) and squatter.client.pttl(squatted) > 0
    finally:
        watcher.close()
        squatter.force_release(handoff_keys(key)[1])
        squatter.close()


def test_fences_rise_with_every_hand_off_between_lockers(redis_server: RedisServer, key: str) -> None:
    # Guards direct hand-off too: a grant made by the release script must take a new fence.
    lockers = [Locker(RedisBackend.from_url(redis_server.url), ttl=30, fencing=True) for _ in range(2)]
    fences: list[int] = []
    try:
        held = lockers[0].acquire(key)
        for round_ in range(20):
            got: list[Any] = []
            taker = lockers[(round_ + 1) % 2]
            waiter = threading.Thread(target=lambda out=got, who=taker: out.append(who.acquire(key, timeout=30)))
            waiter.start()
            assert held.fence is not None
            fences.append(held.fence)
            held.release()
            waiter.join(60)
            assert got, "the waiter never acquired"
            held = got[0]
        held.release()
    finally:
        for locker in lockers:
            locker.close()
    assert fences == sorted(set(fences))


def test_a_release_racing_a_waiters_timeout_leaves_no_key_held_by_nobody(redis_server: RedisServer, key: str) -> None:
    # Whether the waiter's last attempt (or a grant made for it) wins or its timeout does, once
    # both sides are done nobody may hold the key: a grant nobody uses must go back.
    holder = Locker(RedisBackend.from_url(redis_server.url), ttl=30)
    waiter = Locker(RedisBackend.from_url(redis_server.url), ttl=30)
    try:
        for round_ in range(30):
            held = holder.acquire(key)
            outcome: list[Any] = []

            def wait(out: list[Any] = outcome) -> None:
                try:
                    out.append(waiter.acquire(key, timeout=0.05))
                except LockHeldError:
                    out.append(None)

            thread = threading.Thread(target=wait)
            thread.start()
            # Spread the releases across the waiter's timeout: before, at and after it.
            threading.Event().wait(0.03 + (round_ % 5) * 0.01)
            held.release()
            thread.join(60)
            assert outcome, "the waiter never returned"
            if outcome[0] is not None:
                outcome[0].release()
            assert not holder.backend.inspect(key).held
    finally:
        holder.close()
        waiter.close()
