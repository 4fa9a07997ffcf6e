"""Redis through outages: a restart, killed client connections, a stopped or busy server, a reply
lost after the release ran, fork(), redis-py's own URL options, and no password in messages."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any, Callable

import lease_lock
import pytest
import redis
from benchmarks.chaos_harness.proxy import TcpProxy
from lease_lock.backends.base import ExtendRequest
from lease_lock.backends.redis import RedisBackend
from lease_lock.errors import BackendUnavailableError, ValidationError
from lease_lock.testing import wait_until

from tests.support.children import check_forked_children_beside_the_parent
from tests.support.redis_server import RedisFactory, RedisServer

TOKEN = "t" * 32
SECRET = "Sup3rSecretPw"  # noqa: S105 - a made-up password that must never be shown


def _warm_pool(backend: RedisBackend, count: int) -> None:
    """Leave ``count`` connected idle connections in the client's pool."""
    pool = backend.client.connection_pool
    connections = [pool.get_connection() for _ in range(count)]
    for connection in connections:
        connection.connect()
    for connection in connections:
        pool.release(connection)


def _every_call(backend: RedisBackend, index: int) -> dict[str, Callable[[], Any]]:
    key = f"outage:{index}"
    return {
        "acquire": lambda: backend.acquire_fenced(key, TOKEN, 60, "o"),
        "extend": lambda: backend.extend(key, TOKEN, 60),
        "extend_many": lambda: backend.extend_many([ExtendRequest(key, TOKEN, 60)] * 2),
        "get": lambda: backend.inspect(key),
        "is_held": lambda: backend.is_held(key, TOKEN),
        "list": lambda: list(backend.scan(key)),
        "release": lambda: backend.release(key, TOKEN),
    }


def _twenty_of_each(backend: RedisBackend) -> None:
    for index in range(20):
        calls = _every_call(backend, index)
        assert calls["acquire"]() is not None
        assert calls["extend"]() is True
        assert calls["extend_many"]() == [True, True]
        assert calls["get"]().held
        assert calls["is_held"]() is True
        assert [state.key for state in calls["list"]()] == [f"outage:{index}"]
        assert calls["release"]() is True


def test_restart_and_killed_connections_then_every_call_succeeds(private_redis_server: RedisServer) -> None:
    backend = RedisBackend.from_url(private_redis_server.url)
    admin = private_redis_server.client()
    try:
        _twenty_of_each(backend)
        _warm_pool(backend, 5)
        private_redis_server.restart()
        _twenty_of_each(backend)
        _warm_pool(backend, 5)
        admin = private_redis_server.client()
        assert admin.execute_command("CLIENT", "KILL", "TYPE", "normal") >= 5
        _twenty_of_each(backend)
    finally:
        admin.close()
        backend.close()


def test_server_down_is_backend_unavailable_then_recovers(redis_factory: RedisFactory) -> None:
    server = redis_factory.server("--requirepass", SECRET)
    backend = RedisBackend.from_url(f"redis://:{SECRET}@127.0.0.1:{server.port}/0")
    try:
        assert backend.acquire_fenced("outage:0", TOKEN, 60, "o") is not None
        server.stop()
        for name, call in _every_call(backend, 0).items():
            with pytest.raises(BackendUnavailableError) as caught:
                call()
            error = caught.value
            assert error.backend == "redis", name
            assert isinstance(error.__cause__, redis.ConnectionError), name
            assert "Redis" in str(error), name
            assert SECRET not in str(error) and SECRET not in repr(error), name
        server.start()
        # Without persistence the restarted server starts empty; the backend works again.
        _twenty_of_each(backend)
    finally:
        backend.close()
        server.stop()


def test_a_wrong_password_passes_through(redis_factory: RedisFactory) -> None:
    server = redis_factory.server("--requirepass", SECRET)
    backend = RedisBackend.from_url(f"redis://:wrong@127.0.0.1:{server.port}/0")
    try:
        with pytest.raises(redis.AuthenticationError):
            backend.acquire("k", TOKEN, 60, "o")
    finally:
        backend.close()
        server.stop()


