"""Operating ``lease-lock serve``: health and readiness, metrics, access logs, oversized requests."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import requests
from lease_lock.testing import wait_until
from prometheus_client.parser import text_string_to_metric_families

from tests.support.http_server import ServiceInfo, make_keys, start_serve, stop_serve
from tests.support.redis_server import RedisFactory


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_health_and_readiness_follow_the_store(tmp_path: Path, redis_factory: RedisFactory) -> None:
    redis = redis_factory.server()
    keys_file = tmp_path / "keys.toml"
    make_keys(keys_file)
    process, url, _log = start_serve(tmp_path, redis.url, keys_file, module="lease_lock")
    try:
        for route, body in (("healthz", {"status": "ok"}), ("readyz", {"status": "ready"})):
            answer = requests.get(f"{url}/{route}", timeout=10)  # no service key
            assert answer.status_code == 200 and answer.json() == body
        redis.stop()
        assert requests.get(f"{url}/healthz", timeout=30).status_code == 200
        unready = requests.get(f"{url}/readyz", timeout=30)
        assert unready.status_code == 503 and unready.json()["code"] == "unavailable"
        redis.start()
        assert wait_until(lambda: requests.get(f"{url}/readyz", timeout=30).status_code == 200, 30)
    finally:
        stop_serve(process)


def test_metrics_are_prometheus_text_without_secrets_or_lock_names(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.toml"
    keys = make_keys(keys_file)
    process, url, _log = start_serve(
        tmp_path, "memory://", keys_file, "--metrics", "--rate-limit", "3", module="lease_lock"
    )
    token = str(uuid.uuid4())
    try:
        with requests.Session() as alpha:
            alpha.headers.update(_bearer(keys["alpha"]))
            lease = f"{url}/locks/secret-job-name/lease"
            granted = alpha.post(lease, json={"ttl_seconds": 30}, headers={"X-Volcano-Lock-Token": token}, timeout=10)
            assert granted.status_code == 201
            statuses = [alpha.get(f"{url}/locks/secret-job-name", timeout=10).status_code for _ in range(5)]
            assert statuses == [200, 200, 200, 429, 429]
        text = requests.get(f"{url}/metrics", timeout=10).text
    finally:
        stop_serve(process)
    assert "secret-job-name" not in text and token not in text
    assert all(key.split(".", 1)[1] not in text for key in keys.values())
    families = {family.name: family for family in text_string_to_metric_families(text)}
    served = {
        (s.labels["route"], s.labels["method"], s.labels["status"], s.labels["project"]): s.value
        for s in families["lease_lock_requests"].samples
    }
    assert served[("/locks/{key}/lease", "POST", "201", "alpha")] == 1
    assert served[("/locks/{key}", "GET", "200", "alpha")] == 3
    assert served[("/locks/{key}", "GET", "429", "alpha")] == 2
    [limited] = families["lease_lock_rate_limited"].samples
    assert limited.labels == {"project": "alpha"} and limited.value == 2
    counts = [s for s in families["lease_lock_request_duration_seconds"].samples if s.name.endswith("_count")]
    assert {s.labels["route"]: s.value for s in counts}["/locks/{key}"] == 5
    assert families["lease_lock_waits_current"].samples[0].value == 0
    assert families["lease_lock_store_errors"].samples[0].value == 0


def test_metrics_are_off_unless_asked_for(lock_service: ServiceInfo) -> None:
    assert requests.get(f"{lock_service.url}/metrics", timeout=10).status_code != 200


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_one_access_line_per_request_with_a_request_id(tmp_path: Path, log_format: str) -> None:
    keys_file = tmp_path / "keys.toml"
    keys = make_keys(keys_file)
    process, url, log = start_serve(tmp_path, "memory://", keys_file, "--log-format", log_format, module="lease_lock")
    token, mine = str(uuid.uuid4()), str(uuid.uuid4())
    try:
        headers = {**_bearer(keys["alpha"]), "X-Volcano-Lock-Token": token, "X-Volcano-Request-Id": mine}
        granted = requests.post(f"{url}/locks/job/lease", json={"ttl_seconds": 10}, headers=headers, timeout=10)
        assert granted.status_code == 201 and granted.headers["X-Volcano-Request-Id"] == mine
        anonymous = requests.get(f"{url}/locks/job", timeout=10)
        assert anonymous.status_code == 401
        assigned = anonymous.headers["X-Volcano-Request-Id"]
        assert str(uuid.UUID(assigned)) == assigned
        assert wait_until(lambda: assigned in log.read_text(), 10)
    finally:
        stop_serve(process)
    text = log.read_text()
    assert token not in text and "Bearer" not in text
    assert all(key.split(".", 1)[1] not in text for key in keys.values())
    access = [line for line in text.splitlines() if "/locks/{key}" in line]
    assert len(access) == 2
    if log_format == "json":
        entries = [json.loads(line) for line in access]
        assert [(e["method"], e["route"], e["status"], e["project"], e["request_id"]) for e in entries] == [
            ("POST", "/locks/{key}/lease", 201, "alpha", mine),
            ("GET", "/locks/{key}", 401, "-", assigned),
        ]
        assert all(isinstance(e["duration_ms"], float) for e in entries)
    else:
        assert f"POST /locks/{{key}}/lease -> 201 project=alpha request_id={mine}" in access[0]
        assert f"GET /locks/{{key}} -> 401 project=- request_id={assigned}" in access[1]


def test_log_level_warning_leaves_out_access_lines_but_not_errors(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.toml"
    keys = make_keys(keys_file)
    process, url, log = start_serve(tmp_path, "memory://", keys_file, "--log-level", "warning", module="lease_lock")
    try:
        headers = {**_bearer(keys["alpha"]), "X-Volcano-Lock-Token": str(uuid.uuid4())}
        granted = requests.post(f"{url}/locks/job/lease", json={"ttl_seconds": 10}, headers=headers, timeout=10)
        assert granted.status_code == 201
        assert requests.get(f"{url}/locks/job", timeout=10).status_code == 401
        # An error still reaches the log: a keys file the operator broke by hand.
        keys_file.write_text(keys_file.read_text() + "\nproject = = typo\n")
        assert requests.get(f"{url}/locks/job", headers=_bearer(keys["alpha"]), timeout=10).status_code == 200
        assert wait_until(lambda: "is invalid and was not reloaded" in log.read_text(), 10)
    finally:
        stop_serve(process)
    assert "/locks/{key}" not in log.read_text()


def test_oversized_bodies_and_headers_get_json_errors(lock_service: ServiceInfo) -> None:
    headers = {**_bearer(lock_service.keys["alpha"]), "X-Volcano-Lock-Token": str(uuid.uuid4())}
    for size, status in ((20 * 1024, 413), (2 * 1024 * 1024, 413)):
        answer = requests.post(
            f"{lock_service.url}/locks/big/lease",
            data=b"x" * size,
            headers={**headers, "Content-Type": "application/json"},
            timeout=30,
        )
        assert answer.status_code == status
        assert answer.headers["Content-Type"] == "application/json"
        assert answer.json()["code"] == "payload_too_large"
    huge = requests.get(
        f"{lock_service.url}/locks/big", headers={**headers, "X-Padding": "p" * (100 * 1024)}, timeout=30
    )
    assert huge.status_code == 431 and huge.json()["code"] == "headers_too_large"
    assert huge.headers["Content-Type"] == "application/json"


def test_the_clients_request_id_is_echoed_and_logged_on_every_answer(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.toml"
    keys = make_keys(keys_file)
    process, url, log = start_serve(tmp_path, "memory://", keys_file, "--rate-limit", "2", module="lease_lock")
    sent: dict[str, int] = {}
    try:
        def call(method: str, path: str, status: int, **headers: str) -> None:
            mine = str(uuid.uuid4())
            answer = requests.request(
                method, f"{url}{path}", headers={**headers, "X-Volcano-Request-Id": mine}, timeout=10
            )
            assert answer.status_code == status, answer.text
            assert answer.headers["X-Volcano-Request-Id"] == mine
            sent[mine] = status

        call("GET", "/healthz", 200)
        call("GET", "/locks/job", 401)
        call("GET", "/locks/job", 401, Authorization="Bearer llk_nope.nope")
        call("GET", "/locks/job", 200, **_bearer(keys["alpha"]))
        call("GET", "/locks/job", 200, **_bearer(keys["alpha"]))
        call("GET", "/locks/job", 429, **_bearer(keys["alpha"]))  # the read budget of 2 is spent
        call("GET", "/nowhere", 401)
        # An id that is no UUID is neither echoed nor trusted: a fresh one names the answer.
        bad = requests.get(f"{url}/locks/job", headers={"X-Volcano-Request-Id": "nope"}, timeout=10)
        assert bad.status_code == 401 and bad.headers["X-Volcano-Request-Id"] != "nope"
        assert wait_until(lambda: all(mine in log.read_text() for mine in sent), 10)
    finally:
        stop_serve(process)
    lines = log.read_text().splitlines()
    for mine, status in sent.items():
        (line,) = [line for line in lines if mine in line]
        assert f"-> {status} " in line and f"request_id={mine}" in line
