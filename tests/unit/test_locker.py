"""Locker calls: try_acquire, acquire_many, re-acquire with a token, inspection."""

from __future__ import annotations

import math
import os
import socket
from typing import Iterator

import pytest
from lease_lock import Locker, LockHeldError, MemoryBackend, Retry, ValidationError, connect

from .fakes import START, EventLog, FakeClock, RecordingBackend, SilentBackend

OTHER = "o" * 32
MINE = "caller-token-0001"


@pytest.fixture
def fenced(backend: RecordingBackend, clock: FakeClock, events: EventLog) -> Iterator[Locker]:
    locker = Locker(backend, clock=clock, heartbeat_thread=False, on_event=events, fencing=True)
    yield locker
    locker.close()


# -- try_acquire ----------------------------------------------------------------------------------


def test_try_acquire_returns_a_held_lock_or_none(locker: Locker, backend: RecordingBackend) -> None:
    lock = locker.try_acquire("k")
    assert lock is not None and lock.state == "held"
    assert locker.try_acquire("k") is None
    assert len(backend.called("acquire")) == 2


def test_try_acquire_takes_no_waiting_options(locker: Locker, backend: RecordingBackend) -> None:
    for option in ({"retry": None}, {"timeout": 1}, {"blocking": True}):
        with pytest.raises(TypeError, match=next(iter(option))):
            locker.try_acquire("k", **option)
    assert backend.calls == []


# -- tokens and fences ----------------------------------------------------------------------------


def test_reacquire_with_the_same_token_resets_the_lease_and_keeps_the_fence(
    fenced: Locker, backend: RecordingBackend, clock: FakeClock
) -> None:
    first = fenced.acquire("k", token=MINE)
    assert first.token == MINE and isinstance(first.fence, int) and first.fence > 0
    clock.advance(20.0)
    again = fenced.acquire("k", ttl=60.0, token=MINE)
    assert again.fence == first.fence
    assert backend.inspect("k").expires_in == 60.0
    other = fenced.try_acquire("k")
    assert other is None


def test_fences_grow_with_every_grant_and_stay_across_extensions(
    fenced: Locker, clock: FakeClock
) -> None:
    first = fenced.acquire("k")
    first.extend()
    fence = first.fence
    first.release()
    second = fenced.acquire("k")
    assert first.fence == fence
    assert second.fence is not None and fence is not None and second.fence > fence


def test_without_fencing_locks_carry_no_fence_but_states_show_the_holders(
    locker: Locker, fenced: Locker, backend: RecordingBackend
) -> None:
    lock = locker.acquire("plain")
    assert lock.fence is None
    fenced.acquire("fenced")
    fence = fenced.get("fenced").fence
    assert fence is not None
    # The holder's fence is the store's fact: any reader sees it, fencing or not.
    assert locker.get("fenced").fence == fence
    assert {state.key: state.fence for state in locker.list()} == {"plain": None, "fenced": fence}
    assert backend.called("acquire_fenced") == [("acquire_fenced", "fenced", 30.0)]


def test_fencing_needs_a_backend_with_fences() -> None:
    class NoFences(MemoryBackend):
        capabilities = MemoryBackend.capabilities.__class__(fencing=False)

    with pytest.raises(ValidationError, match="fencing"):
        Locker(NoFences(), fencing=True)


def test_token_factory_makes_the_tokens(backend: RecordingBackend, clock: FakeClock) -> None:
    made = ["factory-token-0001", "factory-token-0002"]
    tokens = iter(made)
    locker = Locker(backend, clock=clock, heartbeat_thread=False, token_factory=lambda: next(tokens))
    assert [locker.acquire("a").token, locker.lock("b").token] == made
    locker.close()


def test_default_tokens_are_32_hex_characters_and_unique(locker: Locker) -> None:
    tokens = {locker.lock("k").token for _ in range(50)}
    assert len(tokens) == 50
    assert all(len(token) == 32 and int(token, 16) >= 0 for token in tokens)


# -- acquire_many ---------------------------------------------------------------------------------


def test_acquire_many_sorts_and_deduplicates(locker: Locker, backend: RecordingBackend) -> None:
    locks = locker.acquire_many(["b", "c", "a", "b"])
    assert locks.keys == ("a", "b", "c")
    assert [call[1] for call in backend.called("acquire")] == ["a", "b", "c"]
    assert locks.state == "held"
    locks.check()
    assert locks.release() is True
    assert locks.state == "released"
    assert not any(backend.inspect(key).held for key in "abc")


