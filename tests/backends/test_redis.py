"""The Redis backend on a private real redis-server (the proof) and on fakeredis (for speed)."""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from lease_lock.backends import backend_from_url
from lease_lock.backends.base import ExtendRequest
from lease_lock.backends.redis import RedisBackend, fence_key, hash_tag, is_fence_key
from lease_lock.errors import BackendUnavailableError, ValidationError
from lease_lock.testing import BackendContract, ServiceStoreContract, wait_until

from tests.support.redis_server import RedisServer

TOKEN_A = "a" * 32
TOKEN_B = "b" * 32


@pytest.fixture
def client(redis_server: RedisServer) -> Iterator[Any]:
    connection = redis_server.client()
    yield connection
    connection.close()


@pytest.fixture
def backend(client: Any) -> Iterator[RedisBackend]:
    backend = RedisBackend(client)
    yield backend
    backend.close()


@pytest.fixture
def key() -> str:
    return f"test:{uuid.uuid4().hex}"


class TestRedisBackend(BackendContract, ServiceStoreContract):
    @pytest.fixture
    def backend(self, redis_server: RedisServer) -> Iterator[RedisBackend]:
        backend = RedisBackend.from_url(redis_server.url)
        yield backend
        backend.close()


class TestFakeRedisBackend(BackendContract, ServiceStoreContract):
    @pytest.fixture
    def backend(self) -> Iterator[RedisBackend]:
        import fakeredis

        backend = RedisBackend(fakeredis.FakeRedis())
        yield backend
        backend.close()


# -- storage layout ---------------------------------------------------------------------------


def test_lease_is_the_key_itself(backend: RedisBackend, client: Any, key: str) -> None:
    assert backend.acquire(key, TOKEN_A, 30, "worker:1")
    assert 29_000 < client.pttl(key) <= 30_000
    assert client.get(key) == f"{TOKEN_A}||worker:1".encode()
    state = backend.inspect(key)
    assert state.owner == "worker:1" and state.fence is None
    assert state.expires_in is not None and 29 < state.expires_in <= 30


def test_fence_is_server_microseconds_and_exact(
    backend: RedisBackend, client: Any, key: str
) -> None:
    seconds, micros = client.time()
    fence = backend.acquire_fenced(key, TOKEN_A, 30, "o")
    assert fence is not None
    # A double printed with %g or tostring would end in zeros or be rounded; the fence is an
    # exact integer at least the server time in microseconds and below 2**53.
    assert seconds * 1_000_000 + micros <= fence < 2**53
    assert int(client.get(fence_key(key))) == fence
    assert client.get(key) == f"{TOKEN_A}|{fence}|o".encode()
    # The counter expires a day after the grant, so idle keys leave nothing behind.
    assert 86_000_000 < client.pttl(fence_key(key)) <= 86_400_000


def test_counter_outlives_a_lease_longer_than_a_day(
    backend: RedisBackend, client: Any, key: str
) -> None:
    assert backend.acquire_fenced(key, TOKEN_A, 2 * 86_400, "o")
    assert client.pttl(fence_key(key)) > 86_400_000


def test_fence_grows_past_a_counter_ahead_of_the_clock(
    backend: RedisBackend, client: Any, key: str
) -> None:
    ahead = (int(client.time()[0]) + 3600) * 1_000_000
    client.set(fence_key(key), ahead)
    assert backend.acquire_fenced(key, TOKEN_A, 30, "o") == ahead + 1


def test_fence_rises_after_flush(backend: RedisBackend, client: Any, key: str) -> None:
    first = backend.acquire_fenced(key, TOKEN_A, 30, "o")
    client.flushdb()
    second = backend.acquire_fenced(key, TOKEN_B, 30, "o")
    assert first is not None and second is not None and second > first


def test_unfenced_grant_then_fenced_reacquire(backend: RedisBackend, key: str) -> None:
    assert backend.acquire(key, TOKEN_A, 30, "o")
    fence = backend.acquire_fenced(key, TOKEN_A, 30, "o")
    assert fence is not None
    assert backend.acquire(key, TOKEN_A, 30, "o")
    assert backend.inspect(key).fence == fence


