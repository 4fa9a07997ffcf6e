"""Counting locks through the service (the ``limit`` extension of an acquisition): the field's
validation, places granted, renewed and released by token, another limit refused, a store that
cannot count, waiting for a place, and the service's rules (grace, deadline) per place."""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar, Optional

import pytest
import requests
from lease_lock import Locker
from lease_lock.backends.base import Capabilities
from lease_lock.backends.http import HttpBackend
from lease_lock.backends.memory import MemoryBackend
from lease_lock.errors import ValidationError
from lease_lock.server import create_app
from lease_lock.server.service import Conflict, LockService
from lease_lock.wire import MAX_LIFETIME

from tests.support.http_server import (
    EPOCH,
    ServiceClient,
    ServiceClock,
    ServiceInfo,
    ThreadedServer,
    client_of,
    make_keys,
)


class Client(ServiceClient):
    """The service's client, with the body of an acquisition given whole."""

    def lease(self, key: str, token: str, body: Any, headers: Optional[dict[str, str]] = None) -> requests.Response:
        """An acquisition of ``key`` for ``token`` with ``body`` as it is."""
        return self.acquire(key, token, json=body, headers=headers or {})

    def place(
        self, key: str, token: str, limit: int, ttl: int = 30, headers: Optional[dict[str, str]] = None
    ) -> requests.Response:
        """An acquisition of one of ``limit`` places of ``key``."""
        return self.lease(key, token, {"ttl_seconds": ttl, "limit": limit}, headers)


@pytest.fixture
def alpha(lock_service: ServiceInfo) -> Iterator[Client]:
    with client_of(lock_service, "alpha", Client) as client:
        yield client


def _key() -> str:
    return f"count.{uuid.uuid4().hex}"


def _token() -> str:
    return str(uuid.uuid4())


