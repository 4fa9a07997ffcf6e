"""The retry-once rule of acquisition, over real sockets: a proxy that swallows the first reply,
a store that fails once (503), and the errors that must get exactly one attempt."""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from lease_lock import Locker
from lease_lock.backends.http import HttpBackend
from lease_lock.backends.memory import MemoryBackend
from lease_lock.backends.service import RequestIdCarrier, ServiceStore
from lease_lock.errors import BackendUnavailableError, RateLimitedError, ValidationError
from lease_lock.server import create_app

from tests.support.http_server import RequestRecorder, ThreadedServer, make_keys
from tests.support.polling import wait_until


class DroppingProxy:
    """Forwards each HTTP request upstream, but closes the first ``drop`` client connections
    after the upstream answered, without passing the answer on."""

    def __init__(self, upstream_port: int, drop: int = 1) -> None:
        self.upstream_port = upstream_port
        self.drop = drop
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    @staticmethod
    def _read_request(conn: socket.socket) -> bytes:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return b""
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = 0
        lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"connection:")]
        for line in lines:
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        while len(body) < length:
            body += conn.recv(65536)
        return b"\r\n".join([*lines, b"Connection: close"]) + b"\r\n\r\n" + body

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            request = self._read_request(conn)
            if not request:
                return
            with socket.create_connection(("127.0.0.1", self.upstream_port)) as upstream:
                upstream.sendall(request)
                reply = b""
                while chunk := upstream.recv(65536):
                    reply += chunk
            if self.drop > 0:
                self.drop -= 1
                return  # the upstream acted on it; the client never hears back
            conn.sendall(reply)

    def close(self) -> None:
        self.listener.close()


class FlakyStore(MemoryBackend):
    """A memory store whose next ``failures`` reads (or grant-or-reads) raise like an unreachable
    server."""

    failures = 0

    def _fail_if_due(self) -> None:
        if self.failures > 0:
            self.failures -= 1
            try:
                raise ConnectionError("store unreachable (test)")
            except ConnectionError as exc:
                raise BackendUnavailableError("memory store unreachable (test)", backend="memory") from exc

    def inspect(self, key: str) -> Any:
        self._fail_if_due()
        return super().inspect(key)

    def grant_if_free(self, key: str, token: str, ttl: float, owner: str) -> Any:
        # The service's acquisitions read the key in this call instead of in ``inspect``.
        self._fail_if_due()
        return super().grant_if_free(key, token, ttl, owner)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[tuple[RequestRecorder, FlakyStore, ThreadedServer, dict[str, str]]]:
    keys_file = tmp_path / "keys.toml"
    keys = make_keys(keys_file)
    store = FlakyStore()
    recorder = RequestRecorder(create_app(store, keys_file, rate_limit=6, rate_window=3600))
    with ThreadedServer(recorder) as server:
        yield recorder, store, server, keys


def _posts(recorder: RequestRecorder) -> list[dict[str, Any]]:
    return [seen for seen in recorder.seen if seen["method"] == "POST"]


def test_lost_reply_is_retried_once_with_the_same_request(rig: Any) -> None:
    recorder, store, server, keys = rig
    proxy = DroppingProxy(int(server.url.rsplit(":", 1)[1]), drop=1)
    backend = HttpBackend(proxy.url, keys["alpha"])
    try:
        token = backend.new_token()
        request_id = str(uuid.uuid4())
        with backend.request_id_scope(request_id):
            fence = backend.acquire_fenced("job", token, 30, "o")
        posts = _posts(recorder)
        assert len(posts) == 2
        first, second = posts
        for field in ("path", "token", "request_id", "authorization", "body"):
            assert first[field] == second[field]
        assert first["request_id"] == request_id and first["token"] == token
        # The first attempt's grant and the retry's are the same lease: one fence.
        assert fence == store.inspect("locks/alpha/job").fence
    finally:
        backend.close()
        proxy.close()


def test_two_lost_replies_raise_the_transport_error(rig: Any) -> None:
    recorder, _store, server, keys = rig
    proxy = DroppingProxy(int(server.url.rsplit(":", 1)[1]), drop=2)
    backend = HttpBackend(proxy.url, keys["alpha"])
    try:
        with pytest.raises(BackendUnavailableError) as unavailable:
            backend.acquire("job", backend.new_token(), 30, "o")
        assert isinstance(unavailable.value.__cause__, requests.ConnectionError)
        assert unavailable.value.backend == "http"
        assert len(_posts(recorder)) == 2
    finally:
        backend.close()
        proxy.close()


def test_503_is_retried_once(rig: Any) -> None:
    recorder, store, server, keys = rig
    backend = HttpBackend(server.url, keys["alpha"])
    try:
        store.failures = 1
        assert backend.acquire_fenced("job", backend.new_token(), 30, "o") is not None
        posts = _posts(recorder)
        assert len(posts) == 2 and posts[0]["request_id"] == posts[1]["request_id"]
        store.failures = 2
        with pytest.raises(BackendUnavailableError) as failed:
            backend.acquire("other", backend.new_token(), 30, "o")
        cause = failed.value.__cause__
        assert isinstance(cause, requests.HTTPError)
        assert cause.response is not None and cause.response.status_code == 503
        assert len(_posts(recorder)) == 4
    finally:
        backend.close()


