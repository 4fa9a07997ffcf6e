"""Leader election on the memory backend, in real time: who leads, callbacks and their order,
resign, loss and re-election. Waits are on events with generous limits, never timed."""

from __future__ import annotations

import logging
import threading
from typing import Iterator, Optional

import pytest
from lease_lock import Leadership, Lock, Locker, LockStateError, MemoryBackend, ValidationError

from ..support.polling import wait_until

TTL = 3.0
LIMIT = 30.0


class Candidate:
    """Records one candidate's callbacks, the thread each ran on, and any overlap of two."""

    def __init__(self, locker: Locker, key: str = "leader", *, hold: Optional[threading.Event] = None) -> None:
        self.calls: list[tuple[str, object]] = []
        self.threads: set[int] = set()
        self.overlaps = 0
        self._inside = threading.Lock()
        self._hold = hold
        self.elected = threading.Event()
        self.revoked = threading.Event()
        self.leadership = locker.elect(key, on_elected=self.on_elected, on_revoked=self.on_revoked, ttl=TTL)

    def _enter(self) -> None:
        if not self._inside.acquire(blocking=False):
            self.overlaps += 1
        self.threads.add(threading.get_ident())

    def on_elected(self, lock: Lock) -> None:
        self._enter()
        try:
            assert lock.state == "held"
            self.calls.append(("elected", lock.fence))
            self.elected.set()
            if self._hold is not None:
                assert self._hold.wait(LIMIT)
        finally:
            self._inside.release()

    def on_revoked(self, reason: str) -> None:
        self._enter()
        try:
            self.calls.append(("revoked", reason))
            self.revoked.set()
        finally:
            self._inside.release()

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.calls]


@pytest.fixture
def backend() -> MemoryBackend:
    return MemoryBackend()


@pytest.fixture
def lockers(backend: MemoryBackend) -> Iterator[list[Locker]]:
    """Three lockers (three "hosts") sharing one memory store, with fencing."""
    made = [Locker(backend, fencing=True, ttl=TTL) for _ in range(3)]
    yield made
    for locker in made:
        locker.close()


def leaders(candidates: list[Candidate]) -> list[Candidate]:
    return [candidate for candidate in candidates if candidate.leadership.is_leader]


def test_one_candidate_is_elected_and_close_revokes_and_gives_the_key_back(
    lockers: list[Locker], backend: MemoryBackend
) -> None:
    candidate = Candidate(lockers[0])
    leadership = candidate.leadership
    assert isinstance(leadership, Leadership)
    assert leadership.wait(LIMIT) is True
    assert leadership.is_leader
    assert leadership.fence is not None and leadership.fence == backend.inspect("leader").fence
    assert leadership.lock is not None and leadership.lock.key == "leader"
    assert candidate.elected.wait(LIMIT)
    leadership.close()
    assert candidate.calls == [("elected", leadership_fence(candidate)), ("revoked", "closed")]
    assert not leadership.is_leader and leadership.fence is None and leadership.closed
    assert not backend.inspect("leader").held, "closing gives the key back at once"
    assert leadership.wait(0) is False
    leadership.close()  # idempotent
    assert candidate.kinds() == ["elected", "revoked"]


def leadership_fence(candidate: Candidate) -> object:
    return candidate.calls[0][1]


