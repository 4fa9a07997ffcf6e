"""Crowds wait as one: the waiting threads of one Locker on one key queue in the Locker, first
come first served, behind a single place in the store's line.

On Redis the places are read from the store (the length of the key's line); on the memory
backend, whose line is its release watcher, from the lines the backend handed out and that are
not left yet (``join_line`` and ``leave`` are the backend contract's). Every wait ends on an
event or a thread's end, with generous timeouts.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any, Callable, NamedTuple, Optional

import pytest
from lease_lock import Lock, Locker, LockHeldError, Retry
from lease_lock.backends.base import LineGrant, WaitingLine
from lease_lock.backends.memory import MemoryBackend
from lease_lock.backends.redis import RedisBackend, line_keys
from lease_lock.testing import wait_until

from tests.support.events import Recorder
from tests.support.redis_server import RedisServer


class _Counted(WaitingLine):
    """A line that tells its backend when it is left."""

    def __init__(self, line: WaitingLine, left: Callable[[], None]) -> None:
        self._line = line
        self._left: Optional[Callable[[], None]] = left

    def ask(self) -> Optional[int]:
        return self._line.ask()

    def wait(self, seconds: float) -> Optional[LineGrant]:
        return self._line.wait(seconds)

    def leave(self, granted: bool) -> None:
        self._line.leave(granted)
        left, self._left = self._left, None
        if left is not None:
            left()


class _CountedLines(MemoryBackend):
    """A memory backend that counts the lines it handed out and that are not left yet."""

    def __init__(self) -> None:
        super().__init__()
        self.open = 0
        self._mutex = threading.Lock()

    def join_line(
        self, key: str, token: str, ttl: float, owner: str, fenced: bool, clock: Callable[[], float]
    ) -> Optional[WaitingLine]:
        line = super().join_line(key, token, ttl, owner, fenced, clock)
        assert line is not None
        with self._mutex:
            self.open += 1
        return _Counted(line, self._left)

    def _left(self) -> None:
        with self._mutex:
            self.open -= 1


class Store(NamedTuple):
    """Makes Lockers on one store, and reads how many places a key's line has; ``direct``
    when its line is handed the key (and told to wait out a holder's burst)."""

    locker: Callable[..., Locker]
    places: Callable[[str], int]
    direct: bool


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    made: list[Locker] = []
    if request.param == "memory":
        backend = _CountedLines()

        def memory_locker(**options: Any) -> Locker:
            made.append(Locker(backend, **options))
            return made[-1]

        yield Store(memory_locker, lambda key: backend.open, False)
        backend.close()
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        reader = RedisBackend.from_url(server.url)

        def redis_locker(**options: Any) -> Locker:
            made.append(Locker(RedisBackend.from_url(server.url), owns_backend=True, **options))
            return made[-1]

        yield Store(redis_locker, lambda key: int(reader.client.llen(line_keys(key)[0])), True)
        reader.close()
    for locker in made:
        locker.close()


@pytest.fixture
def key() -> str:
    return f"crowd:{uuid.uuid4().hex}"


def _start(target: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def _busy(store: Store, key: str) -> tuple[Lock, Locker, Recorder]:
    """``key`` held by one Locker, and another Locker, with its events, whose threads wait for it."""
    holder = store.locker(ttl=60)
    events = Recorder()
    waiter = store.locker(ttl=60, on_event=events)
    return holder.acquire(key), waiter, events


def test_the_waiting_threads_of_one_locker_take_one_place_in_the_stores_line(store: Store, key: str) -> None:
    held, waiter, events = _busy(store, key)
    seen: list[int] = []
    threads_count = 6  # within the bound of threads in a direct line, which each could take today

    def take_once() -> None:
        with waiter.lock(key, timeout=60):
            # Holding: the places in line now are those of the others still waiting.
            seen.append(store.places(key))

    threads = [_start(take_once) for _ in range(threads_count)]
    assert events.wait_for("contended", threads_count, timeout=30)
    assert wait_until(lambda: store.places(key) >= 1, 30)
    held.release()
    for thread in threads:
        thread.join(60)
    assert len(seen) == threads_count
    # The next thread's place, at most: the others queue in the Locker.
    assert max(seen) <= 1, seen
    assert wait_until(lambda: store.places(key) == 0, 30)


def test_local_waiters_get_the_key_in_the_order_they_came(store: Store, key: str) -> None:
    held, waiter, events = _busy(store, key)
    order: list[int] = []

    def take_once(index: int) -> None:
        with waiter.lock(key, timeout=60):
            order.append(index)

    threads = []
    for index in range(5):
        threads.append(_start(lambda index=index: take_once(index)))
        # Each comes after the one before found the key held.
        assert events.wait_for("contended", index + 1, timeout=30)
    held.release()
    for thread in threads:
        thread.join(60)
    assert sorted(order) == list(range(5))
    if store.direct:
        # The first thread takes the crowd's place in the store's line. A thread that takes that
        # place later waits out a holder's burst there (the store leaves the key free meanwhile,
        # and the threads behind it take the burst's grants): first come, first served holds
        # among the threads the Locker queues.
        assert order[0] == 0, order
    else:
        assert order == list(range(5))


def _failing(locker: Locker, key: str, out: list[BaseException], **options: Any) -> threading.Thread:
    def wait() -> None:
        try:
            locker.acquire(key, **options)
        except LockHeldError as error:
            out.append(error)
        else:  # pragma: no cover - the assertions below report it
            out.append(AssertionError("granted"))

    return _start(wait)


def test_a_queued_waiter_that_times_out_leaves_and_the_rest_still_get_the_key(store: Store, key: str) -> None:
    held, waiter, events = _busy(store, key)
    got: list[int] = []

    def take_once(index: int) -> None:
        with waiter.lock(key, timeout=60):
            got.append(index)

    first = _start(lambda: take_once(0))
    assert events.wait_for("contended", 1)
    failed: list[BaseException] = []
    impatient = _failing(waiter, key, failed, timeout=0.5)
    assert events.wait_for("contended", 2)
    last = _start(lambda: take_once(2))
    assert events.wait_for("contended", 3)
    impatient.join(30)
    assert events.wait_for("timed_out", 1)
    [error] = failed
    assert isinstance(error, LockHeldError) and error.reason == "timeout"
    # Queued in the Locker, it asked the store nothing after its first attempt.
    assert error.attempts == 1
    held.release()
    first.join(60)
    last.join(60)
    assert got == [0, 2]


def test_a_queued_waiter_can_be_cancelled(store: Store, key: str) -> None:
    held, waiter, events = _busy(store, key)
    got: list[bool] = []
    first = _start(lambda: got.append(waiter.acquire(key, timeout=60).release()))
    assert events.wait_for("contended", 1)
    cancel = threading.Event()
    failed: list[BaseException] = []
    queued = _failing(waiter, key, failed, timeout=60, cancel=cancel)
    assert events.wait_for("contended", 2)
    cancel.set()
    queued.join(30)
    [error] = failed
    assert isinstance(error, LockHeldError) and error.reason == "cancelled"
    held.release()
    first.join(60)
    assert got == [True]


def test_a_delegate_that_times_out_hands_the_crowds_place_on(store: Store, key: str) -> None:
    held, waiter, events = _busy(store, key)
    failed: list[BaseException] = []
    delegate = _failing(waiter, key, failed, timeout=0.5)
    assert events.wait_for("contended", 1)
    got: list[Any] = []
    queued = _start(lambda: got.append(waiter.acquire(key, timeout=60)))
    assert events.wait_for("contended", 2)
    delegate.join(30)
    assert [getattr(error, "reason", error) for error in failed] == ["timeout"]
    # The next thread took the crowd's place in line.
    assert wait_until(lambda: store.places(key) == 1, 30)
    held.release()
    queued.join(60)
    assert [lock.state for lock in got] == ["held"]
    # The release brought the key: the first attempt, then the grant the line brought.
    acquired = [event.attempts for event in events.events if event.type == "acquired"]
    assert acquired == [2]
    got[0].release()


def test_a_waiter_that_may_not_queue_never_waits_behind_the_crowd(store: Store, key: str) -> None:
    held, waiter, events = _busy(store, key)
    got: list[Any] = []
    queued = _start(lambda: got.append(waiter.acquire(key, timeout=60)))
    assert events.wait_for("contended", 1)
    assert waiter.try_acquire(key) is None
    with pytest.raises(LockHeldError):
        waiter.acquire(key, blocking=False)
    with pytest.raises(LockHeldError):
        waiter.acquire(key, retry=Retry(retries=0))
    held.release()
    queued.join(60)
    assert [lock.state for lock in got] == ["held"]
    got[0].release()


class _NoLine(MemoryBackend):
    """A memory backend that offers no waiting line: its waiters sleep out their pause."""

    def join_line(
        self, key: str, token: str, ttl: float, owner: str, fenced: bool, clock: Callable[[], float]
    ) -> Optional[WaitingLine]:
        return None


def test_a_release_by_the_same_locker_wakes_the_head_of_its_crowd_on_a_store_without_a_line() -> None:
    events = Recorder()
    locker = Locker(_NoLine(), ttl=60, on_event=events, owns_backend=True)
    try:
        held = locker.acquire("k")
        got: list[Any] = []
        # A pause far longer than the test waits for the grant: only the release ends it.
        waiting = _start(lambda: got.append(locker.acquire("k", timeout=600, retry=Retry(delay=300))))
        assert events.wait_for("contended", 1)
        held.release()
        assert events.wait_for("acquired", 2, timeout=60)
        waiting.join(30)
        assert [lock.state for lock in got] == ["held"]
        assert [event.attempts for event in events.events if event.type == "acquired"] == [1, 2]
        got[0].release()
    finally:
        locker.close()