def test_foreign_value_is_not_a_lease(backend: RedisBackend, client: Any, key: str) -> None:
    client.set(key, "not a lease")
    assert not backend.inspect(key).held
    assert backend.acquire(key, TOKEN_A, 30, "o") is False
    assert not backend.is_held(key, TOKEN_A)


def test_hash_tags() -> None:
    assert hash_tag("{orders}:42") == "orders"
    assert hash_tag("a{}b{c}") is None
    assert hash_tag("plain") is None
    assert fence_key("{orders}:42") == "{orders}:42:fence"
    assert fence_key("orders:42") == "{orders:42}/fence"


# -- scripts ----------------------------------------------------------------------------------


def test_noscript_falls_back_to_eval(backend: RedisBackend, client: Any, key: str) -> None:
    client.script_flush()
    assert backend.acquire_fenced(key, TOKEN_A, 30, "o")
    client.script_flush()
    assert backend.extend(key, TOKEN_A, 30)
    client.script_flush()
    assert backend.extend_many([ExtendRequest(key, TOKEN_A, 30)] * 3) == [True] * 3
    client.script_flush()
    assert [state.key for state in backend.scan(key)] == [key]
    client.script_flush()
    assert backend.release(key, TOKEN_A)


def test_extend_many_is_pipelined(backend: RedisBackend, client: Any, key: str) -> None:
    names = [f"{key}:{index}" for index in range(2500)]
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.set(name, f"{TOKEN_A}||o", px=5000)
    pipe.execute()
    assert backend.extend(names[0], TOKEN_A, 60)  # the script is cached from here on
    client.config_resetstat()
    requests = [ExtendRequest(name, TOKEN_A, 60) for name in names]
    requests.append(ExtendRequest(f"{key}:absent", TOKEN_A, 60))
    answers = backend.extend_many(requests)
    assert answers == [True] * len(names) + [False]
    assert client.pttl(names[-1]) > 50_000
    # Every extension is one EVALSHA and nothing else reached the server: no per-batch
    # SCRIPT EXISTS/LOAD round trip as redis-py's own pipelined scripts would send.
    stats = client.info("commandstats")
    assert stats["cmdstat_evalsha"]["calls"] == len(requests)
    assert not {"cmdstat_script", "cmdstat_eval"} & set(stats)


def test_unreachable_is_backend_unavailable_and_other_driver_errors_pass_through(client: Any, key: str) -> None:
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    broken = RedisBackend(redis.Redis(host="127.0.0.1", port=1, retry=Retry(NoBackoff(), 0)))
    with pytest.raises(BackendUnavailableError) as caught:
        broken.acquire(key, TOKEN_A, 30, "o")
    assert caught.value.backend == "redis" and "Redis" in str(caught.value)
    assert isinstance(caught.value.__cause__, redis.ConnectionError)
    client.set(key, "x")
    client.expire(key, 30)
    client.rpush(f"{key}:list", "x")
    backend = RedisBackend(client)
    with pytest.raises(redis.ResponseError):
        backend.inspect(f"{key}:list")


def test_scan_skips_counters_and_foreign_values(
    backend: RedisBackend, client: Any, key: str
) -> None:
    assert backend.acquire_fenced(f"{key}:a", TOKEN_A, 30, "o")
    assert backend.acquire(f"{key}:b*[?]", TOKEN_A, 30, "o")
    client.set(f"{key}:foreign", "hello")
    client.rpush(f"{key}:list", "x")
    states = list(backend.scan(f"{key}:"))
    assert [state.key for state in states] == [f"{key}:a", f"{key}:b*[?]"]
    assert [state.key for state in backend.scan(f"{key}:b*")] == [f"{key}:b*[?]"]


def test_count_in_window(backend: RedisBackend, client: Any, key: str) -> None:
    counts = [backend.count_in_window(key, 3600) for _ in range(3)]
    assert [count for count, _left in counts] == [1, 2, 3]
    assert all(0 < left <= 3600 for _count, left in counts)
    assert backend.count_in_window(f"{key}:other", 3600)[0] == 1
    assert 0 < client.pttl(f"lease_lock:window:{key}") <= 3_601_000


