"""The HTTP client backend: the whole contract through a real ``serve`` child, and the client's
own rules (wire TTLs, UUIDs, error mapping, the fence kept from the grant)."""

from __future__ import annotations

import urllib.parse
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import lease_lock
import pytest
import requests
from lease_lock.backends import backend_from_url
from lease_lock.backends.http import HttpBackend
from lease_lock.errors import AccessDeniedError, BackendUnavailableError, ValidationError
from lease_lock.testing import BackendContract

from tests.support.http_server import ServiceInfo
from tests.support.ports import free_port


class TestHttpBackend(BackendContract):
    @pytest.fixture
    def backend(self, lock_service: ServiceInfo) -> Iterator[HttpBackend]:
        backend = HttpBackend(lock_service.url, lock_service.keys["alpha"])
        yield backend
        backend.close()


@pytest.fixture
def client(lock_service: ServiceInfo) -> Iterator[HttpBackend]:
    backend = HttpBackend(lock_service.url, lock_service.keys["alpha"])
    yield backend
    backend.close()


def _key() -> str:
    return f"http:{uuid.uuid4().hex}"


def test_wire_ttl_rounds_up_to_whole_seconds_of_at_least_five() -> None:
    assert HttpBackend.wire_ttl(0.2) == 5
    assert HttpBackend.wire_ttl(5.0) == 5
    assert HttpBackend.wire_ttl(5.01) == 6
    assert HttpBackend.wire_ttl(7_776_000) == 7_776_000
    with pytest.raises(ValidationError, match="90 days"):
        HttpBackend.wire_ttl(7_776_000.5)


def test_short_ttl_gets_the_service_minimum(client: HttpBackend) -> None:
    key = _key()
    token = client.new_token()
    assert client.acquire(key, token, 0.5, "o")
    state = client.inspect(key)
    # Five seconds, measured by the server, and the same moment expires_at names.
    assert state.expires_in is not None and 3.5 < state.expires_in <= 5.0
    assert state.expires_at is not None
    until_expiry = (state.expires_at - datetime.now(timezone.utc)).total_seconds()
    assert abs(until_expiry - state.expires_in) < 0.5


def test_tokens_and_keys_follow_the_wire_rules(client: HttpBackend) -> None:
    assert uuid.UUID(client.new_token())
    client.check_token(str(uuid.uuid4()).upper())
    with pytest.raises(ValidationError, match="UUID"):
        client.check_token("a" * 32 + "zz")
    with pytest.raises(ValidationError, match="128"):
        client.check_key("k" * 129)
    with pytest.raises(ValidationError):
        client.check_key("a/b")
    with pytest.raises(ValidationError, match="UUID"):
        client.request_id_scope("not-a-uuid")


