"""The wait extension: ``Prefer: wait=N`` in whole seconds or to the millisecond; the waiting
room, where a release through the same process wakes its waiter at once, and a store that
cannot be watched gives the waiting slot back; and a wait in the store's line of waiters."""

from __future__ import annotations

import threading
import time
from typing import Callable, Optional

import pytest
from lease_lock.backends.base import LineGrant, ReleaseWatcher, WaitingLine
from lease_lock.backends.memory import MemoryBackend
from lease_lock.errors import BackendUnavailableError
from lease_lock.server.waits import InLine, WaitRoom, parse_wait_preference
from lease_lock.testing import wait_until
from lease_lock.wire import wait_text


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("wait=20", 20.0),
        ("wait=0.25", 0.25),
        ("respond-async, wait=1.5", 1.5),
        ('wait="0.125"; x=1', 0.125),
        ("wait=0.0005", None),  # finer than a millisecond
        ("wait=.5", None),
        ("wait=1.", None),
        ("wait=-1", None),
        ("wait=1e3", None),
        ("wait=nan", None),
        ("wait=1234567890", None),
        ("respond-async", None),
        (None, None),
    ],
)
def test_wait_preferences_in_whole_seconds_or_to_the_millisecond(
    header: Optional[str], seconds: Optional[float]
) -> None:
    assert parse_wait_preference(header) == seconds


def test_waits_are_written_without_a_needless_fraction() -> None:
    assert [wait_text(s) for s in (30.0, 10.0, 0.25, 0.001, 1.5)] == ["30", "10", "0.25", "0.001", "1.5"]


class Held:
    """A ``held_for`` that reports the key held for a long time until ``free`` is set."""

    def __init__(self) -> None:
        self.calls = 0
        self.free = threading.Event()

    def __call__(self) -> Optional[float]:
        self.calls += 1
        return None if self.free.is_set() else 1000.0


def test_a_release_through_this_process_wakes_the_waiter_without_the_store() -> None:
    room = WaitRoom(MemoryBackend(), max_waits=2, max_wait=1000.0)
    held = Held()
    results: list[Optional[bool]] = []
    waiter = threading.Thread(target=lambda: results.append(room.wait_until_free("k", held, 1000)))
    waiter.start()
    try:
        assert wait_until(lambda: room.waiting == 1 and held.calls == 1, 20)
        # Nothing was released in the store: only the local wake can end the wait early.
        held.free.set()
        room.released("k")
        waiter.join(20)
        assert results == [True] and held.calls == 2
        assert room.waiting == 0
    finally:
        held.free.set()
        room.released("k")
        room.close()


def test_a_release_of_another_key_wakes_nobody() -> None:
    room = WaitRoom(MemoryBackend(), max_waits=2, max_wait=1000.0)
    held = Held()
    waiter = threading.Thread(target=lambda: room.wait_until_free("k", held, 1000))
    waiter.start()
    try:
        assert wait_until(lambda: held.calls == 1, 20)
        room.released("other")
        room.released("k")  # wakes it; it reads again and keeps waiting
        assert wait_until(lambda: held.calls == 2, 20)
        assert room.waiting == 1
    finally:
        held.free.set()
        room.released("k")
        waiter.join(20)
        room.close()


class Unwatchable(MemoryBackend):
    """A store whose release notifications cannot be started (as when it is down)."""

    def watch_releases(self, callback: Callable[[str], None]) -> ReleaseWatcher:
        raise BackendUnavailableError("down", backend="memory")


def test_a_store_that_cannot_be_watched_gives_the_slot_back() -> None:
    room = WaitRoom(Unwatchable(), max_waits=1, max_wait=10.0)
    for _ in range(3):
        with pytest.raises(BackendUnavailableError):
            room.wait_until_free("k", Held(), 10)
        assert room.waiting == 0
    room.close()


def test_a_release_while_the_waiter_takes_the_key_leaves_the_store_event_alone() -> None:
    # The store's event stays the store's: a local wake that finds the request awake (reading,
    # here taking the key) must not set it, or the request would leave with its grant and an
    # event that the dispatcher takes for an unused store wake-up (and sends on to another
    # waiter, a store round trip before the answer).
    room = WaitRoom(MemoryBackend(), max_waits=1, max_wait=1000.0)
    assert room._dispatcher is not None
    seen_set: list[bool] = []
    unregister = room._dispatcher.unregister

    def spy(key: str, event: threading.Event) -> None:
        seen_set.append(event.is_set())
        unregister(key, event)

    room._dispatcher.unregister = spy  # type: ignore[method-assign]
    calls: list[int] = []

    def held_for() -> Optional[float]:
        calls.append(1)
        if len(calls) == 1:
            return 0.001  # held a moment more: the request sleeps, then reads again
        room.released("k")  # the holder's release lands while this read takes the key
        return None

    try:
        assert room.wait_until_free("k", held_for, 1000) is True
        assert len(calls) == 2 and seen_set == [False]
        assert room.waiting == 0
    finally:
        room.close()


def test_a_release_while_the_waiter_reads_makes_it_read_again_at_once() -> None:
    # No lost wake-up: a release that came while the request was reading (and found the key
    # still held) sends it back to the store instead of to sleep.
    room = WaitRoom(MemoryBackend(), max_waits=1, max_wait=1000.0)
    calls: list[int] = []

    def held_for() -> Optional[float]:
        calls.append(1)
        if len(calls) == 1:
            room.released("k")
            return 1000.0
        return None

    try:
        assert room.wait_until_free("k", held_for, 1000) is True
        assert len(calls) == 2
    finally:
        room.close()