def test_count_in_window_resets(backend: RedisBackend, key: str) -> None:
    first, left = backend.count_in_window(key, 0.2)
    assert first >= 1 and 0 < left <= 0.2
    time.sleep(left + 0.01)
    assert backend.count_in_window(key, 0.2)[0] == 1


@pytest.mark.parametrize(
    ("name", "window", "message"),
    [("", 60, "name"), ("n", 0, "window"), ("n", float("inf"), "window"), ("n", 0.0001, "window")],
)
def test_count_in_window_validates(
    backend: RedisBackend, name: str, window: float, message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        backend.count_in_window(name, window)


# -- release notifications --------------------------------------------------------------------


def test_notifications_name_the_database(redis_server: RedisServer, key: str) -> None:
    db0 = RedisBackend.from_url(redis_server.url)
    db1 = RedisBackend.from_url(redis_server.url.replace("/0", "/1"))
    heard0: list[str] = []
    heard1: list[str] = []
    done = threading.Event()

    def on_db1(name: str) -> None:
        heard1.append(name)
        done.set()

    watchers = [db0.watch_releases(heard0.append), db1.watch_releases(on_db1)]
    try:
        assert wait_until(lambda: all(watcher.active for watcher in watchers), 30)
        assert db0.acquire(key, TOKEN_A, 30, "o") and db0.release(key, TOKEN_A)
        assert db1.acquire(f"{key}:1", TOKEN_A, 30, "o") and db1.release(f"{key}:1", TOKEN_A)
        assert done.wait(30)
        assert wait_until(lambda: heard0 == [key], 30)
        assert heard1 == [f"{key}:1"]
    finally:
        db0.close()
        db1.close()
    assert not any(watcher.active for watcher in watchers)


def test_failed_release_announces_nothing(backend: RedisBackend, key: str) -> None:
    heard: list[str] = []
    watcher = backend.watch_releases(heard.append)
    try:
        assert wait_until(lambda: watcher.active, 30)
        assert backend.acquire(key, TOKEN_A, 30, "o")
        assert not backend.release(key, TOKEN_B)
        assert not backend.force_release(f"{key}:absent")
        assert backend.release(key, TOKEN_A)
        assert wait_until(lambda: heard == [key], 30)
    finally:
        watcher.close()


def test_handoff_wakes_a_waiter_quickly(backend: RedisBackend, key: str) -> None:
    # Counted, not timed: the waiter tries once, is refused, and its next try comes from the
    # release notification (its wait ends early), not from the end of a 60 s wait.
    attempts: list[bool] = []
    woken: list[bool] = []
    refused = threading.Event()
    wake = threading.Event()
    watcher = backend.watch_releases(lambda name: wake.set() if name == key else None)
    try:
        assert wait_until(lambda: watcher.active, 30)
        assert backend.acquire(key, TOKEN_A, 30, "holder")

        def waiter() -> None:
            while not attempts or not attempts[-1]:
                attempts.append(backend.acquire(key, TOKEN_B, 30, "waiter"))
                if not attempts[-1]:
                    refused.set()
                    woken.append(wake.wait(60))
                    wake.clear()

        thread = threading.Thread(target=waiter)
        thread.start()
        assert refused.wait(30)
        assert backend.release(key, TOKEN_A)
        thread.join(90)
        assert attempts == [False, True]
        assert woken == [True], "the waiter's wait ran out instead of ending at the release"
    finally:
        watcher.close()


def test_a_raising_callback_keeps_the_watcher(backend: RedisBackend, key: str) -> None:
    heard: list[str] = []

    def callback(name: str) -> None:
        heard.append(name)
        raise RuntimeError("boom")

    watcher = backend.watch_releases(callback)
    try:
        assert wait_until(lambda: watcher.active, 30)
        for index in range(2):
            assert backend.acquire(f"{key}:{index}", TOKEN_A, 30, "o")
            assert backend.force_release(f"{key}:{index}")
        assert wait_until(lambda: len(heard) == 2, 30)
        assert watcher.active
    finally:
        watcher.close()


# -- bad input --------------------------------------------------------------------------------


def test_refuses_decode_responses(redis_server: RedisServer) -> None:
    client = redis_server.client(decode_responses=True)
    with pytest.raises(ValidationError, match="decode_responses=False"):
        RedisBackend(client)
    client.close()


def test_refuses_a_client_that_encodes_in_anything_but_utf8(redis_server: RedisServer) -> None:
    # A lease written in latin-1 would read back (as UTF-8, in every process) as a free key.
    client = redis_server.client(encoding="latin-1")
    with pytest.raises(ValidationError, match="encoding='utf-8'"):
        RedisBackend(client)
    client.close()
    utf8 = redis_server.client(encoding="UTF8")  # another spelling of the same codec
    RedisBackend(utf8).close()
    utf8.close()


def test_refuses_a_pipeline(client: Any) -> None:
    with pytest.raises(ValidationError, match="not a pipeline"):
        RedisBackend(client.pipeline())


def test_refuses_other_objects() -> None:
    with pytest.raises(ValidationError, match="not str"):
        RedisBackend("redis://localhost")


@pytest.mark.parametrize(
    "value",
    [(0, 1.0), (1, 0), (1, -1), (True, 1), ("1", 1), (1,), 1, (1, float("nan"))],
)
def test_refuses_bad_wait_for_replicas(client: Any, value: Any) -> None:
    with pytest.raises(ValidationError, match="wait_for_replicas"):
        RedisBackend(client, wait_for_replicas=value)


# -- URLs -------------------------------------------------------------------------------------


def test_from_url_options(redis_server: RedisServer) -> None:
    url = f"{redis_server.url.replace('/0', '/3')}?wait_for_replicas=1,250ms&socket_timeout=5s"
    backend = backend_from_url(url, client_name="lease-lock-test")
    assert isinstance(backend, RedisBackend)
    try:
        assert backend.wait_for_replicas == (1, 0.25)
        assert backend.db == 3
        kwargs = backend.client.get_connection_kwargs()
        assert kwargs["socket_timeout"] == 5.0 and kwargs["client_name"] == "lease-lock-test"
    finally:
        backend.close()


def test_from_url_bounds_socket_waits_by_default(redis_server: RedisServer) -> None:
    # Without a timeout one blackholed connection would block the heartbeat thread for hours.
    backend = backend_from_url(redis_server.url)
    try:
        kwargs = backend.client.get_connection_kwargs()  # type: ignore[attr-defined]
        assert kwargs["socket_timeout"] == 5.0
        assert kwargs["socket_connect_timeout"] == 5.0
    finally:
        backend.close()
    backend = backend_from_url(f"{redis_server.url}?socket_timeout=250ms")
    try:
        assert backend.client.get_connection_kwargs()["socket_timeout"] == 0.25  # type: ignore[attr-defined]
    finally:
        backend.close()


def test_from_url_closes_the_client_it_built(redis_server: RedisServer, key: str) -> None:
    name = f"owned-{uuid.uuid4().hex[:8]}"
    backend = RedisBackend.from_url(f"{redis_server.url}?client_name={name}")
    assert backend.acquire(key, TOKEN_A, 30, "o")
    observer = redis_server.client()
    try:
        assert any(entry["name"] == name for entry in observer.client_list())
        backend.close()
        assert wait_until(
            lambda: all(entry["name"] != name for entry in observer.client_list()), 30
        )
    finally:
        observer.close()


def test_passed_client_stays_open(client: Any, key: str) -> None:
    RedisBackend(client).close()
    assert client.ping()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis://localhost/0?nope=1", "unknown redis URL option 'nope'"),
        ("redis://localhost/0?wait_for_replicas=1", "wait_for_replicas"),
        ("redis://localhost/0?cluster=maybe", "cluster"),
        ("redis://localhost/0?sentinel_password=x", "sentinel_password"),
        ("redis+sentinel://localhost:26379", "SERVICE"),
        ("redis+sentinel://localhost:26379/svc/x", "database"),
        ("redis+sentinel://localhost:x/svc", "bad port"),
    ],
)
def test_from_url_refuses(url: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        RedisBackend.from_url(url)


def test_from_url_refuses_unknown_keyword() -> None:
    with pytest.raises(ValidationError, match="unknown redis option 'tabel'"):
        RedisBackend.from_url("redis://localhost/0", tabel="x")


def test_sentinel_url(redis_factory: Any, key: str) -> None:
    primary = redis_factory.server()
    sentinel = redis_factory.sentinel(primary, "leases")
    backend = backend_from_url(f"redis+sentinel://127.0.0.1:{sentinel.port}/leases/2")
    try:
        assert isinstance(backend, RedisBackend) and backend.db == 2
        assert backend.acquire(key, TOKEN_A, 30, "o")
        direct = primary.client(db=2)
        assert direct.get(key) == f"{TOKEN_A}||o".encode()
        # A counting key's places, through the primary the sentinel names.
        counted = f"{key}:counted"
        assert backend.acquire_counted(counted, TOKEN_A, 30, "o", 2) is not None
        assert backend.acquire_counted(counted, TOKEN_B, 30, "o", 2) is not None
        assert direct.type(counted) == b"hash" and direct.hlen(counted) == 3
        assert backend.release(counted, TOKEN_A) and backend.inspect(counted).holders[0].owner == "o"
        direct.close()
    finally:
        backend.close()


# -- docs -------------------------------------------------------------------------------------


def test_doc_examples_run(redis_server: RedisServer) -> None:
    text = (Path(__file__).parents[2] / "docs" / "backends" / "redis.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 3
    for block in blocks:
        code = block.replace("localhost:6379", f"127.0.0.1:{redis_server.port}").replace(
            'host="localhost", port=6379', f'host="127.0.0.1", port={redis_server.port}'
        )
        exec(compile(code, "docs/backends/redis.md", "exec"), {})  # noqa: S102


# -- the server fixtures ------------------------------------------------------------------------


def test_missing_binary_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.support.redis_server import require_redis_binary

    monkeypatch.setenv("PATH", "")
    monkeypatch.delenv("REDIS_SERVER_BIN", raising=False)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="redis-server"):
        require_redis_binary()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception):
        require_redis_binary()


