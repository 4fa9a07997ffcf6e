"""Interoperability: the official ``volcano-sdk-python`` lock client against ``serve``, on the
same project and keys as our own HTTP backend."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from lease_lock.backends.http import HttpBackend
from lease_lock.backends.memory import MemoryBackend
from lease_lock.server import create_app

from tests.support.http_server import ServiceInfo, ThreadedServer, make_keys

# Only an interpreter too old for the SDK skips; on 3.11 and later a missing SDK fails the import.
if sys.version_info < (3, 11):
    pytest.skip("volcano-sdk-python publishes only for Python 3.11 and later", allow_module_level=True)

from volcano_sdk import VolcanoClient
from volcano_sdk.errors import ConflictError, RateLimitedError, ValidationError


@pytest.fixture
def sdk(lock_service: ServiceInfo) -> Any:
    return VolcanoClient(anon_key="anon", api_url=lock_service.url, service_key=lock_service.keys["alpha"]).locks


@pytest.fixture
def ours(lock_service: ServiceInfo) -> Iterator[HttpBackend]:
    backend = HttpBackend(lock_service.url, lock_service.keys["alpha_full"])
    yield backend
    backend.close()


def _key() -> str:
    return f"sdk:{uuid.uuid4().hex}"


def test_sdk_cycle_seen_by_our_client(sdk: Any, ours: HttpBackend) -> None:
    key = _key()
    lease = sdk.acquire(key, ttl=10)
    assert lease.fencing_token > 0
    state = sdk.get(key)
    assert state.held and state.fencing_token == lease.fencing_token
    assert abs((state.expires_at - lease.expires_at).total_seconds()) < 0.01
    seen = ours.inspect(key)
    assert seen.held and seen.fence == lease.fencing_token
    assert ours.acquire_fenced(key, ours.new_token(), 10, "ours") is None
    renewed = sdk.renew(key, lease, ttl=20)
    assert renewed.fencing_token == lease.fencing_token and renewed.expires_at > lease.expires_at
    # The SDK's repeat with its own token is idempotent, as documented.
    assert sdk.acquire(key, ttl=10, token=lease.token).fencing_token == lease.fencing_token
    sdk.release(key, lease)
    assert sdk.get(key).held is False and not ours.inspect(key).held


def test_our_grant_seen_by_the_sdk(sdk: Any, ours: HttpBackend) -> None:
    key = _key()
    token = ours.new_token()
    fence = ours.acquire_fenced(key, token, 30, "ours")
    state = sdk.get(key)
    assert state.held and state.fencing_token == fence
    with pytest.raises(ConflictError) as held:
        sdk.acquire(key, ttl=10)
    assert held.value.code == "lock_held" and held.value.status == 409
    sdk.force_release(key)
    assert not ours.is_held(key, token)
    lease = sdk.acquire(key, ttl=10)
    assert lease.fencing_token > fence
    sdk.release(key, lease)


def test_sdk_with_lock_renews_and_releases(sdk: Any, ours: HttpBackend) -> None:
    key = _key()
    with sdk.with_lock(key, ttl=5) as guard:
        assert ours.inspect(key).fence == guard.lease.fencing_token
    assert not ours.inspect(key).held


def test_sdk_sees_our_error_codes(sdk: Any, lock_service: ServiceInfo) -> None:
    key = _key()
    with pytest.raises(ValidationError) as invalid:
        sdk.acquire("bad/key", ttl=10)
    assert invalid.value.code == "invalid_key"
    lease = sdk.acquire(key, ttl=10)
    stranger = VolcanoClient(anon_key="anon", api_url=lock_service.url, service_key=lock_service.keys["alpha_full"])
    with pytest.raises(ConflictError) as lost:
        stranger.locks.release(
            key, type(lease)(key=key, token=str(uuid.uuid4()), expires_at=lease.expires_at, fencing_token=1)
        )
    assert lost.value.code == "lock_ownership_lost"
    sdk.release(key, lease)


def test_sdk_reads_the_rate_limit(tmp_path: Any) -> None:
    keys = make_keys(tmp_path / "keys.toml")
    with ThreadedServer(create_app(MemoryBackend(), tmp_path / "keys.toml", rate_limit=2, rate_window=3600)) as server:
        locks = VolcanoClient(anon_key="anon", api_url=server.url, service_key=keys["beta"]).locks
        locks.get("k")
        locks.get("k")
        with pytest.raises(RateLimitedError) as limited:
            locks.get("k")
        assert limited.value.code == "lock_rate_limited" and 1 <= limited.value.retry_after <= 3600