def test_acquire_many_is_all_or_nothing(locker: Locker, backend: RecordingBackend, events: EventLog) -> None:
    backend.acquire("c", OTHER, 60.0, "other")
    backend.calls.clear()
    with pytest.raises(LockHeldError) as caught:
        locker.acquire_many(["d", "a", "c", "b"], blocking=False)
    assert caught.value.key == "c"
    assert [call[1] for call in backend.called("acquire")] == ["a", "b", "c"], "d is never tried"
    assert not backend.inspect("a").held and not backend.inspect("b").held
    assert backend.is_held("c", OTHER)
    assert events.types() == ["acquired", "acquired", "contended", "released", "released"]


def test_acquire_many_extends_earlier_leases_so_all_overlap(
    locker: Locker, backend: RecordingBackend, clock: FakeClock
) -> None:
    backend.hooks["acquire"] = lambda: clock.advance(3.0)  # each grant takes 3 s to come back
    locks = locker.acquire_many(["a", "b", "c"], ttl=12.0)
    assert [call[1] for call in backend.called("extend")] == ["a", "b"]
    assert backend.batches == [2], "both renewed in one round trip"
    assert all(lock.state == "held" for lock in locks.locks)
    # Without the extension "a" would have 3 s left while "c" has 9 s; now all overlap by 9 s.
    assert min(backend.inspect(key).expires_in or 0 for key in "abc") == 9.0
    assert min(lock.expires_in for lock in locks.locks) >= 8.8


def test_acquire_many_renews_only_leases_worn_down_by_more_than_the_margin(
    locker: Locker, backend: RecordingBackend, clock: FakeClock
) -> None:
    # Granted together in no time: no lease lost 1% of its TTL, so nothing is renewed.
    with locker.acquire_many(["a", "b", "c"], ttl=12.0):
        assert backend.called("extend") == [] and backend.batches == []
    # "a" waits 0.2 s for "b" (more than 1% of 12 s); "b" comes back 0.1 s before "c" (less).
    pauses = iter([0.2, 0.1, 0.0])
    backend.hooks["acquire"] = lambda: clock.advance(next(pauses))
    with locker.acquire_many(["a", "b", "c"], ttl=12.0) as locks:
        assert [call[1] for call in backend.called("extend")] == ["a"]
        # Every lease of the set ends within 1% of a TTL of the others.
        ends = [lock.expires_in for lock in locks.locks]
        assert max(ends) - min(ends) <= 12.0 * 0.01


def test_acquire_many_refuses_a_caller_token(locker: Locker, backend: RecordingBackend) -> None:
    with pytest.raises(ValidationError, match="token"):
        locker.acquire_many(["a", "b"], token=MINE)
    assert backend.calls == []


def test_acquire_many_timeout_covers_the_whole_set(
    clock: FakeClock, sleeps: list[float]
) -> None:
    backend = SilentBackend(clock=clock)
    backend.acquire("b", OTHER, 3600.0, "other")
    locker = Locker(backend, clock=clock, heartbeat_thread=False, retry=Retry(delay=0.25))
    backend.hooks["acquire"] = lambda: clock.advance(0.5)
    with pytest.raises(LockHeldError) as caught:
        locker.acquire_many(["a", "b"], timeout=2.0)
    assert caught.value.reason == "timeout"
    # "a" took 0.5 s of the 2 s; "b" had 1.5 s left, not a fresh 2 s.
    assert clock() - START == 2.0
    assert not backend.inspect("a").held
    locker.close()


def test_lockset_lost_signal_and_state(locker: Locker, backend: RecordingBackend) -> None:
    locks = locker.acquire_many(["a", "b"])
    assert not locks.lost.is_set()
    backend.force_release("b")
    locks.locks[1].is_held()
    assert locks.lost.is_set() and locks.state == "lost"
    assert locks.lost.wait(0)


# -- inspection and administration ----------------------------------------------------------------


