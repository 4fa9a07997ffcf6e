"""The names of the structures the Redis backend keeps beside each key.

No two lock keys may share a structure (a fence counter, a waiting marker, a wake list, a line
or its entries), and no lock key may be another key's structure: otherwise a release of one key
hands it to a thread waiting for the other, and both threads hold a lock. Every structure must
also share its key's Cluster hash slot, since one Lua script touches them together. The naming
rule is checked here over generated keys heavy in braces, colons and slashes, over the
look-alike keys that broke an earlier rule, and end to end on a real Redis.
"""

from __future__ import annotations

import itertools
import threading
import uuid
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from lease_lock import Locker
from lease_lock.admin import held_locks, release_prefix
from lease_lock.backends.redis import (
    RedisBackend,
    fence_key,
    handoff_keys,
    hash_tag,
    line_keys,
    store_structure,
)
from lease_lock.testing import wait_until
from redis.crc import key_slot

from tests.support.redis_server import RedisServer

#: Keys that look like one another or like a structure of another key.
LOOK_ALIKES = [
    "x", "{x}", "{x}:line", "{x}/line", "x:line", "{{x}}", "{x}:", "a{b}c", "{}", "}", "{", "{}x}",
    "x}", "{x", "a:b", "{a:b}", "{a}:b", "{}/fence", "{x}:fence:fence", "{x}/fence/fence", ":", "/",
]

# Keys built from the pieces a collision needs: braces, the separators and structure names.
_PIECES = st.sampled_from(["{", "}", ":", "/", "x", "y", "fence", "line", "wake", "waiting", "entries", "é"])
_KEYS = st.lists(_PIECES, min_size=1, max_size=8).map("".join)


def _structures(key: str) -> list[str]:
    return [fence_key(key), *handoff_keys(key), *line_keys(key)]


def _usable(key: str) -> bool:
    """Whether the backend accepts ``key`` as a lock key on a standalone server."""
    return store_structure(key) is None


def _check_pair(first: str, second: str) -> None:
    if first == second:
        return
    mine, theirs = _structures(first), _structures(second)
    assert len(set(mine)) == len(mine), first
    assert not set(mine) & set(theirs), (first, second)
    # Every structure name is refused as a lock key, so no usable key is another's structure.
    assert all(store_structure(name) is not None for name in mine + theirs)
    if _usable(first):
        assert first not in theirs, (first, second)
    if _usable(second):
        assert second not in mine, (first, second)


@given(_KEYS, _KEYS)
@settings(max_examples=3000, deadline=None)
@example("x", "{x}")
@example("{x}:line", "{x}")
@example("a{b}c", "{a{b}c}")
def test_no_two_keys_share_a_structure_name(first: str, second: str) -> None:
    _check_pair(first, second)


@pytest.mark.parametrize(("first", "second"), list(itertools.combinations(LOOK_ALIKES, 2)))
def test_look_alike_keys_share_no_structure_name(first: str, second: str) -> None:
    _check_pair(first, second)


@given(_KEYS)
@settings(max_examples=2000, deadline=None)
@example("{")
@example("a{b")
@example("{x}:line")
def test_every_structure_shares_its_keys_hash_slot(key: str) -> None:
    # A key without a hash tag that contains "}" cannot have a structure in its slot: a Cluster
    # refuses it (see test_redis_cluster); every other key's structures share its slot.
    if hash_tag(key) is None and "}" in key:
        return
    slot = key_slot(key.encode())
    assert [key_slot(name.encode()) for name in _structures(key)] == [slot] * 5, key


def test_the_names_of_a_key_with_and_without_a_hash_tag() -> None:
    assert _structures("{orders}:42") == [
        "{orders}:42:fence", "{orders}:42:waiting", "{orders}:42:wake", "{orders}:42:line", "{orders}:42:entries",
    ]
    assert _structures("order:42") == [
        "{order:42}/fence", "{order:42}/waiting", "{order:42}/wake", "{order:42}/line", "{order:42}/entries",
    ]


def test_a_release_of_a_key_never_hands_a_look_alike_key_to_its_waiter(redis_server: RedisServer) -> None:
    # A holds "{x}", W waits for "{x}" in its line, B takes and releases "x". The release of "x"
    # must leave "x" free and W in line: W gets "{x}" once A releases it, with a larger fence.
    base = f"names-{uuid.uuid4().hex}"
    plain, tagged = base, "{" + base + "}"
    lockers = [
        Locker(RedisBackend.from_url(redis_server.url), ttl=30, fencing=True, owner=owner, owns_backend=True)
        for owner in ("first", "waiter", "second")
    ]
    first, waiter, second = lockers
    client = first.backend.client
    got: list[Any] = []
    a_released = threading.Event()

    def wait_for_tagged() -> None:
        lock = waiter.acquire(tagged, timeout=60)
        got.append((lock, a_released.is_set()))

    try:
        held = first.acquire(tagged)
        thread = threading.Thread(target=wait_for_tagged, daemon=True)
        thread.start()
        assert wait_until(lambda: client.llen(line_keys(tagged)[0]) == 1, 30)
        other = second.acquire(plain)
        other.release()
        # The release of "x" went to nobody: "x" is free, and W still waits for "{x}".
        assert not second.backend.inspect(plain).held
        assert client.llen(line_keys(tagged)[0]) == 1
        assert thread.is_alive()
        a_released.set()
        held.release()
        thread.join(60)
        [(lock, after_release)] = got
        assert after_release
        assert lock.fence is not None and held.fence is not None and lock.fence > held.fence
        assert first.backend.inspect(tagged).owner == waiter.owner
        lock.release()
    finally:
        for locker in lockers:
            locker.close()


