"""How the HTTP backend reaches the service: a backend that owns its session sends plain-HTTP
requests straight through a ``urllib3`` pool, and must look exactly like ``requests`` from
above (answers, transport errors, the environment's proxy) and on the wire."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest
import requests
from benchmarks.chaos_harness.proxy import TcpProxy
from lease_lock.backends.http import HttpBackend
from lease_lock.backends.memory import MemoryBackend
from lease_lock.errors import BackendUnavailableError
from lease_lock.server import create_app

from tests.support.http_server import RequestRecorder, ThreadedServer, make_keys
from tests.support.silent_wait import check_a_silent_line_ends_its_wait_as_an_outage
from tests.support.tls import make_certificates, tls_front


@pytest.fixture
def service(tmp_path: Path) -> Iterator[tuple[RequestRecorder, ThreadedServer, dict[str, str]]]:
    keys_file = tmp_path / "keys.toml"
    keys = make_keys(keys_file)
    seen = RequestRecorder(create_app(MemoryBackend(), keys_file))
    with ThreadedServer(seen) as server:
        yield seen, server, keys


@pytest.fixture
def sent_by_session(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The URLs ``requests.Session.send`` sends to from now on."""
    sent: list[str] = []
    original = requests.Session.send

    def recording_send(session: requests.Session, request: requests.PreparedRequest, **kwargs: Any) -> Any:
        sent.append(str(request.url))
        return original(session, request, **kwargs)

    monkeypatch.setattr(requests.Session, "send", recording_send)
    return sent


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    """Certificates of private CAs: one for this machine's names, one for another host."""
    return {
        "here": make_certificates(tmp_path_factory.mktemp("here"), "localhost", "127.0.0.1"),
        "elsewhere": make_certificates(tmp_path_factory.mktemp("elsewhere"), "lock-service.invalid"),
    }


@pytest.fixture
def no_environment_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY",
                 "no_proxy", "NO_PROXY", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)


def test_a_plain_http_service_is_reached_without_the_sessions_send(
    service: Any, no_environment_settings: None, sent_by_session: list[str]
) -> None:
    seen, server, keys = service
    backend = HttpBackend(server.url, keys["alpha"])
    try:
        token = backend.new_token()
        fence = backend.acquire_fenced("job", token, 30, "worker 1")
        assert fence is not None and backend.is_held("job", token)
        assert backend.extend("job", token, 60)
        state = backend.inspect("job")
        assert state.held and state.owner == "worker 1" and state.fence == fence
        assert [found.key for found in backend.scan("jo")] == ["job"]
        assert backend.release("job", token) and not backend.inspect("job").held
    finally:
        backend.close()
    assert sent_by_session == []
    # On the wire, what requests would have sent: the session's own headers, the credential,
    # and a JSON body encoded as requests encodes one.
    acquisition = seen.seen[0]
    assert acquisition["method"] == "POST" and acquisition["path"] == "/locks/job/lease"
    assert acquisition["headers"]["authorization"] == f"Bearer {keys['alpha']}"
    assert acquisition["headers"]["user-agent"] == requests.utils.default_user_agent()
    assert acquisition["headers"]["content-type"] == "application/json"
    assert json.loads(acquisition["body"]) == {"ttl_seconds": 30}
    assert acquisition["headers"]["x-volcano-lock-token"] == token
    uuid.UUID(acquisition["headers"]["x-volcano-request-id"])
    listing = next(request for request in seen.seen if request["method"] == "GET" and request["path"] == "/locks")
    assert listing["query"] == "prefix=jo"


