"""The service's lease rules (grace, deadline, renew margin, fences, idempotent acquire) on a
memory store with an injected clock, then across two real server processes sharing SQLite or
an etcd cluster."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import requests
from lease_lock.backends.memory import MemoryBackend
from lease_lock.server.service import Conflict, LockService
from lease_lock.wire import MAX_LIFETIME

from tests.support.http_server import EPOCH, make_keys, start_serve, stop_serve
from tests.support.http_server import ServiceClock as Clock


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def service(clock: Clock) -> LockService:
    return LockService(MemoryBackend(clock=clock.monotonic), clock=clock.wall)


def _token() -> str:
    return str(uuid.uuid4())


def test_grace_second_after_expiry(service: LockService, clock: Clock) -> None:
    first, second = _token(), _token()
    grant = service.acquire("p", "k", first, 10, "a")
    assert grant.expires_at == EPOCH + 1010.0
    clock.now += 10.5  # expired, inside the grace second
    state = service.read("p", "k")
    assert state.held and state.expires_at == pytest.approx(EPOCH + 1010.0)
    with pytest.raises(Conflict) as held:
        service.acquire("p", "k", second, 10, "b")
    assert held.value.code == "lock_held"
    with pytest.raises(Conflict) as lost:
        service.acquire("p", "k", first, 10, "a")
    assert lost.value.code == "lock_ownership_lost"
    clock.now += 0.6  # grace over: free, and the same token starts a new acquisition
    assert not service.read("p", "k").held
    again = service.acquire("p", "k", first, 10, "a")
    assert again.fence > grant.fence


def test_same_token_acquire_is_idempotent_and_absolute(service: LockService, clock: Clock) -> None:
    token = _token()
    grant = service.acquire("p", "k", token, 60, "a")
    clock.now += 5
    repeat = service.acquire("p", "k", token, 10, "a")
    assert repeat.fence == grant.fence
    assert repeat.expires_at == EPOCH + clock.now + 10  # shortened, not added
    assert service.read("p", "k").expires_at == pytest.approx(repeat.expires_at)


def test_renew_needs_more_than_a_second_left(service: LockService, clock: Clock) -> None:
    token = _token()
    grant = service.acquire("p", "k", token, 10, "a")
    clock.now += 8.5
    renewed = service.renew("p", "k", token, 5)
    assert renewed.fence == grant.fence and renewed.expires_at == EPOCH + clock.now + 5
    clock.now += 4.2  # 0.8 s left: too late
    with pytest.raises(Conflict) as late:
        service.renew("p", "k", token, 5)
    assert late.value.code == "lock_ownership_lost"
    with pytest.raises(Conflict) as stranger:
        service.renew("p", "k", _token(), 5)
    assert stranger.value.code == "lock_ownership_lost"


def test_deadline_caps_renewals_and_reacquires(service: LockService, clock: Clock) -> None:
    token = _token()
    grant = service.acquire("p", "k", token, 7_776_000, "a")
    deadline = EPOCH + 1000.0 + MAX_LIFETIME
    assert grant.expires_at == deadline
    clock.now += MAX_LIFETIME - 100
    assert service.renew("p", "k", token, 3600).expires_at == deadline
    assert service.acquire("p", "k", token, 3600, "a").expires_at == deadline
    clock.now += 99.5
    with pytest.raises(Conflict):
        service.renew("p", "k", token, 3600)
    clock.now += 2
    assert not service.read("p", "k").held
    fresh = service.acquire("p", "k", token, 3600, "a")
    assert fresh.fence > grant.fence and fresh.expires_at == EPOCH + clock.now + 3600


def test_release_rules(service: LockService) -> None:
    token, other = _token(), _token()
    assert service.release("p", "k", token) is False  # absent
    service.acquire("p", "k", token, 30, "a")
    with pytest.raises(Conflict) as wrong:
        service.release("p", "k", other)
    assert wrong.value.code == "lock_ownership_lost"
    assert service.read("p", "k").held
    assert service.release("p", "k", token) is True
    assert service.force_release("p", "k") is False


def test_fences_rise_on_every_change_of_hands(service: LockService, clock: Clock) -> None:
    fences = []
    for step in range(4):
        token = _token()
        fences.append(service.acquire("p", "k", token, 10, "a").fence)
        if step % 2:
            service.force_release("p", "k")
        else:
            clock.now += 11.01
    assert fences == sorted(set(fences))


def test_projects_are_separate_namespaces(service: LockService) -> None:
    first = service.acquire("p", "k", _token(), 30, "a")
    second = service.acquire("q", "k", _token(), 30, "b")
    assert first.fence and second.fence
    assert [holder.key for holder in service.list("p", "")] == ["k"]
    assert service.read("q", "k").owner == "b"


@pytest.fixture(params=["sqlite", "etcd"])
def shared_store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of the store two ``serve`` processes share: an SQLite file, or the tests' etcd
    cluster under a namespace of this test's own."""
    if request.param == "etcd":
        return f"{request.getfixturevalue('etcd_cluster').url}?namespace=serve-{uuid.uuid4().hex[:8]}/"
    return f"sqlite:///{tmp_path / 'locks.db'}"