def test_a_server_busy_running_a_script_is_unavailable(private_redis_server: RedisServer) -> None:
    admin = private_redis_server.client()
    admin.config_set("busy-reply-threshold", 50)
    backend = RedisBackend.from_url(private_redis_server.url)
    busy = private_redis_server.client()
    try:
        assert backend.acquire("busy", TOKEN, 60, "o")
        endings: list[BaseException] = []

        def spin() -> None:
            try:
                busy.eval("while true do end", 0)
            except redis.ResponseError as exc:  # "Script killed by user"
                endings.append(exc)

        stuck = threading.Thread(target=spin, daemon=True)
        stuck.start()
        caught: list[BaseException] = []

        def refused() -> bool:
            try:
                backend.is_held("busy", TOKEN)
            except BackendUnavailableError as exc:
                caught.append(exc)
                return True
            return False

        assert wait_until(refused, 30)
        assert "BUSY" in str(caught[0]) and isinstance(caught[0].__cause__, redis.ResponseError)
        assert wait_until(lambda: _kill_script(private_redis_server), 30)
        stuck.join(30)
        assert len(endings) == 1
        assert backend.is_held("busy", TOKEN)
    finally:
        busy.close()
        admin.close()
        backend.close()


def _kill_script(server: RedisServer) -> bool:
    client = server.client()
    try:
        client.script_kill()
        return True
    except redis.ResponseError:
        return False
    finally:
        client.close()


@pytest.mark.parametrize(
    "url",
    [
        f"redis://:{SECRET}@127.0.0.1:99999/0",
        f"redis://:{SECRET}@127.0.0.1:notaport/0",
        f"redis://:{SECRET}@127.0.0.1:6379/abc",
        f"rediss://user:{SECRET}@127.0.0.1:99999/0",
        f"redis://:{SECRET}@127.0.0.1:6379/0?nope=1",
        f"redis://:{SECRET}@127.0.0.1:6379/0?protocol=9",
    ],
)
def test_bad_urls_never_show_the_password(url: str) -> None:
    for build in (RedisBackend.from_url, lease_lock.connect):
        with pytest.raises(ValidationError) as caught:
            build(url)
        error: BaseException | None = caught.value
        while error is not None:
            for text in (str(error), repr(error)):
                assert SECRET not in text, text
            error = error.__cause__ or error.__context__