def test_connect_builds_a_locker_with_the_key_from_options_or_env(
    lock_service: ServiceInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LEASE_LOCK_API_KEY", raising=False)
    with pytest.raises(ValidationError, match="api_key"):
        backend_from_url(lock_service.url)
    monkeypatch.setenv("LEASE_LOCK_API_KEY", lock_service.keys["alpha"])
    backend = backend_from_url(f"{lock_service.url}?timeout=5")
    assert isinstance(backend, HttpBackend) and backend.timeout == 5.0
    backend.close()
    with pytest.raises(ValidationError, match="unknown http"):
        backend_from_url(lock_service.url, table="x")
    locker = lease_lock.connect(lock_service.url, api_key=lock_service.keys["alpha"], fencing=True)
    try:
        key = _key()
        with locker.lock(key, ttl=6) as lock:
            assert lock.fence is not None and lock.fence >= 1
            state = locker.get(key)
            assert state.held and state.fence == lock.fence
            assert lock.is_held()
        assert not locker.get(key).held
    finally:
        locker.close()


def test_bad_base_url_or_key_is_a_validation_error() -> None:
    with pytest.raises(ValidationError, match="base_url"):
        HttpBackend("ftp://example.com", "k")
    with pytest.raises(ValidationError, match="api_key"):
        HttpBackend("http://127.0.0.1:1", "")
    with pytest.raises(ValidationError, match="api_key"):
        HttpBackend("http://127.0.0.1:1", "key\r\nX-Evil: 1")


def test_is_held_compares_the_grant_fence(lock_service: ServiceInfo, client: HttpBackend) -> None:
    key = _key()
    token = client.new_token()
    assert client.acquire_fenced(key, token, 30, "o") is not None
    # Another client object never saw the grant: it cannot vouch for the token.
    other = HttpBackend(lock_service.url, lock_service.keys["alpha"])
    try:
        assert other.is_held(key, token) is False
        assert client.is_held(key, token) is True
        assert other.force_release(key) is True
        replacement = other.new_token()
        assert other.acquire_fenced(key, replacement, 30, "o") is not None
        # Held again, but with a later fence: not the grant this client got.
        assert client.is_held(key, token) is False
    finally:
        other.close()


def test_owner_label_survives_any_printable_text(client: HttpBackend) -> None:
    key = _key()
    owner = "wörker 7 | host:1 %41/é"
    assert client.acquire(key, client.new_token(), 30, owner)
    assert client.inspect(key).owner == owner
    assert [state.owner for state in client.scan(key)] == [owner]


def test_access_errors_map_to_access_denied(lock_service: ServiceInfo) -> None:
    unknown = HttpBackend(lock_service.url, "llk_000000000000." + "A" * 43)
    reader = HttpBackend(lock_service.url, lock_service.keys["alpha_read"])
    try:
        with pytest.raises(AccessDeniedError) as denied:
            unknown.inspect(_key())
        assert denied.value.status == 401
        assert reader.inspect(_key()).held is False
        with pytest.raises(AccessDeniedError) as forbidden:
            reader.acquire(_key(), reader.new_token(), 10, "o")
        assert forbidden.value.status == 403
    finally:
        unknown.close()
        reader.close()


def test_unexpected_status_raises_requests_http_error(lock_service: ServiceInfo) -> None:
    # A base URL below the service root: every path is unknown there (404).
    backend = HttpBackend(lock_service.url + "/nowhere", lock_service.keys["alpha"])
    try:
        with pytest.raises(requests.HTTPError):
            backend.inspect(_key())
    finally:
        backend.close()


def test_transport_failure_is_backend_unavailable_with_the_drivers_cause(lock_service: ServiceInfo) -> None:
    backend = HttpBackend(f"http://127.0.0.1:{free_port()}", lock_service.keys["alpha"], timeout=2)
    try:
        with pytest.raises(BackendUnavailableError) as unavailable:
            backend.inspect(_key())
        assert isinstance(unavailable.value.__cause__, requests.ConnectionError)
        assert unavailable.value.backend == "http" and "http" in str(unavailable.value)
    finally:
        backend.close()


def test_caller_session_stays_open(lock_service: ServiceInfo) -> None:
    session = requests.Session()
    backend = HttpBackend(lock_service.url, lock_service.keys["alpha"], session=session)
    assert backend.inspect(_key()).held is False
    backend.close()
    # Still usable: the session is the caller's.
    response = session.get(lock_service.url + "/locks/x", timeout=5)
    assert response.status_code == 401
    session.close()


def test_bad_port_is_a_validation_error() -> None:
    with pytest.raises(ValidationError, match="bad port"):
        HttpBackend("http://127.0.0.1:notaport/", "key")


@pytest.mark.parametrize("url", ["http://127.0.0.1:99999/?api_key=Sup3rSecretKey", "https://h.example:port/?api_key=Sup3rSecretKey"])
def test_a_bad_url_never_shows_the_service_key(url: str) -> None:
    with pytest.raises(ValidationError) as refused:
        lease_lock.connect(url)
    shown = str(refused.value) + repr(refused.value) + "".join(map(str, refused.value.args))
    assert "Sup3rSecretKey" not in shown
    assert refused.value.__cause__ is None or "Sup3rSecretKey" not in str(refused.value.__cause__)


def _child_cycles(backend: HttpBackend, name: str, rounds: int) -> int:
    """In a forked child: ``rounds`` grants on own keys, each checked against a fresh read."""
    wrong = 0
    for index in range(rounds):
        key, token = f"fork.{name}.{index}", backend.new_token()
        fence = backend.acquire_fenced(key, token, 30, name)
        state = backend.inspect(key)
        if fence is None or state.fence != fence or state.owner != name or not backend.release(key, token):
            wrong += 1
    return wrong


def test_a_backend_used_before_fork_gives_each_child_its_own_connection(lock_service: ServiceInfo) -> None:
    import os

    backend = HttpBackend(lock_service.url, lock_service.keys["alpha"], timeout=10)
    try:
        assert backend.inspect(_key()).held is False  # the parent now has a pooled connection
        children = []
        for number in range(4):
            pid = os.fork()
            if pid == 0:  # pragma: no cover - runs in the child, reported by its exit status
                status = 3
                try:
                    status = 1 if _child_cycles(backend, f"child{number}-{os.getpid()}", 20) else 0
                finally:
                    os._exit(status)
            children.append(pid)
        statuses = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children]
        assert statuses == [0, 0, 0, 0]
        # The parent's own connection still works after the children used theirs.
        assert backend.inspect(_key()).held is False
    finally:
        backend.close()


def test_importing_the_client_loads_nothing_of_the_server() -> None:
    import subprocess
    import sys

    program = (
        "import sys, lease_lock.backends.http; "
        "print(sorted(m for m in sys.modules if m.startswith('lease_lock.server')))"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"


def test_repr_never_shows_a_password_of_the_url() -> None:
    backend = HttpBackend("http://user:Sup3rSecretPw@127.0.0.1:8080/base", "key")
    try:
        assert "Sup3rSecretPw" not in repr(backend) and "127.0.0.1:8080" in repr(backend)
    finally:
        backend.close()


def test_a_netrc_entry_for_the_host_never_replaces_the_service_key(
    lock_service: ServiceInfo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    netrc = tmp_path / "netrc"
    host = urllib.parse.urlsplit(lock_service.url).hostname
    netrc.write_text(f"machine {host} login someone password secret\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    backend = HttpBackend(lock_service.url, lock_service.keys["alpha"])
    try:
        assert not backend.inspect(_key()).held
    finally:
        backend.close()


def test_an_adoption_on_the_wire(lock_service: ServiceInfo, client: HttpBackend) -> None:
    # What the HTTP backend's adopt sends, checked at the service: a malformed claim token is
    # refused before anything is written, and a refused adoption does not wait.
    key = _key()
    claim, holder = client.new_token(), client.new_token()
    url = f"{lock_service.url}/locks/{key}/lease"
    headers = {"Authorization": f"Bearer {lock_service.keys['alpha']}", "X-Volcano-Lock-Token": holder}
    bad = requests.post(url, headers={**headers, "X-Lease-Lock-Adopt": "not-a-uuid"}, json={"ttl_seconds": 30},
                        timeout=30)
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_token"
    assert not client.inspect(key).held
    assert client.acquire(key, client.new_token(), 30, "other")
    refused = requests.post(url, headers={**headers, "X-Lease-Lock-Adopt": claim, "Prefer": "wait=5"},
                            json={"ttl_seconds": 30}, timeout=30)
    assert refused.status_code == 409 and refused.json()["code"] == "lock_held"
    assert "Preference-Applied" not in refused.headers
    assert client.inspect(key).owner == "other"
