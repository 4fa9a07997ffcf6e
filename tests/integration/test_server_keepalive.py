"""Keep-alive: every answer, the bodiless 204s included, leaves the connection open."""

from __future__ import annotations

import http.client
import json
import uuid
from pathlib import Path
from typing import Any, Callable

from lease_lock.backends.http import HttpBackend
from lease_lock.backends.memory import MemoryBackend
from lease_lock.server import create_app

from tests.support.http_server import ThreadedServer, make_keys, start_serve, stop_serve


class PortRecorder:
    """WSGI middleware noting the client port of every request: one port per connection."""

    def __init__(self, app: Callable[..., Any]) -> None:
        self.app = app
        self.ports: list[str] = []

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        self.ports.append(environ["REMOTE_PORT"])
        return self.app(environ, start_response)


def test_a_hundred_client_calls_use_one_server_connection(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.toml"
    keys = make_keys(keys_file)
    recorder = PortRecorder(create_app(MemoryBackend(), keys_file, rate_limit=1000))
    with ThreadedServer(recorder) as server:
        backend = HttpBackend(server.url, keys["alpha"])
        try:
            for index in range(25):
                key, token = f"keep.{index}", backend.new_token()
                assert backend.acquire_fenced(key, token, 30, "o") is not None
                assert backend.extend(key, token, 30)
                assert backend.inspect(key).held
                assert backend.release(key, token)  # a 204
        finally:
            backend.close()
    assert len(recorder.ports) == 100
    assert len(set(recorder.ports)) == 1


def test_lease_lock_serve_never_closes_a_kept_connection(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.toml"
    keys = make_keys(keys_file)
    process, url, _log = start_serve(tmp_path, "memory://", keys_file, "--rate-limit", "1000", module="lease_lock")
    host, port = url.rsplit("/", 1)[1].rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    auth = {"Authorization": f"Bearer {keys['alpha']}", "Content-Type": "application/json"}
    try:
        connection.connect()
        first_socket = connection.sock
        statuses = []
        for index in range(25):
            token = {"X-Volcano-Lock-Token": str(uuid.uuid4())}
            lease = f"/locks/kept.{index}/lease"
            body = json.dumps({"ttl_seconds": 30})
            for method, path, payload in (
                ("POST", lease, body),
                ("PATCH", lease, body),
                ("DELETE", lease, None),
                ("DELETE", f"/locks/kept.{index}", None),
            ):
                connection.request(method, path, body=payload, headers={**auth, **token})
                answer = connection.getresponse()
                answer.read()
                statuses.append(answer.status)
                assert not answer.will_close, (method, answer.status, answer.getheaders())
        assert statuses.count(204) == 50 and statuses.count(201) == 25
        assert connection.sock is first_socket
    finally:
        connection.close()
        stop_serve(process)