def test_a_proxy_named_by_the_environment_carries_every_request(
    service: Any, no_environment_settings: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen, server, keys = service
    # The service's host name resolves nowhere: only the proxy can reach it.
    monkeypatch.setenv("HTTP_PROXY", server.url)
    backend = HttpBackend("http://lock-service.invalid:8080", keys["alpha"])
    try:
        token = backend.new_token()
        assert backend.acquire("job", token, 30, "o")
        assert backend.release("job", token)
    finally:
        backend.close()
    assert [(request["method"], request["headers"]["host"]) for request in seen.seen] == [
        ("POST", "lock-service.invalid:8080"),
        ("DELETE", "lock-service.invalid:8080"),
    ]


def test_a_read_timeout_is_backend_unavailable_with_requests_timeout_as_cause(no_environment_settings: None) -> None:
    answer = threading.Event()

    def slow(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        answer.wait(30)
        start_response("404 Not Found", [("Content-Type", "application/json")])
        return [b"{}"]

    with ThreadedServer(slow) as server:
        backend = HttpBackend(server.url, "key", timeout=0.5)
        try:
            with pytest.raises(BackendUnavailableError) as unavailable:
                backend.inspect("job")
            assert isinstance(unavailable.value.__cause__, requests.ReadTimeout)
        finally:
            answer.set()
            backend.close()


@pytest.mark.parametrize("route", ["direct", "proxy", "caller's session"])
def test_a_redirect_is_an_unexpected_answer_and_is_never_followed(
    route: str, service: Any, no_environment_settings: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen, target, keys = service

    def moved(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        start_response("307 Temporary Redirect", [("Location", f"{target.url}{environ['PATH_INFO']}")])
        return [b""]

    with ThreadedServer(moved) as server, requests.Session() as session:
        if route == "proxy":
            monkeypatch.setenv("HTTP_PROXY", server.url)
            backend = HttpBackend("http://lock-service.invalid", keys["alpha"])
        else:
            backend = HttpBackend(server.url, keys["alpha"], session=session if route == "caller's session" else None)
        try:
            with pytest.raises(requests.HTTPError, match="307"):
                backend.acquire("job", backend.new_token(), 30, "o")
        finally:
            backend.close()
    # The credential and the lease went nowhere else.
    assert seen.seen == []


def test_a_pooled_connection_cut_under_it_is_replaced(service: Any, no_environment_settings: None) -> None:
    _seen, server, keys = service
    proxy = TcpProxy("127.0.0.1", int(server.url.rsplit(":", 1)[1]))
    backend = HttpBackend(f"http://127.0.0.1:{proxy.port}", keys["alpha"])
    try:
        assert not backend.inspect("job").held  # the pool now keeps one connection
        assert proxy.cut() >= 2  # reset, as a dropped NAT entry or a restarted balancer would
        token = backend.new_token()
        assert backend.acquire("job", token, 30, "o")
        assert backend.release("job", token)
    finally:
        backend.close()
        proxy.close()


def test_a_closed_backend_opens_a_new_connection_when_used_again(service: Any, no_environment_settings: None) -> None:
    _seen, server, keys = service
    backend = HttpBackend(server.url, keys["alpha"])
    assert not backend.inspect("job").held
    backend.close()
    try:
        assert not backend.inspect("job").held
    finally:
        backend.close()


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def test_an_https_service_is_reached_through_the_pool_with_its_certificate_verified(
    service: Any,
    certificates: Any,
    no_environment_settings: None,
    sent_by_session: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen, server, keys = service
    here = certificates["here"]
    # Trusted as requests trusts a bundle the environment names.
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", here["ca"])
    with tls_front(_port(server.url), here["cert"], here["key"]) as front:
        backend = HttpBackend(f"https://localhost:{front.port}", keys["alpha"])
        try:
            token = backend.new_token()
            assert backend.acquire_fenced("job", token, 30, "o") is not None
            assert backend.extend("job", token, 60)
            assert backend.release("job", token)
        finally:
            backend.close()
    assert sent_by_session == []
    assert [request["method"] for request in seen.seen] == ["POST", "PATCH", "DELETE"]


@pytest.mark.parametrize("refusal", ["untrusted", "another host's"])
def test_an_https_certificate_that_does_not_verify_is_refused_before_anything_is_sent(
    refusal: str, service: Any, certificates: Any, no_environment_settings: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen, server, keys = service
    served = certificates["here" if refusal == "untrusted" else "elsewhere"]
    if refusal == "another host's":
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", served["ca"])  # trusted, but not for 127.0.0.1
    with tls_front(_port(server.url), served["cert"], served["key"]) as front:
        backend = HttpBackend(f"https://127.0.0.1:{front.port}", keys["alpha"])
        try:
            with pytest.raises(BackendUnavailableError) as unavailable:
                backend.inspect("job")
            assert isinstance(unavailable.value.__cause__, requests.exceptions.SSLError)
        finally:
            backend.close()
    assert seen.seen == []


def test_a_ca_bundle_that_is_not_there_is_the_sessions_own_error(
    service: Any, no_environment_settings: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _seen, server, keys = service
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tmp_path / "missing.pem"))
    backend = HttpBackend(f"https://127.0.0.1:{_port(server.url)}", keys["alpha"])
    try:
        with pytest.raises(OSError, match="CA certificate bundle"):
            backend.inspect("job")
    finally:
        backend.close()


@pytest.mark.parametrize("session", [False, True], ids=["direct", "caller's session"])
def test_a_silent_network_ends_a_wait_in_line_as_an_outage_in_bounded_time(
    session: bool, service: Any, no_environment_settings: None
) -> None:
    # The waiter reaches the service through a proxy that then holds every byte back: the
    # connection stays open and nothing is answered. Its requests may take five minutes each,
    # but a wait of three seconds must end as an outage a little after them, not wait out the
    # request timeout (twice: an acquisition is sent again after a transport failure), and so
    # must the leave after it, which gives back what the unanswered request may have won.
    _seen, server, keys = service
    proxy = TcpProxy("127.0.0.1", int(server.url.rsplit(":", 1)[1]))
    caller = requests.Session() if session else None
    backend = HttpBackend(f"http://127.0.0.1:{proxy.port}", keys["alpha"], timeout=300, session=caller)
    holder = HttpBackend(server.url, keys["alpha"])
    holder_token, token = holder.new_token(), backend.new_token()
    try:
        assert holder.acquire_fenced("job", holder_token, 30, "holder") is not None
        assert backend.acquire_fenced("job", token, 30, "waiter") is None  # learns the wait offered
        line = backend.join_line("job", token, 30, "waiter", True, time.monotonic)
        assert line is not None
        proxy.stall()
        check_a_silent_line_ends_its_wait_as_an_outage(line, requests.Timeout)
    finally:
        proxy.close()
        backend.close()
        holder.force_release("job")
        holder.close()
        if caller is not None:
            caller.close()
