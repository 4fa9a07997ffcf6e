"""Bad input and misuse: every public call refuses bad keys, TTLs and options up front.

Property-based: hypothesis draws invalid values; each call must raise ``ValidationError`` and
the backend must see no lease-changing call at all (so nothing was written) and still hold
exactly what it held before. Misuse: a ``Lock`` after release, from another thread, after fork.
"""

from __future__ import annotations

import math
import os
import threading
from datetime import timedelta
from typing import Any, Callable, Iterator, Optional

import lease_lock
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from lease_lock import Locker, LockStateError, MemoryBackend, Retry, ValidationError
from lease_lock.backends.base import ExtendRequest
from lease_lock.options import LOCK_OPTIONS

pytestmark = pytest.mark.chaos

HELD_KEY = "already-held"


class SpyBackend(MemoryBackend):
    """A memory backend that remembers every lease-changing call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def acquire(self, key: str, token: str, ttl: float, owner: str) -> bool:
        self.calls.append("acquire")
        return super().acquire(key, token, ttl, owner)

    def acquire_fenced(self, key: str, token: str, ttl: float, owner: str) -> Optional[int]:
        self.calls.append("acquire_fenced")
        return super().acquire_fenced(key, token, ttl, owner)

    def release(self, key: str, token: str) -> bool:
        self.calls.append("release")
        return super().release(key, token)

    def extend(self, key: str, token: str, ttl: float) -> bool:
        self.calls.append("extend")
        return super().extend(key, token, ttl)

    def extend_many(self, requests: Any) -> list[bool]:
        self.calls.append("extend_many")
        return [super(SpyBackend, self).extend(item.key, item.token, item.ttl) for item in requests]

    def force_release(self, key: str) -> bool:
        self.calls.append("force_release")
        return super().force_release(key)

    def snapshot(self) -> list[tuple[str, Optional[int], Optional[str]]]:
        return [(state.key, state.fence, state.owner) for state in self.scan("")]


@pytest.fixture(scope="module")
def world() -> Iterator[tuple[Locker, SpyBackend, lease_lock.Lock]]:
    """One locker (fencing on) whose backend already holds one key."""
    backend = SpyBackend()
    locker = Locker(backend, ttl=60, fencing=True)
    held = locker.acquire(HELD_KEY)
    yield locker, backend, held
    locker.close()


def refused(world: tuple[Locker, SpyBackend, lease_lock.Lock], call: Callable[[], Any]) -> None:
    """``call`` raises ValidationError and the backend saw no write and changed nothing."""
    _, backend, held = world
    before = backend.snapshot()
    backend.calls.clear()
    with pytest.raises(ValidationError):
        call()
    assert backend.calls == []
    assert backend.snapshot() == before
    assert held.state == "held"


# -- strategies --------------------------------------------------------------------------------

not_a_str = st.one_of(st.none(), st.integers(), st.floats(), st.binary(), st.lists(st.text(), max_size=2))
bad_keys = st.one_of(
    not_a_str,
    st.just(""),
    st.text(max_size=20).map(lambda text: text + "\x00"),
    st.integers(1025, 3000).map(lambda size: "k" * size),
    st.integers(342, 1000).map(lambda size: "€" * size),  # three UTF-8 bytes each: over 1024 bytes
    st.just("lone \ud800 surrogate"),
)
bad_numbers = st.one_of(
    st.floats(max_value=0.0, allow_nan=False),
    st.just(math.nan),
    st.just(-math.inf),
    st.booleans(),
    st.text(max_size=5),
    st.timedeltas(max_value=timedelta(0)),
)
bad_ttls = st.one_of(bad_numbers, st.just(math.inf))
bad_tokens = st.one_of(
    not_a_str,
    st.text(alphabet="abc123", max_size=15),
    st.text(alphabet="abc123", min_size=129, max_size=200),
    st.text(alphabet="ab!@# /", min_size=16, max_size=40).filter(lambda text: any(c in "!@# /" for c in text)),
)
not_a_bool = st.one_of(st.none(), st.integers(), st.text(max_size=3), st.floats())
unknown_option_names = st.text(alphabet="abcdefghij_", min_size=1, max_size=12).filter(
    lambda name: name not in LOCK_OPTIONS and name not in ("key", "keys", "ttl", "skip")
)
bad_options = st.one_of(
    st.builds(lambda value: {"retry": value}, st.one_of(st.integers(), st.text(max_size=3), st.just({}))),
    st.builds(lambda value: {"timeout": value}, st.one_of(st.floats(max_value=-0.001), st.just(math.nan),
                                                         st.text(max_size=3), st.booleans())),
    st.builds(lambda value: {"blocking": value}, not_a_bool),
    st.builds(lambda value: {"auto_extend": value}, not_a_bool),
    st.builds(lambda value: {"cancel": value}, st.one_of(st.integers(), st.text(max_size=3), st.booleans())),
    st.builds(lambda value: {"max_hold": value}, bad_numbers),
    st.builds(lambda value: {"extend_interval": value}, st.one_of(bad_ttls, st.floats(30.001, 1e6))),
    st.builds(lambda value: {"token": value}, bad_tokens.filter(lambda token: token is not None)),
    st.builds(lambda value: {"request_id": value}, st.one_of(st.just(""), st.integers(),
                                                            st.text(min_size=129, max_size=140))),
)

# Every public Locker call that takes a key, ttl and options.
KEYED_CALLS: dict[str, Callable[..., Any]] = {
    "lock": lambda locker, key, ttl, opts: locker.lock(key, ttl, **opts),
    "acquire": lambda locker, key, ttl, opts: locker.acquire(key, ttl, **opts),
    "try_acquire": lambda locker, key, ttl, opts: locker.try_acquire(key, ttl, **opts),
    "locked": lambda locker, key, ttl, opts: locker.locked(key, ttl, **opts)(lambda: None)(),
    "acquire_many": lambda locker, key, ttl, opts: locker.acquire_many(["fine", key], ttl, **opts),
}
FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize("call", sorted(KEYED_CALLS))
@FAST
@given(key=bad_keys)
def test_bad_keys_are_refused(world: Any, call: str, key: object) -> None:
    refused(world, lambda: KEYED_CALLS[call](world[0], key, None, {}))


@pytest.mark.parametrize("call", sorted(KEYED_CALLS))
@FAST
@given(ttl=bad_ttls)
def test_bad_ttls_are_refused(world: Any, call: str, ttl: object) -> None:
    refused(world, lambda: KEYED_CALLS[call](world[0], "fresh-key", ttl, {}))


@pytest.mark.parametrize("call", sorted(KEYED_CALLS))
@FAST
@given(opts=bad_options)
def test_bad_options_are_refused(world: Any, call: str, opts: dict[str, Any]) -> None:
    # try_acquire takes no waiting options: those are unknown names to it (the test above).
    assume(call != "try_acquire" or not set(opts) & {"retry", "timeout", "blocking"})
    # The held key: even a valid-looking acquire of it must not reach the backend.
    refused(world, lambda: KEYED_CALLS[call](world[0], HELD_KEY, None, opts))


@pytest.mark.parametrize("call", sorted(KEYED_CALLS))
@FAST
@given(name=unknown_option_names)
def test_unknown_options_are_refused(world: Any, call: str, name: str) -> None:
    # A name the call does not take is Python's TypeError, raised before the backend is asked.
    _, backend, held = world
    before = backend.snapshot()
    backend.calls.clear()
    with pytest.raises(TypeError, match=name):
        KEYED_CALLS[call](world[0], HELD_KEY, None, {name: 1})
    assert backend.calls == []
    assert backend.snapshot() == before
    assert held.state == "held"


@pytest.mark.parametrize("call", ["get", "force_release"])
@FAST
@given(key=bad_keys)
def test_bad_keys_for_inspection_and_admin_are_refused(world: Any, call: str, key: object) -> None:
    refused(world, lambda: getattr(world[0], call)(key))


@FAST
@given(prefix=not_a_str.filter(lambda value: not isinstance(value, str)))
def test_bad_list_prefix_is_refused(world: Any, prefix: object) -> None:
    refused(world, lambda: list(world[0].list(prefix)))


@FAST
@given(
    # None is not bad here: it means "as given to lock()"; -1 is threading's "wait for ever".
    blocking=not_a_bool.filter(lambda value: value is not None),
    timeout=st.one_of(st.floats(max_value=-0.001).filter(lambda value: value != -1), st.text(max_size=2)),
)
def test_bad_lock_acquire_arguments_are_refused(world: Any, blocking: object, timeout: object) -> None:
    lock = world[0].lock("fresh-key")
    refused(world, lambda: lock.acquire(blocking=blocking))
    refused(world, lambda: lock.acquire(timeout=timeout))
    assert lock.state == "unlocked"


@FAST
@given(ttl=bad_ttls)
def test_bad_extend_ttl_is_refused_and_the_lease_stays(world: Any, ttl: object) -> None:
    refused(world, lambda: world[2].extend(ttl))


@FAST
@given(
    setting=st.one_of(
        bad_ttls.map(lambda value: {"ttl": value}),
        bad_numbers.map(lambda value: {"max_hold": value}),
        not_a_bool.map(lambda value: {"fencing": value}),
        bad_keys.filter(lambda value: value != "").map(lambda value: {"key_prefix": value}),
        st.one_of(st.integers(), st.text(max_size=2)).map(lambda value: {"retry": value}),
        st.one_of(st.integers(), st.text(max_size=2)).map(lambda value: {"clock": value}),
        st.one_of(st.integers(), st.text(min_size=300, max_size=310)).map(lambda value: {"owner": value}),
    )
)
def test_bad_locker_settings_are_refused(world: Any, setting: dict[str, Any]) -> None:
    backend = world[1]
    refused(world, lambda: Locker(backend, **setting))
    refused(world, lambda: lease_lock.connect("memory://", **setting))


@FAST
@given(name=st.text(alphabet="xyz", min_size=1, max_size=8))
def test_unknown_connect_options_are_refused(world: Any, name: str) -> None:
    # connect() refuses an unknown option; Locker() itself raises Python's TypeError.
    refused(world, lambda: lease_lock.connect("memory://", **{name: 1}))


@FAST
@given(retries=st.one_of(st.integers(max_value=-1), st.floats(max_value=-0.5), st.text(max_size=2)))
def test_bad_retry_fields_are_refused(world: Any, retries: object) -> None:
    refused(world, lambda: Retry(retries=retries))  # type: ignore[arg-type]


# -- misuse ------------------------------------------------------------------------------------


def test_a_released_lock_cannot_be_used_again(world: Any) -> None:
    locker, backend, _ = world
    lock = locker.acquire("released-once")
    assert lock.release() is True
    backend.calls.clear()
    assert lock.release() is False
    with pytest.raises(LockStateError):
        lock.extend()
    with pytest.raises(LockStateError):
        lock.check()
    with pytest.raises(LockStateError):
        lock.acquire()
    with pytest.raises(LockStateError), lock:
        pass
    assert backend.calls == []
    assert lock.state == "released"


def test_a_lock_may_be_released_and_checked_from_another_thread(world: Any) -> None:
    locker = world[0]
    lock = locker.acquire("crosses-threads")
    outcome: dict[str, Any] = {}

    def elsewhere() -> None:
        lock.check()
        lock.extend(30)
        outcome["released"] = lock.release()

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join(10)
    assert outcome == {"released": True}
    assert lock.state == "released"
    assert not locker.get("crosses-threads").held


def test_one_lock_acquired_by_two_threads_at_once_is_refused(world: Any) -> None:
    locker = world[0]
    lock = locker.lock(HELD_KEY, timeout=5)  # contended: the first acquire waits
    errors: list[BaseException] = []
    first = threading.Thread(target=lambda: lock.acquire(timeout=2))
    first.start()
    try:
        # Wait until the first thread is inside its acquisition, then try a second one.
        deadline = threading.Event()
        while not lock._busy_acquiring and not deadline.wait(0.01):
            pass
        try:
            lock.acquire(blocking=False)
        except LockStateError as error:
            errors.append(error)
    finally:
        first.join(10)
    assert len(errors) == 1
    assert lock.state == "unlocked"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_never_extends_or_releases_the_parents_lock(tmp_path: Any) -> None:
    locker = lease_lock.connect(f"sqlite:///{tmp_path}/fork.db", ttl=5)
    try:
        lock = locker.acquire("forked")
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through the pipe
            try:
                answer = f"{lock.state},{lock.lost_reason},{lock.release()}"
                try:
                    lock.extend()
                except lease_lock.LockLostError as error:
                    answer += f",{error.reason}"
                os.write(write, answer.encode())
            finally:
                os._exit(0)
        os.close(write)
        _, status = os.waitpid(pid, 0)
        with os.fdopen(read) as pipe:
            assert pipe.read() == "lost,forked,False,forked"
        assert status == 0
        assert lock.state == "held"
        assert locker.get("forked").held
        assert lock.release() is True
    finally:
        locker.close()


def test_extend_requests_are_data_only() -> None:
    # The batch item is a plain value: nothing validates or writes on construction.
    assert ExtendRequest("k", "t" * 16, 1.0).ttl == 1.0