def test_two_server_processes_share_one_store(tmp_path: Path, shared_store: str) -> None:
    keys_file = tmp_path / "keys.toml"
    keys = make_keys(keys_file)
    url = shared_store
    first, first_url, _ = start_serve(tmp_path, url, keys_file, "--rate-limit", "7")
    second, second_url, _ = start_serve(tmp_path, url, keys_file, "--rate-limit", "7")
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {keys['alpha']}"
    try:
        token = _token()
        grant = session.post(
            f"{first_url}/locks/shared/lease",
            json={"ttl_seconds": 30},
            headers={"X-Volcano-Lock-Token": token},
            timeout=10,
        )
        assert grant.status_code == 201
        taken = session.post(
            f"{second_url}/locks/shared/lease",
            json={"ttl_seconds": 30},
            headers={"X-Volcano-Lock-Token": _token()},
            timeout=10,
        )
        assert taken.status_code == 409 and taken.json()["code"] == "lock_held"
        # A renewal through the other process keeps the deadline and the fence.
        renewed = session.patch(
            f"{second_url}/locks/shared/lease",
            json={"ttl_seconds": 20},
            headers={"X-Volcano-Lock-Token": token},
            timeout=10,
        )
        assert renewed.status_code == 200
        assert renewed.json()["fencing_token"] == grant.json()["fencing_token"]
        # Budget: 7 per project per minute, counted in the shared store. Alternating between
        # the processes, at most 7 requests in a row get through (14 if each counted alone);
        # a minute boundary only restarts the run.
        allowed_in_a_row = 0
        for attempt in range(30):
            status = session.get(f"{(first_url, second_url)[attempt % 2]}/locks/shared", timeout=10)
            if status.status_code == 429:
                break
            allowed_in_a_row += 1
        assert status.status_code == 429 and allowed_in_a_row <= 7
    finally:
        session.close()
        stop_serve(first)
        stop_serve(second)


def test_encoded_slash_is_an_invalid_key_under_a_server_without_the_raw_path(tmp_path: Path) -> None:
    # wsgiref passes only the decoded PATH_INFO: "/locks/a%2Fb/lease" arrives as four segments
    # plus "lease". The issue makes a decoded "/" an invalid key, not an unknown resource.
    import io
    import json
    import wsgiref.util

    from lease_lock.server import create_app

    keys = make_keys(tmp_path / "keys.toml")
    app = create_app(MemoryBackend(), tmp_path / "keys.toml")
    statuses: list[str] = []

    def start_response(status: str, headers: object, *_: object) -> None:
        statuses.append(status)

    for path in ("/locks/a/b", "/locks/a/b/lease"):
        environ: dict[str, object] = {
            "REQUEST_METHOD": "GET" if path.endswith("b") else "POST",
            "PATH_INFO": path,
            "HTTP_AUTHORIZATION": f"Bearer {keys['alpha']}",
            "HTTP_X_VOLCANO_LOCK_TOKEN": str(uuid.uuid4()),
            "CONTENT_TYPE": "application/json",
            "CONTENT_LENGTH": "18",
            "wsgi.input": io.BytesIO(b'{"ttl_seconds": 5}'),
        }
        wsgiref.util.setup_testing_defaults(environ)
        body = b"".join(app(environ, start_response))  # type: ignore[arg-type]
        assert statuses[-1].startswith("400"), (path, statuses)
        assert json.loads(body)["code"] == "invalid_key"