def test_listing_and_prefix_release_see_only_lock_keys_under_nested_prefixes(redis_server: RedisServer) -> None:
    # Two namespaces, one inside the other, each with keys with and without a hash tag, fenced
    # (fence counters exist) and waited for in line (lines and their entries exist). A listing
    # of either prefix, what `lease-lock ls` shows, and a prefix release deal in lock keys only.
    outer_prefix = f"ls-{uuid.uuid4().hex[:8]}:"
    inner_prefix = outer_prefix + "eu:"
    names = ["a", "{t}:b", "c:line", "{t}", "d/fence"]

    def locker(prefix: str, owner: str) -> Locker:
        return Locker(
            RedisBackend.from_url(redis_server.url), ttl=30, fencing=True, key_prefix=prefix, owner=owner,
            owns_backend=True,
        )

    outer, inner, admin = locker(outer_prefix, "outer"), locker(inner_prefix, "inner"), locker("", "admin")
    waiters = [locker(outer_prefix, "w-outer"), locker(inner_prefix, "w-inner")]
    client = admin.backend.client
    got: list[Any] = []
    try:
        held = [outer.acquire(name) for name in names] + [inner.acquire(name) for name in names]
        threads = [
            threading.Thread(target=lambda w=waiter, n=name: got.append(w.acquire(n, timeout=60)), daemon=True)
            for waiter, name in zip(waiters, ["{t}:b", "a"])
        ]
        for thread in threads:
            thread.start()
        assert wait_until(
            lambda: client.llen(line_keys(outer_prefix + "{t}:b")[0]) == 1
            and client.llen(line_keys(inner_prefix + "a")[0]) == 1,
            30,
        )
        inner_keys = sorted(inner_prefix + name for name in names)
        every_key = sorted([outer_prefix + name for name in names] + inner_keys)
        assert [state.key for state in outer.list()] == every_key
        assert [state.key for state in inner.list()] == inner_keys
        assert [state.key for state in held_locks(outer)] == sorted(key[len(outer_prefix):] for key in every_key)
        assert [state.key for state in held_locks(admin, inner_prefix)] == inner_keys
        assert all(state.held and state.fence for state in admin.list(outer_prefix))
        structures = [name for key in every_key for name in _structures(key) if client.exists(name)]
        assert structures  # counters and lines exist, and are listed as nothing
        assert release_prefix(admin, inner_prefix, confirm=None, write=lambda _line: None) == len(names)
        assert all(client.exists(name) for name in structures if not name.endswith(("line", "entries")))
        assert all(admin.get(outer_prefix + name).held for name in names)
        threads[1].join(60)
        assert [lock.key for lock in got] == [inner_prefix + "a"]  # the inner waiter was handed it
        for lock in held[: len(names)]:
            lock.release()
        threads[0].join(60)
        assert [lock.key for lock in got] == [inner_prefix + "a", outer_prefix + "{t}:b"]
        for lock in got:
            lock.release()
        assert not list(admin.list(outer_prefix))
    finally:
        for made in [outer, inner, admin, *waiters]:
            made.close()


def test_a_counting_key_and_its_look_alikes_keep_apart(redis_server: RedisServer) -> None:
    # A counting key's places are a hash under its own name, its fence counter and waiting
    # marker the usual structures: neither its places nor its structures are read for a
    # look-alike key, and a listing shows lock keys only (a waiting marker is a hash as well).
    base = f"count-{uuid.uuid4().hex}"
    counting, tagged, plain_look_alike = base, "{" + base + "}", base + ":fence"
    backend = RedisBackend.from_url(redis_server.url)
    client = backend.client
    tokens = [backend.new_token() for _ in range(3)]
    try:
        places = [backend.acquire_counted(counting, token, 30, "place", 2) for token in tokens[:2]]
        assert all(places) and client.type(counting) == b"hash"
        # The look-alikes are free and grant as what they are: no limit of the counting key.
        assert not backend.inspect(tagged).held and not backend.inspect(plain_look_alike).held
        exclusive = backend.acquire_fenced(tagged, tokens[2], 30, "exclusive")
        assert exclusive is not None and exclusive > max(fence or 0 for fence in places)
        assert backend.acquire_counted(plain_look_alike, tokens[0], 30, "other", 3) is not None
        assert client.get(fence_key(tagged)) != client.get(fence_key(counting))
        # A waiter for the counting key puts up its marker (a hash beside the key).
        with Locker(RedisBackend.from_url(redis_server.url), ttl=30, limit=2, owns_backend=True) as waiter:
            thread = threading.Thread(target=lambda: waiter.acquire(counting, timeout=60).release(), daemon=True)
            thread.start()
            assert wait_until(lambda: client.exists(handoff_keys(counting)[0]) == 1, 30)
            listed = {state.key: (state.limit, len(state.holders)) for state in backend.scan(base)}
            assert listed == {counting: (2, 2), plain_look_alike: (3, 1)}
            listed_tagged = {state.key: state.limit for state in backend.scan("{" + base)}
            assert listed_tagged == {tagged: 1}
            # A place's release wakes the counting key's waiter and touches no look-alike.
            assert backend.release(counting, tokens[1])
            thread.join(60)
            assert not thread.is_alive()
        assert backend.is_held(tagged, tokens[2]) and backend.inspect(tagged).limit == 1
        assert backend.is_held(plain_look_alike, tokens[0])
        assert backend.force_release(counting)
        assert backend.inspect(plain_look_alike).limit == 3 and backend.inspect(tagged).held
    finally:
        for name in (counting, tagged, plain_look_alike):
            backend.force_release(name)
        backend.close()