def test_get_list_and_force_release_apply_the_key_prefix(
    backend: RecordingBackend, clock: FakeClock
) -> None:
    app = Locker(backend, clock=clock, heartbeat_thread=False, key_prefix="app:", fencing=True, owner="worker-1")
    bare = Locker(backend, clock=clock, heartbeat_thread=False)
    lock = app.acquire("job")
    assert lock.key == "app:job"
    bare.acquire("job")
    state = app.get("job")
    assert (state.key, state.held, state.fence, state.owner) == ("app:job", True, lock.fence, "worker-1")
    assert state.expires_at is not None and state.expires_at.tzinfo is not None
    assert [state.key for state in app.list()] == ["app:job"]
    assert [state.key for state in bare.list()] == ["app:job", "job"]
    assert [state.key for state in app.list("jo")] == ["app:job"]
    assert list(app.list("x")) == []
    assert app.force_release("job") is True
    assert app.force_release("job") is False
    assert bare.get("job").held, "the unprefixed key was not touched"
    assert not app.get("job").held and app.get("job").expires_at is None
    assert lock.is_held() is False and lock.lost_reason == "observed"
    app.close()
    bare.close()


def test_default_owner_is_host_and_pid(locker: Locker) -> None:
    assert locker.owner == f"{socket.gethostname()}:{os.getpid()}"
    locker.acquire("k")
    assert locker.get("k").owner == locker.owner


def test_list_needs_a_backend_that_can_scan(clock: FakeClock) -> None:
    class NoScan(MemoryBackend):
        capabilities = MemoryBackend.capabilities.__class__(scan=False)

    locker = Locker(NoScan(clock=clock), clock=clock, heartbeat_thread=False)
    with pytest.raises(ValidationError, match="list"):
        locker.list()
    locker.close()


def test_connect_memory_gives_a_private_store_and_owns_it() -> None:
    first = connect("memory://", ttl=5, key_prefix="p:")
    second = connect("memory://")
    assert isinstance(first.backend, MemoryBackend) and first.backend is not second.backend
    assert (first.ttl, first.key_prefix, first.max_hold) == (5.0, "p:", 3600.0)
    first.acquire("k")
    assert second.try_acquire("p:k") is not None
    first.close()
    second.close()


def test_locker_is_a_context_manager(backend: RecordingBackend, clock: FakeClock) -> None:
    with Locker(backend, clock=clock, heartbeat_thread=False) as locker:
        lock = locker.acquire("k")
    assert locker.closed and lock.lost_reason == "closed"
    assert "closed" in repr(locker)


def test_infinite_max_hold_means_no_deadline(backend: RecordingBackend, clock: FakeClock) -> None:
    locker = Locker(backend, clock=clock, heartbeat_thread=False, ttl=10.0, max_hold=math.inf)
    lock = locker.acquire("k")
    for beat in range(1, 2000):
        clock.set(START + beat * 10.0 / 3)
        locker.run_heartbeat()
    assert lock.state == "held" and lock.held_for > 6000
    locker.close()


def test_remembered_options_are_still_validated_per_type() -> None:
    # Options made of plain values are built once per distinct set; a value equal to a
    # remembered one but of another type (1 == True) must still be refused.
    with Locker(MemoryBackend()) as locker:
        first = locker.lock("k", auto_extend=False)
        assert locker.lock("k", auto_extend=False)._options is first._options
        assert first._options.auto_extend is False
        with pytest.raises(ValidationError, match="auto_extend"):
            locker.lock("k", auto_extend=0)


# -- validated keys are remembered ----------------------------------------------------------------


def test_a_changed_key_prefix_applies_to_keys_locked_before(backend: RecordingBackend, clock: FakeClock) -> None:
    locker = Locker(backend, clock=clock, heartbeat_thread=False, key_prefix="a:")
    locker.acquire("k").release()
    locker.key_prefix = "b:"
    lock = locker.acquire("k")
    assert lock.key == "b:k"
    lock.release()
    # A prefix that makes the key too long is refused although "k" was accepted before.
    locker.key_prefix = "p" * 1024
    with pytest.raises(ValidationError, match="key"):
        locker.acquire("k")
    locker.close()


def test_a_refused_key_is_refused_every_time(locker: Locker) -> None:
    for _ in range(2):
        with pytest.raises(ValidationError, match="NUL"):
            locker.acquire("bad\x00key")
        with pytest.raises(ValidationError, match="must be a str"):
            locker.acquire(["not", "a", "key"])  # type: ignore[arg-type]
