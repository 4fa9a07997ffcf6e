"""Regression tests for the lock service's defects found under attack, on real servers."""

from __future__ import annotations

import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import requests
from lease_lock.backends.memory import MemoryBackend
from lease_lock.errors import ValidationError
from lease_lock.server import create_app, create_key, list_keys, openapi_document
from lease_lock.testing import wait_until

from tests.support.http_server import ServiceInfo, ThreadedServer, make_keys, start_serve, stop_serve


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _open_idle_sockets(url: str, count: int) -> list[socket.socket]:
    host, port = url.rsplit("/", 1)[1].rsplit(":", 1)
    return [socket.create_connection((host, int(port)), timeout=10) for _ in range(count)]


def test_idle_unauthenticated_sockets_do_not_stop_the_server(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.toml"
    keys = make_keys(keys_file)
    process, url, _log = start_serve(tmp_path, "memory://", keys_file)
    idle = _open_idle_sockets(url, 150)
    try:
        # waitress's own limit of 100 connections made this wait for the idle ones' 120 s.
        answer = requests.get(f"{url}/locks/k", headers=_bearer(keys["alpha"]), timeout=10)
        assert answer.status_code == 200
    finally:
        for sock in idle:
            sock.close()
        stop_serve(process)


def test_silent_and_half_sent_connections_are_closed(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.toml"
    keys = make_keys(keys_file)
    process, url, _log = start_serve(
        tmp_path, "memory://", keys_file, "--connection-limit", "20", "--channel-timeout", "1"
    )
    idle = _open_idle_sockets(url, 25)
    try:
        idle[0].sendall(b"GET /locks/k HTTP/1.1\r\nHost: x\r\n")  # headers never finished
        for sock in idle[:20]:
            sock.settimeout(30)
            assert sock.recv(1024) == b""  # closed by the server, not answered
        answer = requests.get(f"{url}/locks/k", headers=_bearer(keys["alpha"]), timeout=30)
        assert answer.status_code == 200
    finally:
        for sock in idle:
            sock.close()
        stop_serve(process)


def test_a_read_only_key_cannot_starve_the_writers_renewals(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.toml"
    keys = make_keys(keys_file)
    app = create_app(MemoryBackend(), keys_file, rate_limit=5, rate_window=3600)
    with ThreadedServer(app) as server, requests.Session() as writer, requests.Session() as reader:
        writer.headers.update(_bearer(keys["alpha"]))
        reader.headers.update(_bearer(keys["alpha_read"]))
        token = {"X-Volcano-Lock-Token": str(uuid.uuid4())}
        lease = f"{server.url}/locks/job/lease"
        assert writer.post(lease, json={"ttl_seconds": 30}, headers=token, timeout=10).status_code == 201
        statuses = [reader.get(f"{server.url}/locks/job", timeout=10).status_code for _ in range(10)]
        assert statuses.count(429) == 5
        # Writes attempted with the read-only key spend its read budget, not the writers'.
        assert reader.patch(lease, json={"ttl_seconds": 30}, headers=token, timeout=10).status_code == 429
        for _ in range(4):
            assert writer.patch(lease, json={"ttl_seconds": 30}, headers=token, timeout=10).status_code == 200
        assert writer.delete(lease, headers=token, timeout=10).status_code == 204


def test_lease_lock_serve_logs_every_request(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.toml"
    keys = make_keys(keys_file)
    process, url, log = start_serve(tmp_path, "memory://", keys_file, module="lease_lock")
    try:
        answer = requests.get(f"{url}/locks/k", headers=_bearer(keys["alpha"]), timeout=30)
        assert answer.status_code == 200
        assert wait_until(lambda: "GET /locks/{key} -> 200 project=alpha" in log.read_text(), 10)
    finally:
        stop_serve(process)
    text = log.read_text()
    assert all(key.split(".", 1)[1] not in text for key in keys.values())


def test_a_broken_keys_file_is_reported_and_does_not_keep_removed_keys(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.toml"
    keys = make_keys(keys_file)
    process, url, log = start_serve(tmp_path, "memory://", keys_file, module="lease_lock")
    try:
        removed = next(r for r in list_keys(keys_file) if r.project == "beta")
        assert requests.get(f"{url}/locks/k", headers=_bearer(keys["beta"]), timeout=10).status_code == 200
        # The operator deletes beta's key by hand and leaves a typo behind.
        text = keys_file.read_text()
        section = text.index(f"[keys.{removed.id}]")
        end = text.find("[keys.", section + 1)
        edited = text[:section] + (text[end:] if end >= 0 else "") + "\nproject = = typo\n"
        keys_file.write_text(edited)
        assert removed.sha256 not in edited
        assert requests.get(f"{url}/locks/k", headers=_bearer(keys["beta"]), timeout=10).status_code == 401
        assert requests.get(f"{url}/locks/k", headers=_bearer(keys["alpha"]), timeout=10).status_code == 200
        assert wait_until(lambda: "is invalid and was not reloaded" in log.read_text(), 10)
    finally:
        stop_serve(process)


def test_deeply_nested_json_is_a_400(lock_service: ServiceInfo) -> None:
    body = b"[" * 5000 + b"]" * 5000
    answer = requests.post(
        f"{lock_service.url}/locks/nested/lease",
        data=body,
        headers={
            **_bearer(lock_service.keys["alpha"]),
            "X-Volcano-Lock-Token": str(uuid.uuid4()),
            "Content-Type": "application/json",
        },
        timeout=10,
    )
    assert answer.status_code == 400 and answer.json()["code"] == "invalid_request"


@pytest.mark.parametrize("threads", ["0", "-3"])
def test_serve_refuses_a_thread_count_below_one(tmp_path: Path, threads: str) -> None:
    keys_file = tmp_path / "keys.toml"
    make_keys(keys_file)
    done = subprocess.run(
        [sys.executable, "-m", "lease_lock", "serve", "--url", "memory://", "--keys", str(keys_file),
         "--bind", "127.0.0.1:0", "--threads", threads],
        capture_output=True, text=True, timeout=30, check=False,
    )
    assert done.returncode == 2 and "--threads" in done.stderr


def test_head_is_answered_without_a_body_on_a_kept_connection(lock_service: ServiceInfo) -> None:
    key = lock_service.keys["alpha"]
    request = f"/locks/k HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\r\n"
    with _open_idle_sockets(lock_service.url, 1)[0] as sock:
        # Pipelined on one connection: whatever follows the HEAD's headers is the GET's answer.
        sock.sendall(f"HEAD {request}GET {request}".encode())
        data = b""
        while not data.endswith(b'{"held": false}'):
            chunk = sock.recv(65536)
            assert chunk, data
            data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 405 ")
    assert rest.startswith(b"HTTP/1.1 200 "), rest


def test_keys_file_projects_are_validated(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.toml"
    _record, team = create_key(keys_file, "team", "full")
    _record, other = create_key(keys_file, "teamx", "full")
    with ThreadedServer(create_app(MemoryBackend(), keys_file)) as server:
        # A hand edit puts a "/" into a project name: it must never reach into "team"'s locks.
        keys_file.write_text(keys_file.read_text().replace('"teamx"', '"team/x"'))
        with pytest.raises(ValidationError, match="invalid project"):
            list_keys(keys_file)
        token = {"X-Volcano-Lock-Token": str(uuid.uuid4()), **_bearer(other)}
        requests.post(f"{server.url}/locks/secret-job/lease", json={"ttl_seconds": 30}, headers=token, timeout=10)
        listed = requests.get(f"{server.url}/locks", headers=_bearer(team), timeout=10)
        assert listed.status_code == 200 and listed.json() == {"locks": []}
    with pytest.raises(ValidationError, match="invalid project"):
        create_app(MemoryBackend(), keys_file)


def test_the_owner_length_of_the_document_is_the_servers(lock_service: ServiceInfo) -> None:
    post = openapi_document()["paths"]["/locks/{key}/lease"]["post"]
    [owner] = [p for p in post["parameters"] if p.get("name") == "X-Lease-Lock-Owner"]
    longest = owner["schema"]["maxLength"]
    headers = _bearer(lock_service.keys["alpha"])
    for length, status in ((longest, 201), (longest + 1, 400)):
        answer = requests.post(
            f"{lock_service.url}/locks/owner-{length}/lease",
            json={"ttl_seconds": 10},
            headers={**headers, "X-Volcano-Lock-Token": str(uuid.uuid4()), "X-Lease-Lock-Owner": "o" * length},
            timeout=10,
        )
        assert answer.status_code == status, answer.text


def test_serve_refuses_a_keys_file_broken_from_the_start(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.toml"
    keys_file.write_text("[keys.0123456789ab\nproject = 'x'\n")
    done = subprocess.run(
        [sys.executable, "-m", "lease_lock", "serve", "--url", "memory://", "--keys", str(keys_file),
         "--bind", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=30, check=False,
    )
    assert done.returncode == 2 and "keys file" in done.stderr