def test_private_server_restarts_empty(redis_factory: Any) -> None:
    server = redis_factory.server()
    client = server.client()
    try:
        client.set("k", "v")
        pid, port = server.pid, server.port
        server.restart()
        assert server.port == port and server.pid != pid
        assert client.get("k") is None
    finally:
        client.close()
        server.stop()
    assert not server.running


def test_keys_named_like_fence_counters_are_refused(redis_server: RedisServer) -> None:
    # A lock named like another key's counter would let that key's fenced grant overwrite the
    # lock's lease (found in review): such names are refused before anything is written.
    backend = backend_from_url(redis_server.url)
    try:
        for name in ("{orders}:fence", "{orders}:42:fence"):
            assert is_fence_key(name)
            with pytest.raises(ValidationError, match="fence counter"):
                backend.check_key(name)
        for name in ("orders:fence", "{orders}:fence:x", "fence"):
            assert not is_fence_key(name)
            backend.check_key(name)
    finally:
        backend.close()


def test_fenced_grant_never_overwrites_a_lease_under_its_counter_name(redis_server: RedisServer, key: str) -> None:
    backend = backend_from_url(redis_server.url)
    try:
        # The bare backend API skips check_key; the script itself must still refuse.
        assert backend.acquire(fence_key(key), "a" * 32, 60, "squatter")
        with pytest.raises(redis.exceptions.ResponseError, match="non-counter"):
            backend.acquire_fenced(key, "b" * 32, 60, "grant")
        assert backend.is_held(fence_key(key), "a" * 32)
    finally:
        backend.force_release(fence_key(key))
        backend.close()


@pytest.mark.parametrize(
    ("url", "options", "message"),
    [
        ("redis://127.0.0.1:6379/abc", {}, "database number"),
        ("redis://127.0.0.1:notaport/14", {}, "bad port"),
        ("redis://127.0.0.1:6379/0", {"cluster": "false"}, "cluster must be True or False"),
        ("redis://127.0.0.1:6379/0", {"socket_timeout": "abc"}, "socket_timeout must be seconds"),
        ("redis://127.0.0.1:6379/0", {"health_check_interval": "x"}, "health_check_interval"),
    ],
)
def test_misread_urls_and_option_types_are_refused(url: str, options: dict[str, Any], message: str) -> None:
    # redis-py would quietly use database 0, raise a bare ValueError, or fail on first use.
    with pytest.raises(ValidationError, match=message):
        backend_from_url(url, **options)
