"""The HTTP backend's counting leases beyond the contract: the watching request that repeats a
refused place carries its limit and its grant is taken without another request, and a service
that ignores the limit (it granted the whole key) is caught, its grant given back."""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest
from lease_lock.backends.http import HttpBackend
from lease_lock.backends.memory import MemoryBackend
from lease_lock.errors import ValidationError
from lease_lock.server import create_app
from lease_lock.testing import wait_until

from tests.support.http_server import RequestRecorder, ThreadedServer, make_keys


class _Server:
    def __init__(self, url: str, key: str, recorder: RequestRecorder) -> None:
        self.url = url
        self.key = key
        self.recorder = recorder

    def backend(self) -> HttpBackend:
        return HttpBackend(self.url, self.key)


def _serve(tmp_path: Path, wrap: Callable[[Any], Any] = lambda app: app) -> Iterator[_Server]:
    keys_file = tmp_path / "keys.toml"
    keys = make_keys(keys_file)
    app = create_app(MemoryBackend(), keys_file, rate_limit=10**9)
    recorder = RequestRecorder(wrap(app))
    try:
        with ThreadedServer(recorder) as server:
            yield _Server(server.url, keys["alpha"], recorder)
    finally:
        app.close()


@pytest.fixture
def service(tmp_path: Path) -> Iterator[_Server]:
    yield from _serve(tmp_path)


def _key() -> str:
    return f"count:{uuid.uuid4().hex}"


def test_a_refused_place_is_watched_with_its_limit_and_taken_without_a_request(service: _Server) -> None:
    holder, waiter = service.backend(), service.backend()
    notified: list[str] = []
    watcher = waiter.watch_releases(notified.append)
    try:
        key, first = _key(), holder.new_token()
        assert holder.acquire_counted(key, first, 30, "holder", 2) is not None
        assert holder.acquire_counted(key, holder.new_token(), 30, "holder", 2) is not None
        token = waiter.new_token()
        assert waiter.acquire_counted(key, token, 5, "waiter", 2) is None
        assert holder.release(key, first)
        assert wait_until(lambda: key in notified, 20)
        lease = f"/locks/{key}/lease"
        watched = [seen for seen in service.recorder.seen if seen["path"] == lease and "prefer" in seen["headers"]]
        assert watched and all(json.loads(seen["body"])["limit"] == 2 for seen in watched)
        before = len(service.recorder.seen)
        fence = waiter.acquire_counted(key, token, 5, "waiter", 2)
        assert fence is not None and len(service.recorder.seen) == before  # taken without a request
        assert waiter.is_held(key, token)
        state = holder.inspect(key)
        assert state.limit == 2 and [holder.owner for holder in state.holders] == ["holder", "waiter"]
        assert state.holders[-1].fence == fence
    finally:
        watcher.close()
        holder.close()
        waiter.close()


def _ignoring_limit(app: Any) -> Any:
    """The app behind a proxy that drops ``limit`` from every body, as a service without the
    extension ignores it."""

    def proxy(environ: dict[str, Any], start_response: Any) -> Any:
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        if body:
            fields = json.loads(body)
            fields.pop("limit", None)
            body = json.dumps(fields).encode()
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        return app(environ, start_response)

    return proxy


def test_a_service_that_grants_the_whole_key_instead_of_a_place_is_refused(tmp_path: Path) -> None:
    for server in _serve(tmp_path, _ignoring_limit):
        backend = server.backend()
        try:
            key = _key()
            with pytest.raises(ValidationError, match="does not grant counting leases"):
                backend.acquire_counted(key, backend.new_token(), 30, "o", 2)
            # The exclusive grant it got was given back.
            assert not backend.inspect(key).held
        finally:
            backend.close()
