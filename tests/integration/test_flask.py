"""The Flask extension, driven by Flask's own test client, on a real backend (a SQLite file and
the tests' Redis server)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from flask import Flask, jsonify
from lease_lock import Locker, LockHeldError, LockStateError, MemoryBackend, ValidationError
from lease_lock.contrib.flask import LeaseLock, locker


def make_app(**config: Any) -> Flask:
    app = Flask(__name__)
    app.config.update(config)

    @app.post("/orders/<int:order_id>/settle")
    def settle(order_id: int) -> Any:
        try:
            with locker.lock(f"order:{order_id}", blocking=False) as lock:
                return jsonify(key=lock.key, held=locker.get(f"order:{order_id}").held)
        except LockHeldError:
            return jsonify(busy=True), 409

    return app


def test_config_builds_the_locker_and_the_view_locks(tmp_path: Path) -> None:
    app = make_app(
        LEASE_LOCK_URL=f"sqlite:///{tmp_path}/locks.db", LEASE_LOCK_TTL=7, LEASE_LOCK_MAX_HOLD=60,
        LEASE_LOCK_KEY_PREFIX="shop:", LEASE_LOCK_FENCING=True,
    )
    LeaseLock(app)
    built = app.extensions["lease_lock"]
    assert isinstance(built, Locker)
    assert (built.ttl, built.max_hold, built.key_prefix, built.fencing) == (7.0, 60.0, "shop:", True)
    client = app.test_client()
    answer = client.post("/orders/1/settle")
    assert answer.status_code == 200
    assert answer.get_json() == {"key": "shop:order:1", "held": True}
    held = built.acquire("order:1")
    try:
        assert client.post("/orders/1/settle").status_code == 409
    finally:
        held.release()
    assert client.post("/orders/1/settle").status_code == 200
    built.close()


def test_init_app_serves_several_apps_on_redis(redis_server: Any) -> None:
    extension = LeaseLock()
    prefix = f"flask-{uuid.uuid4().hex[:8]}:"
    first = make_app(LEASE_LOCK_URL=redis_server.url, LEASE_LOCK_KEY_PREFIX=prefix + "a:")
    second = make_app(LEASE_LOCK_URL=redis_server.url, LEASE_LOCK_KEY_PREFIX=prefix + "b:")
    extension.init_app(first)
    extension.init_app(second)
    assert first.extensions["lease_lock"] is not second.extensions["lease_lock"]
    assert type(first.extensions["lease_lock"].backend).__name__ == "RedisBackend"
    # Each app's requests reach that app's locker through the one proxy.
    assert first.test_client().post("/orders/2/settle").get_json()["key"] == prefix + "a:order:2"
    assert second.test_client().post("/orders/2/settle").get_json()["key"] == prefix + "b:order:2"
    with first.app_context():
        assert extension.locker is first.extensions["lease_lock"]
    for app in (first, second):
        app.extensions["lease_lock"].close()


def test_an_explicit_locker_is_shared_and_contends_across_apps() -> None:
    shared = Locker(MemoryBackend())
    first, second = make_app(), make_app()
    LeaseLock(first, locker=shared)
    LeaseLock(second, locker=shared)
    with shared.lock("order:3"):
        assert first.test_client().post("/orders/3/settle").status_code == 409
        assert second.test_client().post("/orders/3/settle").status_code == 409
    assert first.test_client().post("/orders/3/settle").status_code == 200
    shared.close()


def test_misuse_is_reported() -> None:
    app = make_app()
    with app.app_context(), pytest.raises(LockStateError, match="init_app"):
        locker.get("x")
    with pytest.raises(ValidationError, match="ttl"):
        LeaseLock(make_app(LEASE_LOCK_URL="memory://", LEASE_LOCK_TTL=0))
    with pytest.raises(ValidationError, match="given twice"):
        LeaseLock(make_app(LEASE_LOCK_URL="memory://", LEASE_LOCK_TTL=5, LEASE_LOCK_OPTIONS={"ttl": 5}))
    LeaseLock(app, locker=Locker(MemoryBackend()))
    with pytest.raises(LockStateError, match="already"):
        LeaseLock(app)