def test_other_operations_and_errors_get_one_attempt(rig: Any) -> None:
    recorder, store, server, keys = rig
    backend = HttpBackend(server.url, keys["alpha"])
    try:
        store.failures = 1
        with pytest.raises(BackendUnavailableError):
            backend.inspect("job")
        assert len(recorder.seen) == 1
        for index in range(6):  # spend the acquisitions' budget (6 per window)
            backend.acquire(f"spend{index}", backend.new_token(), 30, "o")
        # 429 is not retried.
        with pytest.raises(RateLimitedError) as limited:
            backend.acquire("job2", backend.new_token(), 30, "o")
        assert limited.value.status == 429 and 1 <= limited.value.retry_after <= 3600
        assert len(_posts(recorder)) == 7
    finally:
        backend.close()


def test_a_lockers_request_id_reaches_the_service(rig: Any) -> None:
    # The HTTP backend is the one RequestIdCarrier: the Locker's request_id= goes through it.
    recorder, _store, server, keys = rig
    backend = HttpBackend(server.url, keys["alpha"])
    assert isinstance(backend, RequestIdCarrier) and not isinstance(backend, ServiceStore)
    request_id = str(uuid.uuid4())
    with Locker(backend, ttl=30) as locker, locker.lock("job", request_id=request_id):
        pass
    [post] = _posts(recorder)
    assert post["request_id"] == request_id


def test_every_call_carries_its_request_id_to_the_service(rig: Any) -> None:
    recorder, _store, server, keys = rig
    backend = HttpBackend(server.url, keys["alpha"])
    ids = {name: str(uuid.uuid4()) for name in ("acquire", "extend", "get", "release", "force")}
    with Locker(backend, ttl=30) as locker:
        lock = locker.acquire("job", request_id=ids["acquire"])
        lock.extend(request_id=ids["extend"])
        assert locker.get("job", request_id=ids["get"]).held
        assert lock.release(request_id=ids["release"]) is True
        locker.acquire("other").release()
        assert locker.force_release("job", request_id=ids["force"]) is False
    seen = {(item["method"], item["path"]): item["request_id"] for item in recorder.seen}
    assert seen[("POST", "/locks/job/lease")] == ids["acquire"]
    assert seen[("PATCH", "/locks/job/lease")] == ids["extend"]
    assert seen[("GET", "/locks/job")] == ids["get"]
    assert seen[("DELETE", "/locks/job/lease")] == ids["release"]
    assert seen[("DELETE", "/locks/job")] == ids["force"]
    # Calls without one get a fresh id each.
    assert seen[("POST", "/locks/other/lease")] not in ids.values()


def test_a_request_id_scope_covers_every_request_of_its_block(rig: Any) -> None:
    recorder, _store, server, keys = rig
    backend = HttpBackend(server.url, keys["alpha"])
    request_id = str(uuid.uuid4())
    with Locker(backend, ttl=30) as locker:
        with backend.request_id_scope(request_id):
            lock = locker.acquire("job")
            lock.extend()
            locker.get("job")
            lock.release()
            locker.force_release("job")
        locker.get("job")
    inside, outside = recorder.seen[:-1], recorder.seen[-1]
    assert [item["method"] for item in inside] == ["POST", "PATCH", "GET", "DELETE", "DELETE"]
    assert all(item["request_id"] == request_id for item in inside)
    assert outside["request_id"] != request_id


def test_a_request_id_that_is_no_uuid_is_refused_before_anything_is_sent(rig: Any) -> None:
    recorder, _store, server, keys = rig
    backend = HttpBackend(server.url, keys["alpha"])
    with Locker(backend, ttl=30) as locker:
        lock = locker.acquire("job")
        before = len(recorder.seen)
        for call in (
            lambda: lock.extend(request_id="not-a-uuid"),
            lambda: lock.release(request_id="not-a-uuid"),
            lambda: locker.get("job", request_id="not-a-uuid"),
            lambda: locker.force_release("job", request_id="not-a-uuid"),
        ):
            with pytest.raises(ValidationError, match="request_id must be a UUID"):
                call()
        assert len(recorder.seen) == before
        assert lock.state == "held"
        lock.release()


def test_a_waiting_acquire_and_acquire_many_send_their_request_id_with_every_request(tmp_path: Path) -> None:
    # docs/backends/http.md: the id goes with all of a call's requests, not only its first.
    keys = make_keys(tmp_path / "keys.toml")
    recorder = RequestRecorder(create_app(MemoryBackend(), tmp_path / "keys.toml"))
    waiting, many = str(uuid.uuid4()), str(uuid.uuid4())
    with ThreadedServer(recorder) as server, Locker(HttpBackend(server.url, keys["alpha"]), ttl=30) as locker:
        holder = locker.acquire("job")
        start = len(recorder.seen)
        got: list[Any] = []
        waiter = threading.Thread(target=lambda: got.append(locker.acquire("job", timeout=60, request_id=waiting)))
        waiter.start()
        # Released once the waiter's first attempt was refused, so that it waits for the key.
        wait_until(lambda: any(item["request_id"] == waiting for item in recorder.seen), "the first attempt")
        holder.release()
        waiter.join(60)
        assert got and got[0].state == "held"
        waited = [item for item in recorder.seen[start:] if item["token"] != holder.token]
        assert len(waited) >= 2 and {item["request_id"] for item in waited} == {waiting}, waited
        got[0].release()
        before = len(recorder.seen)
        locker.acquire_many(["a", "b"], request_id=many).release()
        sent = recorder.seen[before:]
        assert {item["request_id"] for item in sent if item["method"] != "DELETE"} == {many}, sent