class ScriptedLine(WaitingLine):
    """A place in line whose waits and asks answer from scripts; notes how it was left."""

    def __init__(self, waits: list[Optional[LineGrant]], asks: Optional[list[Optional[int]]] = None) -> None:
        self.waits = waits
        self.asks = asks if asks is not None else []
        self.waited: list[float] = []
        self.asked = 0
        self.left: list[bool] = []

    def ask(self) -> Optional[int]:
        self.asked += 1
        return self.asks.pop(0) if self.asks else None

    def wait(self, seconds: float) -> Optional[LineGrant]:
        self.waited.append(seconds)
        return self.waits.pop(0) if self.waits else None

    def leave(self, granted: bool) -> None:
        self.left.append(granted)


def _room() -> WaitRoom:
    return WaitRoom(MemoryBackend(), max_waits=1, max_wait=30)


def _keeping(into: list[LineGrant], answer: str) -> Callable[[LineGrant], str]:
    """A claim that notes each grant and answers ``answer``."""

    def claim(grant: LineGrant) -> str:
        into.append(grant)
        return answer

    return claim


def test_a_grant_handed_to_the_place_is_claimed_and_the_line_left_with_it() -> None:
    room, line = _room(), ScriptedLine([None, LineGrant(7, 1.0, 2.0, True)])
    claimed: list[LineGrant] = []
    result = room.wait_in_line(lambda: line, _keeping(claimed, "mine"), 5, 31.0)
    assert result is not None and result.claimed == "mine"
    assert claimed == [LineGrant(7, 1.0, 2.0, True)] and line.left == [True]
    assert room.waiting == 0 and line.asked == 0


def test_a_grant_lost_before_its_claim_keeps_the_request_in_line() -> None:
    room = _room()
    line = ScriptedLine([LineGrant(7, 1.0, 2.0, True), LineGrant(9, 2.0, 2.0, True)])
    answers: list[Optional[str]] = [None, "second"]
    result = room.wait_in_line(lambda: line, lambda grant: answers.pop(0), 5, 31.0)
    assert result is not None and result.claimed == "second" and line.left == [True]


def test_a_grant_that_reaches_a_request_whose_client_left_is_passed_on_unclaimed() -> None:
    room, line = _room(), ScriptedLine([LineGrant(7, 1.0, 2.0, True)])
    left = iter([False, True, True])
    result: Optional[InLine[str]] = room.wait_in_line(
        lambda: line, lambda grant: pytest.fail("claimed for a client that left"), 5, 31.0, gone=lambda: next(left)
    )
    assert result is not None and result.claimed is None
    assert line.left == [False]  # the store releases the handed key to the next in line
    assert all(seconds <= 0.25 for seconds in line.waited)


def test_the_place_asks_for_the_key_itself_when_the_wait_ends() -> None:
    room, line = _room(), ScriptedLine([], asks=[None])
    result = room.wait_in_line(lambda: line, lambda grant: "never", 0, 31.0)
    assert result is not None and result.claimed is None
    assert line.asked == 1 and line.left == [False]


def test_a_key_the_place_took_itself_when_the_holders_lease_ended_is_dated_from_that_attempt() -> None:
    # The holder's lease ended (an expiry hands nothing over): the place asks for the key.
    room, line = _room(), ScriptedLine([], asks=[5])
    claimed: list[LineGrant] = []
    before = time.monotonic()
    room.wait_in_line(lambda: line, _keeping(claimed, "taken"), 30, 31.0, expires_in=0)
    [grant] = claimed
    assert grant.fence == 5 and not grant.claimed and grant.lease == 31.0 and before <= grant.sent
    assert line.asked == 1 and line.left == [True]


def test_no_waiting_slot_or_no_place_in_line_leaves_the_request_to_the_usual_wait() -> None:
    room = _room()
    assert room.wait_in_line(lambda: None, lambda grant: "x", 5, 31.0) is None
    held = ScriptedLine([])
    release = threading.Event()
    started = threading.Event()

    def occupy() -> None:
        def join() -> ScriptedLine:
            started.set()
            release.wait(10)
            return held

        room.wait_in_line(join, lambda grant: "x", 0, 31.0)

    thread = threading.Thread(target=occupy)
    thread.start()
    assert started.wait(10)
    assert room.wait_in_line(lambda: pytest.fail("joined without a slot"), lambda grant: "x", 5, 31.0) is None
    release.set()
    thread.join(10)
    assert room.waiting == 0


def test_a_claim_that_fails_leaves_the_line_and_frees_the_slot() -> None:
    room, line = _room(), ScriptedLine([LineGrant(7, 1.0, 2.0, True)])

    def claim(grant: LineGrant) -> str:
        raise BackendUnavailableError("store gone", backend="test")

    with pytest.raises(BackendUnavailableError):
        room.wait_in_line(lambda: line, claim, 5, 31.0)
    assert line.left == [False] and room.waiting == 0
    assert room.wait_in_line(lambda: None, claim, 5, 31.0) is None  # the slot is free again