def test_redis_py_url_options_pass_through(redis_server: RedisServer) -> None:
    base = redis_server.url
    backend = RedisBackend.from_url(
        f"{base}?max_connections=5&protocol=3&retry_on_timeout=true&socket_keepalive=true"
    )
    try:
        pool = backend.client.connection_pool
        assert pool.max_connections == 5
        assert pool.connection_kwargs["protocol"] == 3
        assert pool.connection_kwargs["socket_keepalive"] is True
        key = f"options:{uuid.uuid4().hex}"
        fence = backend.acquire_fenced(key, TOKEN, 60, "o")
        assert fence is not None and backend.inspect(key).fence == fence
        assert backend.release(key, TOKEN)
    finally:
        backend.close()
    # TLS options reach a TLS client (built, not connected: no TLS server here).
    tls = RedisBackend.from_url("rediss://127.0.0.1:6380/0?ssl_check_hostname=false&ssl_cert_reqs=none")
    try:
        assert tls.client.connection_pool.connection_kwargs["ssl_check_hostname"] is False
    finally:
        tls.close()


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("max_connections=0", "max_connections"),
        ("protocol=4", "protocol"),
        ("retry_on_timeout=maybe", "retry_on_timeout"),
        ("ssl_check_hostname=false", "rediss://"),
        ("no_such_option=1", "unknown redis URL option 'no_such_option'"),
    ],
)
def test_url_options_are_still_checked(redis_server: RedisServer, query: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        RedisBackend.from_url(f"{redis_server.url}?{query}")


def test_a_release_whose_reply_was_lost_is_not_a_loss(private_redis_server: RedisServer) -> None:
    proxy = TcpProxy("127.0.0.1", private_redis_server.port)
    backend = RedisBackend.from_url(f"redis://127.0.0.1:{proxy.port}/0")
    admin = private_redis_server.client()
    try:
        assert backend.acquire("lost-reply", TOKEN, 60, "o")
        # Load the release script first: a NOSCRIPT reply would be the one held back.
        assert backend.release("lost-reply:other", TOKEN) is False
        # Writes wait while the server is paused: the release reaches the server and waits.
        admin.execute_command("CLIENT", "PAUSE", 20000, "WRITE")
        answers: list[bool] = []
        releaser = threading.Thread(target=lambda: answers.append(backend.release("lost-reply", TOKEN)))
        releaser.start()
        assert wait_until(
            lambda: any(
                "flags=b" in line and "cmd=evalsha" in line
                for line in admin.execute_command("CLIENT", "LIST").decode().splitlines()
            ),
            30,
        )
        # Hold the reply in the proxy, let the release run, then reset the connection.
        proxy.stall()
        admin.execute_command("CLIENT", "UNPAUSE")
        assert wait_until(lambda: admin.exists("lost-reply") == 0, 30)
        proxy.cut()
        proxy.resume()
        releaser.join(30)
        assert answers == [True]
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")
        admin.close()
        backend.close()
        proxy.close()


def _child_cycles(backend: RedisBackend, server: RedisServer, index: int) -> int:
    """Grant and release keys many times; return how many answers Redis contradicts."""
    check = server.client()
    wrong = 0
    try:
        for cycle in range(60):
            key = f"fork:{cycle % 3}"
            token = f"c{index}-{cycle}-{uuid.uuid4().hex}"
            while (fence := backend.acquire_fenced(key, token, 30, f"child-{index}")) is None:
                time.sleep(0.001)
            if check.get(key) != f"{token}|{fence}|child-{index}".encode():
                wrong += 1
            if not backend.release(key, token):
                wrong += 1
    finally:
        check.close()
    return wrong


def test_forked_children_never_use_the_parents_connection(private_redis_server: RedisServer) -> None:
    backend = RedisBackend.from_url(private_redis_server.url)
    try:
        check_forked_children_beside_the_parent(
            backend, lambda index: _child_cycles(backend, private_redis_server, index), TOKEN
        )
    finally:
        backend.close()


def test_sentinel_url_takes_redis_py_options(redis_factory: RedisFactory) -> None:
    primary = redis_factory.server()
    sentinel = redis_factory.sentinel(primary, "leases")
    url = f"redis+sentinel://127.0.0.1:{sentinel.port}/leases/1?db=3&max_connections=4&protocol=3"
    backend = RedisBackend.from_url(url)
    direct = primary.client(db=3)
    try:
        assert backend.db == 3
        assert backend.client.connection_pool.max_connections == 4
        assert backend.acquire("sentinel-options", TOKEN, 30, "o")
        assert direct.get("sentinel-options") == f"{TOKEN}||o".encode()
        assert backend.release("sentinel-options", TOKEN)
    finally:
        direct.close()
        backend.close()


def test_a_write_to_a_replica_is_unavailable_and_reads_still_work(redis_factory: RedisFactory) -> None:
    primary = redis_factory.server()
    replica = redis_factory.replica(primary)
    backend = RedisBackend.from_url(replica.url)
    try:
        # What a client still talking to a demoted primary sees after a failover.
        with pytest.raises(BackendUnavailableError) as caught:
            backend.acquire("readonly", TOKEN, 30, "o")
        assert isinstance(caught.value.__cause__, redis.exceptions.ReadOnlyError)
        assert backend.is_held("readonly", TOKEN) is False
    finally:
        backend.close()
        replica.stop()
        primary.stop()
