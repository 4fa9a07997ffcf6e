"""The Redis backend on a real 3-node Redis Cluster started by the tests."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from lease_lock.backends import backend_from_url
from lease_lock.backends.redis import RedisBackend, fence_key, handoff_keys, line_keys
from lease_lock.errors import ValidationError
from lease_lock.locker import Locker
from lease_lock.testing import BackendContract

from tests.support.redis_server import RedisClusterNodes, RedisFactory


@pytest.fixture(scope="module")
def cluster(redis_factory: RedisFactory) -> RedisClusterNodes:
    return redis_factory.cluster(3)


@pytest.fixture
def cluster_client(cluster: RedisClusterNodes) -> Iterator[Any]:
    client = cluster.client()
    yield client
    client.close()


class TestRedisClusterBackend(BackendContract):
    @pytest.fixture
    def backend(self, cluster: RedisClusterNodes) -> Iterator[RedisBackend]:
        backend = RedisBackend.from_url(cluster.url, cluster=True)
        yield backend
        backend.close()


def test_fences_across_slots(cluster_client: Any) -> None:
    backend = RedisBackend(cluster_client)
    keys = [f"slot-{index}:{uuid.uuid4().hex}" for index in range(24)]
    slots = {cluster_client.keyslot(name) for name in keys}
    nodes = {cluster_client.get_node_from_key(name).name for name in keys}
    assert len(slots) > 1 and len(nodes) == 3
    for name in keys:
        # The counter shares its key's slot, so the grant script never crosses slots.
        assert cluster_client.keyslot(fence_key(name)) == cluster_client.keyslot(name)
        node = cluster_client.get_node_from_key(name)
        seconds, micros = cluster_client.time(target_nodes=node)
        first = backend.acquire_fenced(name, "a" * 32, 30, "o")
        assert first is not None and first >= seconds * 1_000_000 + micros
        assert backend.force_release(name)
        second = backend.acquire_fenced(name, "b" * 32, 30, "o")
        assert second is not None and second > first
        assert backend.inspect(name).fence == second


def test_a_counting_keys_places_and_structures_share_its_slot(cluster_client: Any) -> None:
    # The places are a hash under the key's own name; its fence counter, waiting marker, wake
    # list and line are the exclusive key's structures: one slot, so every script runs there.
    backend = RedisBackend(cluster_client)
    # Keys on every node of the cluster (random names: drawn until each node has one).
    keys, nodes = [f"{{jobs}}:{uuid.uuid4().hex}"], set()
    while len(nodes) < 3 and len(keys) < 200:
        keys.append(f"count-{len(keys)}:{uuid.uuid4().hex}")
        nodes.add(cluster_client.get_node_from_key(keys[-1]).name)
    assert len(nodes) == 3
    for name in keys:
        slot = cluster_client.keyslot(name)
        structures = [fence_key(name), *handoff_keys(name), *line_keys(name)]
        assert [cluster_client.keyslot(structure) for structure in structures] == [slot] * 5
        tokens = ["a" * 32, "b" * 32]
        fences = [backend.acquire_counted(name, token, 30, "o", 2) for token in tokens]
        assert all(fences) and backend.acquire_counted(name, "c" * 32, 30, "o", 2) is None
        assert cluster_client.type(name) == b"hash"
        assert int(cluster_client.get(fence_key(name))) == max(fence or 0 for fence in fences)
        state = backend.inspect(name)
        assert state.limit == 2 and [holder.fence for holder in state.holders] == fences
        assert backend.extend(name, tokens[0], 60) and backend.is_held(name, tokens[0])
        assert backend.release(name, tokens[1]) and not backend.is_held(name, tokens[1])
        assert backend.force_release(name) and not cluster_client.exists(name)


def test_hash_tagged_keys_share_a_slot(cluster_client: Any) -> None:
    backend = RedisBackend(cluster_client)
    name = f"{{orders}}:{uuid.uuid4().hex}"
    assert fence_key(name) == f"{name}:fence"
    assert backend.acquire_fenced(name, "a" * 32, 30, "o") is not None
    assert cluster_client.keyslot(fence_key(name)) == cluster_client.keyslot("orders")


@pytest.mark.parametrize("name", ["a}b", "x{}y}z", "{}}"])
def test_brace_without_hash_tag_is_refused(cluster_client: Any, name: str) -> None:
    backend = RedisBackend(cluster_client)
    with pytest.raises(ValidationError, match="hash tag"):
        backend.check_key(name)
    with pytest.raises(ValidationError, match="hash tag"):
        backend.acquire_fenced(name, "a" * 32, 30, "o")
    locker = Locker(backend, fencing=True)
    with pytest.raises(ValidationError, match=r"\{orders\}"):
        locker.acquire(name)
    # Nothing was written by the refused calls.
    assert not backend.inspect(name).held


def test_brace_without_hash_tag_is_fine_standalone(redis_server: Any) -> None:
    client = redis_server.client()
    backend = RedisBackend(client)
    name = f"a}}b:{uuid.uuid4().hex}"
    backend.check_key(name)
    assert backend.acquire_fenced(name, "a" * 32, 30, "o") is not None
    assert backend.release(name, "a" * 32)
    client.close()


def test_wait_for_replicas_refused_on_cluster(
    cluster: RedisClusterNodes, cluster_client: Any
) -> None:
    with pytest.raises(ValidationError, match="RedisCluster"):
        RedisBackend(cluster_client, wait_for_replicas=(1, 1.0))
    with pytest.raises(ValidationError, match="RedisCluster"):
        backend_from_url(f"{cluster.url}?cluster=true&wait_for_replicas=1,1s")


def test_refuses_cluster_pipeline(cluster_client: Any) -> None:
    with pytest.raises(ValidationError, match="not a pipeline"):
        RedisBackend(cluster_client.pipeline())


def test_locker_on_cluster(cluster: RedisClusterNodes) -> None:
    locker = Locker(RedisBackend.from_url(cluster.url, cluster=True), fencing=True)
    try:
        names = [f"{{job}}:{index}" for index in range(3)] + ["plain:1", "plain:2"]
        with locker.acquire_many(names) as held:
            assert all(lock.fence is not None for lock in held.locks)
            assert {state.key for state in locker.list("")} >= set(names)
    finally:
        locker.close()
