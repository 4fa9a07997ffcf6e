"""The rest of the library on an etcd cluster: the Flask extension configured with an
``etcd://`` URL, leader election with fenced terms, RQ's ``enqueue_once`` with the locks on
etcd, and the lock service's adoption over an etcd store."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import lease_lock
import pytest
from flask import Flask, jsonify
from lease_lock.backends.etcd import EtcdBackend
from lease_lock.backends.http import HttpBackend
from lease_lock.contrib.flask import LeaseLock, locker

from tests.integration.test_rq import check_enqueue_once_with_locks_on
from tests.support.etcd_server import EtcdCluster
from tests.support.http_server import make_keys, start_serve, stop_serve


def test_the_flask_extension_locks_on_etcd(etcd_cluster: EtcdCluster) -> None:
    app = Flask(__name__)
    app.config.update(LEASE_LOCK_URL=etcd_cluster.url, LEASE_LOCK_TTL=10)
    key = f"flask-etcd:{uuid.uuid4().hex[:8]}"

    @app.post("/settle")
    def settle() -> object:
        with locker.lock(key, blocking=False) as lock:
            return jsonify(held=locker.get(key).held, fence=lock.fence)

    built = lease_lock.connect(etcd_cluster.url, ttl=10)
    LeaseLock(app, locker=built)
    try:
        answer = app.test_client().post("/settle").get_json()
        assert answer["held"] is True
        with app.app_context():
            assert locker.get(key).held is False
    finally:
        built.close()


def test_the_flask_extension_builds_its_locker_from_an_etcd_url(etcd_cluster: EtcdCluster) -> None:
    app = Flask(__name__)
    app.config.update(LEASE_LOCK_URL=etcd_cluster.url)
    LeaseLock(app)
    with app.app_context():
        try:
            assert isinstance(locker.backend, EtcdBackend)
            assert locker.backend.endpoints == etcd_cluster.endpoints
        finally:
            locker.close()


def test_leadership_passes_with_a_larger_fence(etcd_cluster: EtcdCluster) -> None:
    key = f"leader-etcd:{uuid.uuid4().hex[:8]}"
    first = lease_lock.connect(etcd_cluster.url, ttl=5, fencing=True)
    second = lease_lock.connect(etcd_cluster.url, ttl=5, fencing=True)
    try:
        one = first.elect(key)
        assert one.wait(30)
        two = second.elect(key)
        assert not two.wait(1.0)
        term = one.fence
        assert term is not None
        one.resign()
        assert two.wait(30)
        assert two.fence is not None and two.fence > term
        two.close()
        one.close()
    finally:
        first.close()
        second.close()


def test_enqueue_once_runs_one_job_per_key_with_its_locks_on_etcd(
    etcd_cluster: EtcdCluster, redis_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    check_enqueue_once_with_locks_on(etcd_cluster.url, redis_server, monkeypatch)


def test_the_service_adopts_a_claim_over_an_etcd_store(etcd_cluster: EtcdCluster, tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.toml"
    keys = make_keys(keys_file)
    process, url, _log = start_serve(tmp_path, etcd_cluster.url, keys_file)
    client = HttpBackend(url, keys["alpha"])
    try:
        key = f"served-adopt-{uuid.uuid4().hex[:8]}"
        claim, run, late = client.new_token(), client.new_token(), client.new_token()
        assert client.acquire_fenced(key, claim, 30, "claim:1") is not None
        claimed = client.inspect(key).fence
        fence = client.adopt(key, claim, run, 30, "run:1")
        assert fence is not None and claimed is not None and fence > claimed
        assert client.is_held(key, run) and not client.is_held(key, claim)
        assert client.inspect(key).owner == "run:1"
        # A second delivery of the same claim finds it adopted.
        assert client.adopt(key, claim, late, 30, "late:1") is None
        assert client.release(key, run)
    finally:
        client.close()
        stop_serve(process)