def test_exactly_one_of_three_leads_and_resign_hands_over(lockers: list[Locker]) -> None:
    candidates = [Candidate(locker) for locker in lockers]
    wait_until(lambda: len(leaders(candidates)) == 1, "a first leader")
    first = leaders(candidates)[0]
    standbys = [candidate for candidate in candidates if candidate is not first]
    for standby in standbys:
        assert standby.leadership.wait(0.2) is False
        assert standby.leadership.fence is None
    old_fence = first.leadership.fence
    assert old_fence is not None
    first.leadership.resign()
    assert first.kinds() == ["elected", "revoked"] and first.calls[1] == ("revoked", "resigned")
    wait_until(lambda: len(leaders(standbys)) == 1, "the next leader")
    second = leaders(standbys)[0]
    assert second.leadership.fence is not None and second.leadership.fence > old_fence
    assert not first.leadership.is_leader
    for candidate in candidates:
        candidate.leadership.close()
        assert candidate.overlaps == 0
        assert len(candidate.threads) <= 1, "callbacks of one candidate run on one thread"
        kinds = candidate.kinds()
        assert kinds == ["elected", "revoked"] * (len(kinds) // 2)


def test_a_lost_lease_is_revoked_with_its_reason_and_the_candidate_campaigns_again(
    lockers: list[Locker],
) -> None:
    candidate = Candidate(lockers[0])
    assert candidate.leadership.wait(LIMIT)
    first_fence = candidate.leadership.fence
    assert first_fence is not None
    # Someone else (an operator, a partition that let the lease lapse) takes the key.
    assert lockers[1].force_release("leader")
    assert candidate.revoked.wait(LIMIT)
    assert candidate.calls[1] == ("revoked", "extend")
    wait_until(lambda: candidate.kinds() == ["elected", "revoked", "elected"], "re-election")
    fence = candidate.leadership.fence
    assert candidate.leadership.is_leader and fence is not None and fence > first_fence
    candidate.leadership.close()
    assert candidate.kinds() == ["elected", "revoked", "elected", "revoked"]


def test_callbacks_never_overlap_a_loss_during_on_elected_is_reported_after_it(lockers: list[Locker]) -> None:
    hold = threading.Event()
    candidate = Candidate(lockers[0], hold=hold)
    assert candidate.elected.wait(LIMIT)
    lockers[1].force_release("leader")
    lock = candidate.leadership
    wait_until(lambda: not lock.is_leader, "the lease read lost while on_elected still runs")
    assert not candidate.revoked.is_set(), "on_revoked waits for on_elected to return"
    hold.set()
    assert candidate.revoked.wait(LIMIT)
    candidate.leadership.close()
    assert candidate.overlaps == 0 and len(candidate.threads) == 1
    assert candidate.kinds()[:2] == ["elected", "revoked"]


def test_a_raising_callback_is_logged_and_the_campaign_goes_on(
    lockers: list[Locker], caplog: pytest.LogCaptureFixture
) -> None:
    revoked = threading.Event()

    def on_elected(lock: Lock) -> None:
        raise RuntimeError("boom")

    with caplog.at_level(logging.ERROR, logger="lease_lock"):
        leadership = lockers[0].elect("leader", on_elected=on_elected, on_revoked=lambda reason: revoked.set())
        assert leadership.wait(LIMIT)
        wait_until(lambda: any("raised" in record.getMessage() for record in caplog.records), "the logged error")
        assert leadership.is_leader, "a callback error does not end the leadership"
        leadership.close()
    assert revoked.is_set()


def test_the_locker_closing_revokes_and_ends_the_campaign(backend: MemoryBackend) -> None:
    locker = Locker(backend, ttl=TTL)
    revoked: list[str] = []
    leadership = locker.elect("leader", on_revoked=revoked.append)
    assert leadership.wait(LIMIT)
    assert leadership.fence is None, "no fence without a fencing locker"
    locker.close()
    wait_until(lambda: revoked == ["closed"], "on_revoked('closed')")
    leadership.close()
    assert not backend.inspect("leader").held
    with pytest.raises(LockStateError):
        locker.elect("other")


def test_context_manager_and_a_standby_that_closes_while_waiting(lockers: list[Locker]) -> None:
    with lockers[0].elect("leader") as leader:
        assert leader.wait(LIMIT)
        with lockers[1].elect("leader") as standby:
            assert standby.wait(0.1) is False
            assert "candidate" in repr(standby) and "leader" in repr(leader)
        assert standby.closed and not standby.is_leader
        assert leader.is_leader
    assert leader.closed and not leader.is_leader


def test_bad_arguments_raise_before_anything_starts(lockers: list[Locker], backend: MemoryBackend) -> None:
    before = threading.active_count()
    with pytest.raises(ValidationError, match="on_elected"):
        lockers[0].elect("leader", on_elected=42)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="key"):
        lockers[0].elect("")
    with pytest.raises(ValidationError, match="ttl"):
        lockers[0].elect("leader", ttl=-1)
    assert threading.active_count() == before
    assert not backend.inspect("leader").held


def test_a_term_has_no_max_hold_deadline(backend: MemoryBackend) -> None:
    with Locker(backend, ttl=TTL, max_hold=0.5) as locker:
        revoked: list[str] = []
        leadership = locker.elect("leader", on_revoked=revoked.append)
        assert leadership.wait(LIMIT)
        lock = leadership.lock
        assert lock is not None
        # Past the locker's max_hold (and several heartbeats), the term goes on.
        assert not lock.lost.wait(4 * 0.5)
        assert leadership.is_leader and revoked == []
        leadership.close()
    assert revoked == ["closed"]


def test_resign_from_a_callback_ends_the_term_after_it_returns(lockers: list[Locker], backend: MemoryBackend) -> None:
    calls: list[str] = []
    done = threading.Event()
    holder: list[Leadership] = []
    ready = threading.Event()

    def on_elected(lock: Lock) -> None:
        assert ready.wait(LIMIT)
        holder[0].resign()  # from the campaign thread itself: must not wait for itself
        calls.append("elected")

    def on_revoked(reason: str) -> None:
        calls.append(reason)
        done.set()

    holder.append(lockers[0].elect("leader", on_elected=on_elected, on_revoked=on_revoked))
    ready.set()
    assert done.wait(LIMIT)
    holder[0].close()
    assert calls == ["elected", "resigned"]
    assert not backend.inspect("leader").held


def test_a_standby_ends_when_its_locker_closes(lockers: list[Locker]) -> None:
    with lockers[0].elect("leader") as leader:
        assert leader.wait(LIMIT)
        standby = lockers[1].elect("leader")
        lockers[1].close()
        assert standby.wait() is False, "a wait ends with the candidacy"
        assert standby.closed and not standby.is_leader
        standby.close()
        assert leader.is_leader