def _instant(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _error(response: requests.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["code"] == code and isinstance(body["error"], str)
    return str(body["error"])


@pytest.mark.parametrize("limit", [1, 0, -2, 1_000_001, "2", 2.0, 2.5, True, None, [2], {"n": 2}])
def test_a_bad_limit_is_refused_naming_it_and_writes_nothing(alpha: Client, limit: Any) -> None:
    key = _key()
    message = _error(alpha.lease(key, _token(), {"ttl_seconds": 30, "limit": limit}), 400, "invalid_request")
    assert "limit" in message and "2 to 1000000" in message
    assert alpha.call("GET", f"/locks/{key}").json() == {"held": False}


def test_the_ttl_is_checked_before_the_limit(alpha: Client) -> None:
    _error(alpha.lease(_key(), _token(), {"ttl_seconds": 1, "limit": 2}), 400, "invalid_ttl")


def test_places_are_granted_up_to_the_limit_and_reported(alpha: Client) -> None:
    key, first, second = _key(), _token(), _token()
    one = alpha.place(key, first, 2, headers={"X-Lease-Lock-Owner": "one"})
    two = alpha.place(key, second, 2, ttl=60)
    assert one.status_code == two.status_code == 201
    assert set(one.json()) == {"expires_at", "fencing_token", "limit"} and one.json()["limit"] == 2
    fences = [one.json()["fencing_token"], two.json()["fencing_token"]]
    assert fences[1] > fences[0]
    full = alpha.place(key, _token(), 2)
    _error(full, 409, "lock_held")
    state = alpha.call("GET", f"/locks/{key}").json()
    assert state["held"] is True and state["limit"] == 2
    # The top level is the latest grant; every place is listed by fence with its own expiry.
    # A read rebuilds an expiry from the lease left then: the grant's instant, give or take the
    # millisecond it may round across.
    granted = [_instant(one.json()["expires_at"]), _instant(two.json()["expires_at"])]
    assert state["fencing_token"] == fences[1] and _instant(state["expires_at"]) == pytest.approx(granted[1], abs=0.002)
    assert [holder["fencing_token"] for holder in state["holders"]] == fences
    assert [holder.get("owner") for holder in state["holders"]] == ["one", None]
    assert [_instant(holder["expires_at"]) for holder in state["holders"]] == pytest.approx(granted, abs=0.002)
    assert 29 < state["holders"][0]["expires_in"] <= 31 and 59 < state["holders"][1]["expires_in"] <= 61
    [listed] = alpha.call("GET", "/locks", params={"prefix": key}).json()["locks"]
    assert listed["limit"] == 2 and [holder["fencing_token"] for holder in listed["holders"]] == fences


def test_a_place_is_renewed_and_released_by_its_token(alpha: Client) -> None:
    key, first, second = _key(), _token(), _token()
    fence = alpha.place(key, first, 2).json()["fencing_token"]
    alpha.place(key, second, 2)
    # A repeat renews the place, as a renewal does; a renewal ignores a limit it is sent.
    assert alpha.place(key, first, 2, ttl=10).json()["fencing_token"] == fence
    renewed = alpha.call("PATCH", f"/locks/{key}/lease", first, json={"ttl_seconds": 90, "limit": 7})
    assert renewed.status_code == 200 and renewed.json()["fencing_token"] == fence
    holders = alpha.call("GET", f"/locks/{key}").json()["holders"]
    assert holders[0]["fencing_token"] == fence and holders[0]["expires_in"] > 89
    _error(alpha.call("PATCH", f"/locks/{key}/lease", _token(), json={"ttl_seconds": 30}), 409, "lock_ownership_lost")
    released = alpha.call("DELETE", f"/locks/{key}/lease", first)
    assert released.status_code == 204 and released.headers["X-Lease-Lock-Released"] == "true"
    assert [holder["fencing_token"] for holder in alpha.call("GET", f"/locks/{key}").json()["holders"]] != [fence]
    newcomer = alpha.place(key, _token(), 2)
    assert newcomer.status_code == 201 and newcomer.json()["fencing_token"] > fence
    forced = alpha.call("DELETE", f"/locks/{key}")
    assert forced.headers["X-Lease-Lock-Released"] == "true"
    assert alpha.call("GET", f"/locks/{key}").json() == {"held": False}


def test_another_limit_is_a_conflict_naming_both_limits(alpha: Client) -> None:
    key = _key()
    alpha.place(key, _token(), 2)
    message = _error(alpha.place(key, _token(), 3), 409, "limit_mismatch")
    # The key as the client named it, never the store's name of it.
    assert "limit=3" in message and "limit=2" in message and repr(key) in message and "locks/" not in message
    # The official API's exclusive acquisition finds the key held, as it always has.
    _error(alpha.lease(key, _token(), {"ttl_seconds": 30}), 409, "lock_held")
    exclusive = _key()
    assert alpha.lease(exclusive, _token(), {"ttl_seconds": 30}).status_code == 201
    message = _error(alpha.place(exclusive, _token(), 2), 409, "limit_mismatch")
    assert "limit=2" in message and "limit=1" in message
    state = alpha.call("GET", f"/locks/{exclusive}").json()
    assert state["limit"] == 1 and len(state["holders"]) == 1
    # An adoption grants the key itself, never a place.
    adopted = alpha.place(_key(), _token(), 2, headers={"X-Lease-Lock-Adopt": _token()})
    assert "limit=2" in _error(adopted, 409, "limit_mismatch")


class _CannotCount(MemoryBackend):
    """A store that grants no counting leases."""

    capabilities: ClassVar[Capabilities] = dataclasses.replace(MemoryBackend.capabilities, counting=False)


def test_a_store_that_cannot_count_answers_501_naming_it(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.toml"
    keys = make_keys(keys_file)
    app = create_app(_CannotCount(), keys_file)
    try:
        with ThreadedServer(app) as server:
            client = Client(server.url, keys["alpha"])
            key = _key()
            assert "_CannotCount" in _error(client.place(key, _token(), 2), 501, "not_implemented")
            assert client.call("GET", f"/locks/{key}").json() == {"held": False}
            # The HTTP backend says so as a ValidationError, and a Locker's acquisition raises it.
            backend = HttpBackend(server.url, keys["alpha"])
            try:
                with pytest.raises(ValidationError, match="_CannotCount"):
                    backend.acquire_counted(key, backend.new_token(), 30, "o", 2)
                with Locker(backend, limit=2) as locker, pytest.raises(ValidationError, match="_CannotCount"):
                    locker.try_acquire(key)
            finally:
                backend.close()
            client.session.close()
    finally:
        app.close()


def test_a_waiting_acquisition_gets_the_place_a_release_frees(alpha: Client, lock_service: ServiceInfo) -> None:
    key, first = _key(), _token()
    alpha.place(key, first, 2)
    alpha.place(key, _token(), 2)
    answers: list[requests.Response] = []
    waiter = Client(lock_service.url, lock_service.keys["alpha"])
    waiting = {"Prefer": "wait=20"}
    thread = threading.Thread(target=lambda: answers.append(waiter.place(key, _token(), 2, headers=waiting)))
    started = time.monotonic()
    thread.start()
    time.sleep(0.5)  # the waiter is held by now
    assert thread.is_alive()
    assert alpha.call("DELETE", f"/locks/{key}/lease", first).status_code == 204
    thread.join(30)
    [answer] = answers
    assert answer.status_code == 201 and answer.json()["limit"] == 2, answer.text
    assert answer.headers["Preference-Applied"] == "wait=20" and float(answer.headers["X-Lease-Lock-Waited"]) >= 0.4
    assert time.monotonic() - started < 10
    assert len(alpha.call("GET", f"/locks/{key}").json()["holders"]) == 2
    waiter.session.close()


def test_a_waiting_acquisition_of_another_limit_is_refused_at_once(alpha: Client) -> None:
    key = _key()
    alpha.place(key, _token(), 2)
    alpha.place(key, _token(), 2)
    started = time.monotonic()
    refused = alpha.place(key, _token(), 3, headers={"Prefer": "wait=20"})
    _error(refused, 409, "limit_mismatch")
    assert "Preference-Applied" not in refused.headers and time.monotonic() - started < 5




def test_each_place_keeps_the_service_rules() -> None:
    clock = ServiceClock()
    service = LockService(MemoryBackend(clock=clock.monotonic), clock=clock.wall)
    first, second = _token(), _token()
    grant = service.acquire_counted("p", "k", first, 10, "a", 2)
    assert grant.expires_at == EPOCH + 1010.0
    service.acquire_counted("p", "k", second, 60, "b", 2)
    clock.now += 10.5  # the first place expired, inside its grace second
    held = service.read("p", "k")
    assert held.limit == 2 and len(held.places) == 2
    assert held.places[0].expires_at == pytest.approx(EPOCH + 1010.0)
    with pytest.raises(Conflict) as full:
        service.acquire_counted("p", "k", _token(), 10, "c", 2)
    assert full.value.code == "lock_held" and full.value.takeover_in == pytest.approx(0.5)
    with pytest.raises(Conflict) as lost:
        service.acquire_counted("p", "k", first, 10, "a", 2)
    assert lost.value.code == "lock_ownership_lost"
    with pytest.raises(Conflict) as late:
        service.renew("p", "k", first, 10)
    assert late.value.code == "lock_ownership_lost"
    clock.now += 0.6  # grace over: the place is free, the other one still held
    third = service.acquire_counted("p", "k", _token(), 10, "c", 2)
    assert third.fence > grant.fence
    # A repeat keeps its place's deadline (in its label): no acquisition lives past 90 days.
    service.acquire_counted("p", "k2", first, 60, "a", 3)
    deadline = f"|{EPOCH + clock.now + MAX_LIFETIME:.3f}|"
    clock.now += 30
    service.acquire_counted("p", "k2", first, 60, "a2", 3)
    [place] = service.backend.inspect(service.store_key("p", "k2")).holders
    assert place.owner is not None and deadline in place.owner and place.owner.endswith("|a2")
