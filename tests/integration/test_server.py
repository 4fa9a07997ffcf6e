"""The lock service over real HTTP: the wire format, credentials and scopes, projects, budgets,
bad input of every kind, and keys picked up without a restart."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, Optional

import pytest
import requests
from lease_lock import Locker
from lease_lock.backends.base import Backend, Capabilities, LockState
from lease_lock.backends.memory import MemoryBackend
from lease_lock.backends.service import ServiceStore
from lease_lock.errors import BackendUnavailableError, ValidationError
from lease_lock.server import create_app, create_key, openapi_document, revoke_key
from lease_lock.testing import wait_until

from tests.support.http_server import ServiceClient as Client
from tests.support.http_server import ServiceInfo, ThreadedServer, client_of, make_keys


@pytest.fixture
def alpha(lock_service: ServiceInfo) -> Iterator[Client]:
    with client_of(lock_service, "alpha", Client) as client:
        yield client


def _key() -> str:
    return f"srv.{uuid.uuid4().hex}"


def _error(response: requests.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["Content-Type"] == "application/json"
    body = response.json()
    assert body["code"] == code and isinstance(body["error"], str) and body["error"]


def _instant(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def test_wire_format_of_a_full_cycle(alpha: Client) -> None:
    key, token = _key(), str(uuid.uuid4())
    granted = alpha.acquire(key, token, 30, headers={"X-Volcano-Request-Id": str(uuid.uuid4())})
    assert granted.status_code == 201
    body = granted.json()
    assert set(body) == {"expires_at", "fencing_token"}
    assert type(body["fencing_token"]) is int and 0 < body["fencing_token"] < 2**53
    assert body["expires_at"].endswith("Z")
    read = alpha.call("GET", f"/locks/{key}")
    assert read.status_code == 200
    state = read.json()
    assert set(state) == {"held", "expires_at", "fencing_token", "limit", "holders"}
    assert state["held"] is True and state["fencing_token"] == body["fencing_token"]
    # The extension's fields: an exclusive lock admits one holder, the one the top level names.
    assert state["limit"] == 1 and [holder["fencing_token"] for holder in state["holders"]] == [body["fencing_token"]]
    # A read rebuilds the expiry from the lease left at that moment: the same instant as the
    # grant's, give or take the millisecond it may round across.
    assert abs(_instant(state["expires_at"]) - _instant(body["expires_at"])) <= 0.002
    renewed = alpha.call("PATCH", f"/locks/{key}/lease", token, json={"ttl_seconds": 60})
    assert renewed.status_code == 200 and renewed.json()["fencing_token"] == body["fencing_token"]
    released = alpha.call("DELETE", f"/locks/{key}/lease", token)
    assert released.status_code == 204 and released.content == b""
    assert released.headers["X-Lease-Lock-Released"] == "true"
    assert alpha.call("GET", f"/locks/{key}").json() == {"held": False}
    again = alpha.call("DELETE", f"/locks/{key}/lease", token)
    assert again.status_code == 204 and again.headers["X-Lease-Lock-Released"] == "false"
    forced = alpha.call("DELETE", f"/locks/{key}")
    assert forced.status_code == 204 and forced.headers["X-Lease-Lock-Released"] == "false"


def test_conflicts(alpha: Client) -> None:
    key, token, other = _key(), str(uuid.uuid4()), str(uuid.uuid4())
    assert alpha.acquire(key, token).status_code == 201
    _error(alpha.acquire(key, other), 409, "lock_held")
    _error(alpha.call("PATCH", f"/locks/{key}/lease", other, json={"ttl_seconds": 30}), 409, "lock_ownership_lost")
    _error(alpha.call("DELETE", f"/locks/{key}/lease", other), 409, "lock_ownership_lost")
    assert alpha.call("GET", f"/locks/{key}").json()["held"] is True
    _error(alpha.call("PATCH", f"/locks/{_key()}/lease", token, json={"ttl_seconds": 30}), 409, "lock_ownership_lost")


def test_tokens_compare_as_uuids_and_keys_are_percent_decoded(alpha: Client) -> None:
    token = uuid.uuid4()
    name = f"a:{uuid.uuid4().hex}"
    assert alpha.acquire(name.replace(":", "%3A"), str(token)).status_code == 201
    same = alpha.acquire(name, "{" + token.hex.upper() + "}")
    assert same.status_code == 201
    assert alpha.call("DELETE", f"/locks/{name}/lease", f"urn:uuid:{token}").headers["X-Lease-Lock-Released"] == "true"
    _error(alpha.acquire("a%2Fb", str(token)), 400, "invalid_key")
    _error(alpha.call("GET", "/locks/a%2Fb"), 400, "invalid_key")


def test_owner_extension_is_returned_by_reads(alpha: Client) -> None:
    key = _key()
    assert alpha.acquire(key, str(uuid.uuid4()), headers={"X-Lease-Lock-Owner": "host%3A42"}).status_code == 201
    state = alpha.call("GET", f"/locks/{key}")
    assert state.json()["owner"] == "host:42"
    assert 29 < float(state.headers["X-Lease-Lock-Expires-In"]) <= 31
    listed = alpha.call("GET", "/locks", params={"prefix": key}).json()["locks"]
    assert [item["key"] for item in listed] == [key] and listed[0]["owner"] == "host:42"
    _error(alpha.acquire(_key(), str(uuid.uuid4()), headers={"X-Lease-Lock-Owner": "x" * 300}), 400, "invalid_request")


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"ttl_seconds": 4}, "invalid_ttl"),
        ({"ttl_seconds": 7_776_001}, "invalid_ttl"),
        ({"ttl_seconds": "30"}, "invalid_ttl"),
        ({"ttl_seconds": 30.5}, "invalid_ttl"),
        ({"ttl_seconds": True}, "invalid_ttl"),
        ({}, "invalid_ttl"),
        ([30], "invalid_request"),
        ("not json", "invalid_request"),
        (None, "invalid_request"),
    ],
)
def test_bad_bodies_are_400(alpha: Client, body: Any, code: str) -> None:
    raw = body if isinstance(body, str) else json.dumps(body) if body is not None else ""
    response = alpha.call("POST", f"/locks/{_key()}/lease", str(uuid.uuid4()), data=raw)
    _error(response, 400, code)


@pytest.mark.parametrize(
    ("raw", "status", "code"),
    [
        # Bodies written as JSON allows, each read to the same TTL as the parser reads it.
        (b'{"ttl_seconds":30}', 201, None),
        (b' \r\n\t{ "ttl_seconds" :\n30 }\n', 201, None),
        (b'{"ttl_seconds": 30, "note": "x"}', 201, None),
        (b'{"ttl_seconds": 4, "ttl_seconds": 30}', 201, None),  # the last member wins
        (b'{"ttl_seconds": 30e0}', 400, "invalid_ttl"),  # a float, however whole
        (b'{"ttl_seconds": 4}', 400, "invalid_ttl"),
        (b'{"ttl_seconds": 1000000000000000000000}', 400, "invalid_ttl"),
        (b'{"ttl_seconds": 030}', 400, "invalid_request"),  # JSON has no leading zeros
        (b'{"ttl_seconds": -30}', 400, "invalid_ttl"),
        (b'\xef\xbb\xbf{"ttl_seconds": 30}', 400, "invalid_request"),  # a byte-order mark is no JSON
        (b'{"ttl_seconds": 30}\x0b', 400, "invalid_request"),  # nor is a vertical tab
        (b'{"ttl_seconds": 30', 400, "invalid_request"),
    ],
)
def test_raw_ttl_bodies(alpha: Client, raw: bytes, status: int, code: Optional[str]) -> None:
    response = alpha.call("POST", f"/locks/{_key()}/lease", str(uuid.uuid4()), data=raw)
    if code is not None:
        _error(response, status, code)
        return
    assert response.status_code == status, response.text
    assert 29 < _instant(response.json()["expires_at"]) - time.time() <= 31


@pytest.mark.parametrize(
    ("method", "path", "headers", "status", "code"),
    [
        ("POST", "/locks/k/lease", {}, 400, "invalid_token"),
        ("POST", "/locks/k/lease", {"X-Volcano-Lock-Token": "nope"}, 400, "invalid_token"),
        ("GET", "/locks/k", {"X-Volcano-Request-Id": "nope"}, 400, "invalid_request"),
        ("GET", "/locks/" + "k" * 129, {}, 400, "invalid_key"),
        ("GET", "/locks/%FF", {}, 400, "invalid_key"),
        ("GET", "/locks/k%20", {}, 400, "invalid_key"),
        ("PUT", "/locks/k", {}, 405, "method_not_allowed"),
        ("GET", "/locks/k/lease", {}, 405, "method_not_allowed"),
        ("POST", "/locks", {}, 405, "method_not_allowed"),
        ("GET", "/", {}, 404, "not_found"),
        ("GET", "/locks/k/other", {}, 404, "not_found"),
        ("GET", "/locks/k/lease/x", {}, 404, "not_found"),
        ("GET", "/locks?prefix=a/b", {}, 400, "invalid_key"),
    ],
)
def test_bad_requests_get_a_4xx_with_a_code(
    alpha: Client, method: str, path: str, headers: dict[str, str], status: int, code: str
) -> None:
    _error(alpha.call(method, path, headers=headers, json={"ttl_seconds": 30}), status, code)


def test_huge_body_is_413(alpha: Client) -> None:
    response = alpha.call("POST", f"/locks/{_key()}/lease", str(uuid.uuid4()), data=b"{" + b" " * 200_000 + b"}")
    _error(response, 413, "payload_too_large")


def test_credentials_and_scopes(lock_service: ServiceInfo) -> None:
    key = _key()
    clients = {name: Client(lock_service.url, value) for name, value in lock_service.keys.items()}
    nobody = Client(lock_service.url, None)
    try:
        _error(nobody.call("GET", f"/locks/{key}"), 401, "unauthorized")
        apikey_only = nobody.call("GET", f"/locks/{key}", headers={"apikey": lock_service.keys["alpha"]})
        _error(apikey_only, 401, "unauthorized")
        _error(
            Client(lock_service.url, "llk_0123456789ab." + "x" * 43).call("GET", f"/locks/{key}"), 401, "unauthorized"
        )
        basic = nobody.call("GET", f"/locks/{key}", headers={"Authorization": f"Basic {lock_service.keys['alpha']}"})
        _error(basic, 401, "unauthorized")
        reader = clients["alpha_read"]
        assert reader.call("GET", f"/locks/{key}").status_code == 200
        assert reader.call("GET", "/locks").status_code == 200
        _error(reader.acquire(key, str(uuid.uuid4())), 403, "forbidden")
        _error(reader.call("DELETE", f"/locks/{key}"), 403, "forbidden")
        token = str(uuid.uuid4())
        assert clients["alpha_full"].acquire(key, token).status_code == 201
        # Same project, another manage key: sees the lock held and may release it with the token.
        assert clients["alpha"].call("GET", f"/locks/{key}").json()["held"] is True
        assert clients["alpha"].call("DELETE", f"/locks/{key}/lease", token).status_code == 204
    finally:
        for client in (*clients.values(), nobody):
            client.session.close()


def test_projects_are_isolated(lock_service: ServiceInfo) -> None:
    alpha = Client(lock_service.url, lock_service.keys["alpha"])
    beta = Client(lock_service.url, lock_service.keys["beta"])
    try:
        key = _key()
        assert alpha.acquire(key, str(uuid.uuid4())).status_code == 201
        assert beta.call("GET", f"/locks/{key}").json() == {"held": False}
        assert beta.acquire(key, str(uuid.uuid4())).status_code == 201
        assert beta.call("DELETE", f"/locks/{key}").headers["X-Lease-Lock-Released"] == "true"
        assert alpha.call("GET", f"/locks/{key}").json()["held"] is True
        assert [item["key"] for item in beta.call("GET", "/locks", params={"prefix": key}).json()["locks"]] == []
    finally:
        alpha.session.close()
        beta.session.close()


def test_keys_are_picked_up_and_revoked_without_restart(lock_service: ServiceInfo) -> None:
    record, new_key = create_key(lock_service.keys_file, "gamma", "locks.manage")
    client = Client(lock_service.url, new_key)
    try:
        assert wait_until(lambda: client.call("GET", "/locks/k").status_code == 200, 10)
        assert revoke_key(lock_service.keys_file, record.id)
        assert wait_until(lambda: client.call("GET", "/locks/k").status_code == 401, 10)
    finally:
        client.session.close()


@pytest.fixture
def limited(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    keys_file = tmp_path / "keys.toml"
    keys = make_keys(keys_file)
    with ThreadedServer(create_app(MemoryBackend(), keys_file, rate_limit=5, rate_window=2.0)) as server:
        yield server.url, keys


def test_rate_limit_per_project_and_recovery(limited: tuple[str, dict[str, str]]) -> None:
    url, keys = limited
    alpha, alpha_full, beta = (Client(url, keys[name]) for name in ("alpha", "alpha_full", "beta"))
    try:
        # Every request counts, rejected ones too, and both keys of the project share one budget.
        def spend() -> requests.Response:
            alpha_full.call("GET", "/locks/%2F")
            return alpha.call("GET", "/locks/k")

        assert wait_until(lambda: spend().status_code == 429, 10)
        refused = alpha.call("GET", "/locks/k")
        _error(refused, 429, "lock_rate_limited")
        assert refused.headers["Retry-After"] in ("1", "2")
        assert beta.call("GET", "/locks/k").status_code == 200
        assert wait_until(lambda: alpha.call("GET", "/locks/k").status_code == 200, 10)
    finally:
        for client in (alpha, alpha_full, beta):
            client.session.close()


class _UnreachableStore(MemoryBackend):
    """A store whose lock calls fail as a backend does when its server refuses connections."""

    def inspect(self, key: str) -> Any:
        try:
            raise ConnectionRefusedError(111, "Connection refused")
        except ConnectionRefusedError as exc:
            raise BackendUnavailableError("memory store unreachable (test)", backend="memory") from exc

    def grant_if_free(self, key: str, token: str, ttl: float, owner: str) -> Any:
        return self.inspect(key)


def test_unreachable_store_fails_closed_and_logs_the_cause(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    keys_file = tmp_path / "keys.toml"
    keys = make_keys(keys_file)
    with ThreadedServer(create_app(_UnreachableStore(), keys_file)) as server:
        client = Client(server.url, keys["alpha"])
        try:
            _error(client.call("GET", "/locks/k"), 503, "unavailable")
            _error(client.acquire("k", str(uuid.uuid4())), 503, "unavailable")
        finally:
            client.session.close()
    [record, *_] = [r for r in caplog.records if r.getMessage() == "lock store unavailable"]
    assert record.exc_info is not None and isinstance(record.exc_info[1], BackendUnavailableError)


class _BuggyStore(MemoryBackend):
    """A store whose reads fail with an error that is not about reaching it."""

    def inspect(self, key: str) -> Any:
        raise RuntimeError("secret-detail of a bug")


def test_a_store_bug_is_a_500_that_says_nothing(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.toml"
    keys = make_keys(keys_file)
    with ThreadedServer(create_app(_BuggyStore(), keys_file)) as server:
        client = Client(server.url, keys["alpha"])
        try:
            answer = client.call("GET", "/locks/k")
            _error(answer, 500, "internal")
            assert "secret-detail" not in answer.text
            assert client.call("GET", "/locks").status_code == 200  # the server goes on
        finally:
            client.session.close()


def test_create_app_checks_its_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="does not exist"):
        create_app("memory://", tmp_path / "missing.toml")
    make_keys(tmp_path / "keys.toml")
    with pytest.raises(ValidationError, match="rate_limit"):
        create_app("memory://", tmp_path / "keys.toml", rate_limit=0)


class _LocksOnly(Backend):
    """A backend that implements the lock calls and nothing of the optional service interface."""

    capabilities = Capabilities(
        server_clock=False,
        fencing=True,
        release_notify=False,
        replica_wait=False,
        scan=False,
        batch_extend=False,
        min_ttl=0.0,
        clock="this process's monotonic clock",
    )

    def __init__(self) -> None:
        self.inner = MemoryBackend()
        self.closed = False

    def acquire(self, key: str, token: str, ttl: float, owner: str) -> bool:
        return self.inner.acquire(key, token, ttl, owner)

    def acquire_fenced(self, key: str, token: str, ttl: float, owner: str) -> Optional[int]:
        return self.inner.acquire_fenced(key, token, ttl, owner)

    def release(self, key: str, token: str) -> bool:
        return self.inner.release(key, token)

    def extend(self, key: str, token: str, ttl: float) -> bool:
        return self.inner.extend(key, token, ttl)

    def is_held(self, key: str, token: str) -> bool:
        return self.inner.is_held(key, token)

    def inspect(self, key: str) -> LockState:
        return self.inner.inspect(key)

    def force_release(self, key: str) -> bool:
        return self.inner.force_release(key)

    def close(self) -> None:
        self.closed = True


def test_create_app_refuses_a_store_without_the_service_interface(tmp_path: Path) -> None:
    make_keys(tmp_path / "keys.toml")
    store = _LocksOnly()
    assert not isinstance(store, ServiceStore)
    with pytest.raises(ValidationError, match="ServiceStore"):
        create_app(store, tmp_path / "keys.toml")
    assert not store.closed  # the caller's object stays the caller's to close
    # The same backend is a complete lock backend for a Locker, request ids included.
    with Locker(store, ttl=30) as locker, locker.lock("job", request_id=str(uuid.uuid4())) as lock:
        assert lock.is_held()


def test_serve_refuses_a_store_without_the_service_interface(tmp_path: Path) -> None:
    make_keys(tmp_path / "keys.toml")
    result = subprocess.run(
        [sys.executable, "-m", "lease_lock", "serve", "--url", "http://127.0.0.1:9/",
         "--keys", str(tmp_path / "keys.toml"), "--bind", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "LEASE_LOCK_API_KEY": "any-key"},
    )
    assert result.returncode != 0
    assert "ServiceStore" in result.stderr


def test_openapi_document_describes_the_routes_and_marks_extensions() -> None:
    document = openapi_document()
    assert document["openapi"].startswith("3.")
    paths = document["paths"]
    assert set(paths["/locks/{key}/lease"]) >= {"post", "patch", "delete"}
    assert set(paths["/locks/{key}"]) >= {"get", "delete"}
    assert paths["/locks"]["x-lease-lock-extension"] is True
    owner = [p for p in paths["/locks/{key}/lease"]["post"]["parameters"] if p.get("name") == "X-Lease-Lock-Owner"]
    assert owner and owner[0]["x-lease-lock-extension"] is True
