"""The Flask extension, driven by Flask's own test client, on a real backend (a SQLite file and
the tests' Redis server)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import urllib.parse
import uuid
from pathlib import Path
from typing import Any, Callable, Optional

import psycopg2
import pytest
from flask import Flask, jsonify
from lease_lock import Locker, LockHeldError, LockStateError, MemoryBackend, ValidationError
from lease_lock.contrib.flask import LeaseLock, locker


def make_app(*, inside: Optional[Callable[[str], Any]] = None, instance_path: Optional[str] = None,
             **config: Any) -> Flask:
    """An app with one locking view; ``inside(key)`` is called while the view holds its lock
    and its answer is returned as ``seen``."""
    app = Flask(__name__, instance_path=instance_path)
    app.config.update(config)

    @app.post("/orders/<int:order_id>/settle")
    def settle(order_id: int) -> Any:
        try:
            with locker.lock(f"order:{order_id}", blocking=False) as lock:
                seen = None if inside is None else inside(lock.key)
                return jsonify(key=lock.key, held=locker.get(f"order:{order_id}").held, seen=seen)
        except LockHeldError:
            return jsonify(busy=True), 409

    return app


@pytest.fixture
def no_env_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LEASE_LOCK_URL", raising=False)


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
    assert answer.get_json() == {"key": "shop:order:1", "held": True, "seen": None}
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


def test_a_misspelt_or_wrong_setting_is_named_as_the_app_config_key() -> None:
    # As Django's settings check: a typo is not ignored, a bad value names its setting.
    with pytest.raises(ValidationError, match=r"unknown key\(s\) LEASE_LOCK_TTLL; known: .*LEASE_LOCK_TTL"):
        LeaseLock(make_app(LEASE_LOCK_URL="memory://", LEASE_LOCK_TTLL=30))
    with pytest.raises(ValidationError, match=r'^app.config\["LEASE_LOCK_TTL"\]: ttl must be'):
        LeaseLock(make_app(LEASE_LOCK_URL="memory://", LEASE_LOCK_TTL="30"))
    with pytest.raises(ValidationError, match=r'^app.config\["LEASE_LOCK_OPTIONS"\]\["max_hold"\]: max_hold must'):
        LeaseLock(make_app(LEASE_LOCK_URL="memory://", LEASE_LOCK_OPTIONS={"max_hold": -1}))


def test_only_a_postgres_sqlalchemy_uri_puts_the_lock_in_that_database(no_env_url: None, postgres_server: Any) -> None:
    parts = urllib.parse.urlsplit(postgres_server.url)
    uri = urllib.parse.urlunsplit(("postgresql+psycopg2", parts.netloc, parts.path, parts.query, ""))
    prefix = f"flask-{uuid.uuid4().hex[:8]}:"

    def row(key: str) -> Any:
        with psycopg2.connect(postgres_server.dsn) as connection, connection.cursor() as cursor:
            cursor.execute("SELECT key, owner FROM lease_lock WHERE key = %s", (key,))
            found = cursor.fetchone()
        connection.close()
        return None if found is None else list(found)

    app = make_app(inside=row, SQLALCHEMY_DATABASE_URI=uri, LEASE_LOCK_KEY_PREFIX=prefix)
    LeaseLock(app)
    built = app.extensions["lease_lock"]
    try:
        assert type(built.backend).__name__ == "PostgresBackend"
        answer = app.test_client().post("/orders/5/settle").get_json()
        assert answer["seen"] == [prefix + "order:5", built.owner]
        assert row(prefix + "order:5") is None
    finally:
        built.close()


def test_a_sqlite_file_uri_is_used_from_the_instance_folder_with_one_warning(
    no_env_url: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="lease_lock")
    instance = tmp_path / "instance"
    instance.mkdir()
    apps = [make_app(instance_path=str(instance), SQLALCHEMY_DATABASE_URI="sqlite:///site.db") for _ in range(2)]
    for app in apps:
        LeaseLock(app)
    try:
        assert apps[0].test_client().post("/orders/6/settle").get_json()["held"] is True
        assert (instance / "site.db").exists()
        warnings = [record for record in caplog.records if "this host only" in record.getMessage()]
        assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
        assert str(instance / "site.db") in warnings[0].getMessage()
    finally:
        for app in apps:
            app.extensions["lease_lock"].close()


def test_the_one_host_warning_reaches_a_default_apps_log(tmp_path: Path) -> None:
    # A plain interpreter and an app that configured no logging, as `flask run` starts one: the
    # WARNING must reach its error output, not a handler that swallows it.
    root = Path(__file__).resolve().parents[2]
    environment = {**os.environ, "PYTHONPATH": str(root), "LEASE_LOCK_URL": f"sqlite:///{tmp_path / 'locks.db'}"}
    program = (
        "from flask import Flask\n"
        "from lease_lock.contrib.flask import LeaseLock, locker\n"
        "app = Flask('shop')\n"
        "LeaseLock(app)\n"
        "with app.app_context(), locker.lock('order:1'):\n"
        "    pass\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", program], cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert "this host only" in completed.stderr and str(tmp_path / "locks.db") in completed.stderr


def test_no_store_anywhere_fails_init_app_naming_the_settings(no_env_url: None) -> None:
    for config in ({}, {"SQLALCHEMY_DATABASE_URI": "sqlite://"}, {"SQLALCHEMY_DATABASE_URI": "mysql://db/shop"}):
        app = make_app(**config)
        with pytest.raises(ValidationError, match=r"LEASE_LOCK_URL.*SQLALCHEMY_DATABASE_URI"):
            LeaseLock(app)
        assert "lease_lock" not in app.extensions


def test_the_environment_comes_before_the_database(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEASE_LOCK_URL", "memory://")
    app = make_app(SQLALCHEMY_DATABASE_URI="postgresql://127.0.0.1:1/none")
    LeaseLock(app)
    assert type(app.extensions["lease_lock"].backend).__name__ == "MemoryBackend"


def test_an_option_the_backend_does_not_take_fails_init_app_before_connecting() -> None:
    # Port 1 answers nothing: the check must not need the server.
    app = make_app(LEASE_LOCK_URL="redis://127.0.0.1:1/0", LEASE_LOCK_OPTIONS={"table": "locks"})
    with pytest.raises(ValidationError, match=r"table.*redis://"):
        LeaseLock(app)


def test_a_view_may_let_several_requests_hold_a_key_with_limit() -> None:
    app = Flask(__name__)
    LeaseLock(app, locker=Locker(MemoryBackend()))

    @app.post("/exports")
    def export() -> Any:
        # At most two exports at once: a third request is turned away while both run.
        lock = locker.try_acquire("exports", limit=2)
        if lock is None:
            return jsonify(busy=True), 429
        with lock:
            return jsonify(places=len(locker.get("exports").holders))

    with app.app_context():
        held = locker.acquire("exports", limit=2)
        assert app.test_client().post("/exports").get_json() == {"places": 2}
        also = locker.acquire("exports", limit=2)
        assert app.test_client().post("/exports").status_code == 429
        assert held.is_held() and also.is_held()
        with pytest.raises(ValidationError, match="limit must be an int from 1"):
            locker.lock("exports", limit=0)
        held.release()
        also.release()
        locker.close()
