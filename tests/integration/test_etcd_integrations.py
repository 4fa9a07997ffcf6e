"""The rest of the library on an etcd cluster: the Flask extension configured with an
``etcd://`` URL, and leader election with fenced terms."""

from __future__ import annotations

import uuid

import lease_lock
from flask import Flask, jsonify
from lease_lock.backends.etcd import EtcdBackend
from lease_lock.contrib.flask import LeaseLock, locker

from tests.support.etcd_server import EtcdCluster


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
