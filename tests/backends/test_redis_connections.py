"""The Redis backend's kept connections: reused between calls, never read out of turn, replaced
when the server dropped them while idle, given back on close, and bypassed for clients they
cannot serve the same way."""

from __future__ import annotations

import threading
import uuid
from typing import Any, Optional

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st
from lease_lock.backends.redis import RedisBackend, _connections
from lease_lock.errors import BackendUnavailableError
from redis.backoff import NoBackoff
from redis.connection import Encoder, PythonRespSerializer
from redis.retry import Retry

from tests.support.cycles import errors_left_in_cycles
from tests.support.redis_server import RedisServer

TOKEN = "k" * 32


@pytest.fixture
def key() -> str:
    return f"kept:{uuid.uuid4().hex}"


def _client(server: RedisServer, **options: Any) -> Any:
    options = {"socket_timeout": 5.0, "retry": Retry(NoBackoff(), 0), **options}
    return redis.Redis(host="127.0.0.1", port=server.port, **options)


def _connections_named(server: RedisServer, name: str) -> list[dict[str, Any]]:
    admin = _client(server)
    try:
        return [entry for entry in admin.client_list() if entry.get("name") == name]
    finally:
        admin.close()


def test_a_cycle_reuses_one_connection_and_skips_the_pool(private_redis_server: RedisServer, key: str) -> None:
    client = _client(private_redis_server, client_name="kept-reuse")
    backend = RedisBackend(client)
    assert backend._commands.direct
    checkouts = 0
    checkout = client.connection_pool.get_connection

    def counting_checkout(*args: Any, **kwargs: Any) -> Any:
        nonlocal checkouts
        checkouts += 1
        return checkout(*args, **kwargs)

    client.connection_pool.get_connection = counting_checkout
    backend._commands = _connections.DirectCommands(client)
    try:
        for index in range(100):
            token = f"{index:032d}"
            assert backend.acquire_fenced(key, token, 30, "o") is not None
            assert backend.release(key, token)
        assert checkouts == 1
        assert len(_connections_named(private_redis_server, "kept-reuse")) == 1
    finally:
        backend.close()
        client.close()


def test_a_reply_cut_off_by_a_timeout_is_never_read_by_the_next_call(
    private_redis_server: RedisServer, key: str
) -> None:
    client = _client(private_redis_server, socket_timeout=0.3)
    backend = RedisBackend(client)
    admin = _client(private_redis_server)
    try:
        # The server holds every write for a while: the acquire times out on our side and its
        # reply arrives later on that socket, which must never be read again.
        admin.execute_command("CLIENT", "PAUSE", 1500, "WRITE")
        with pytest.raises(BackendUnavailableError):
            backend.acquire(key, TOKEN, 30, "first")
        admin.execute_command("CLIENT", "UNPAUSE")
        # Redis drops the command of a client that hung up, or runs it: either way every later
        # call reads its own reply (a stale one would be the wrong type or the wrong answer).
        first_landed = admin.get(key) is not None
        assert backend.inspect(key).held is first_landed
        assert backend.is_held(key, TOKEN) is first_landed
        assert backend.acquire(key, "s" * 32, 30, "second") is not first_landed
        assert backend.release(key, TOKEN if first_landed else "s" * 32)
        assert not backend.inspect(key).held
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")
        admin.close()
        backend.close()
        client.close()


@pytest.mark.parametrize(
    ("retries", "idle_recheck"),
    # No retries, but the idle connection is checked out through the pool again, which finds
    # it dead before sending; or used at once, as within the idle window, and reconnected by
    # the client's retry policy, as it would be inside execute_command.
    [(0, 0.0), (2, _connections.IDLE_RECHECK)],
    ids=["idle-rechecked", "busy-retried"],
)
def test_a_kept_connection_the_server_dropped_costs_no_error(
    private_redis_server: RedisServer, key: str, monkeypatch: pytest.MonkeyPatch, retries: int, idle_recheck: float
) -> None:
    client = _client(private_redis_server, client_name="kept-dropped", retry=Retry(NoBackoff(), retries))
    backend = RedisBackend(client)
    admin = _client(private_redis_server)
    try:
        assert backend.acquire(key, TOKEN, 30, "o")
        [entry] = _connections_named(private_redis_server, "kept-dropped")
        admin.client_kill_filter(_id=entry["id"])
        monkeypatch.setattr(_connections, "IDLE_RECHECK", idle_recheck)
        assert backend.is_held(key, TOKEN)
        assert backend.release(key, TOKEN)
    finally:
        admin.close()
        backend.close()
        client.close()


def test_close_gives_every_kept_connection_back_to_the_pool(private_redis_server: RedisServer, key: str) -> None:
    client = _client(private_redis_server)
    backend = RedisBackend(client)
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def cycles(index: int) -> None:
        try:
            barrier.wait(timeout=30)
            for cycle in range(50):
                token = f"{index:016d}{cycle:016d}"
                assert backend.acquire(f"{key}:{index}", token, 30, "o")
                assert backend.release(f"{key}:{index}", token)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=cycles, args=(index,)) for index in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    pool = client.connection_pool
    assert 1 <= backend._commands.kept <= _connections.KEEP
    assert len(pool._in_use_connections) == backend._commands.kept
    backend.close()
    assert backend._commands.kept == 0
    assert len(pool._in_use_connections) == 0
    client.close()


def test_no_more_than_keep_connections_stay_checked_out(private_redis_server: RedisServer, key: str) -> None:
    client = _client(private_redis_server)
    backend = RedisBackend(client)
    threads_count = _connections.KEEP * 2
    inside = threading.Barrier(threads_count)
    errors: list[BaseException] = []
    original = _connections._send

    def slow_send(connection: Any, args: tuple[Any, ...], packed: Optional[bytes]) -> Any:
        # Every thread is inside a call at once, so each holds a connection of its own.
        reply = original(connection, args, packed)
        inside.wait(timeout=30)
        return reply

    def one_call(index: int) -> None:
        try:
            backend.is_held(f"{key}:{index}", TOKEN)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    _connections._send = slow_send
    try:
        threads = [threading.Thread(target=one_call, args=(index,)) for index in range(threads_count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    finally:
        _connections._send = original
    assert not errors
    assert backend._commands.kept == _connections.KEEP
    assert len(client.connection_pool._in_use_connections) == _connections.KEEP
    backend.close()
    client.close()


@pytest.mark.parametrize(
    "options",
    [{"single_connection_client": True}, {"protocol": 3}],
    ids=["single-connection", "resp3"],
)
def test_clients_it_cannot_serve_directly_go_through_execute_command(
    private_redis_server: RedisServer, key: str, options: dict[str, Any]
) -> None:
    client = _client(private_redis_server, **options)
    backend = RedisBackend(client)
    try:
        assert not backend._commands.direct
        assert backend.acquire_fenced(key, TOKEN, 30, "o") is not None
        assert backend.is_held(key, TOKEN)
        assert backend.release(key, TOKEN)
        assert backend._commands.kept == 0
    finally:
        backend.close()
        client.close()


_COMMAND_NAMES = st.text(alphabet=st.characters(min_codepoint=65, max_codepoint=90), min_size=1, max_size=12)
_ARGUMENTS = st.one_of(
    st.text(), st.integers(min_value=-(2**70), max_value=2**70), st.binary(max_size=7000),
    st.floats(allow_nan=False), st.binary(max_size=20).map(memoryview),
)


@settings(max_examples=300, deadline=None)
@given(
    name=_COMMAND_NAMES,
    arguments=st.lists(_ARGUMENTS, max_size=12),
    # UTF-16 too: redis-py sends the command name in UTF-8 whatever the client's encoding.
    encoding=st.sampled_from(["utf-8", "latin-1", "utf-16"]),
)
def test_packed_commands_are_what_redis_py_sends(name: str, arguments: list[Any], encoding: str) -> None:
    encoder = Encoder(encoding, "replace", False)
    expected = b"".join(bytes(part) for part in PythonRespSerializer(6000, encoder.encode).pack(name, *arguments))
    assert _connections.pack_command((name, *arguments), encoder) == expected


def test_packing_refuses_what_redis_py_refuses() -> None:
    encoder = Encoder("utf-8", "strict", False)
    with pytest.raises(redis.DataError):
        _connections.pack_command(("SET", "k", True), encoder)
    with pytest.raises(UnicodeEncodeError):
        _connections.pack_command(("SET", "k", "\udc80"), encoder)


def test_an_argument_the_encoder_refuses_costs_no_connection(private_redis_server: RedisServer) -> None:
    client = _client(private_redis_server)
    backend = RedisBackend(client)
    try:
        for _ in range(2 * _connections.KEEP):
            with pytest.raises(UnicodeEncodeError):
                backend.is_held("kept:\udc80", TOKEN)  # a lone surrogate has no UTF-8 form
        assert backend._commands.kept == 0
        assert len(client.connection_pool._in_use_connections) == 0
    finally:
        backend.close()
        client.close()


def test_keys_and_owners_are_stored_as_redis_py_would_write_them(private_redis_server: RedisServer) -> None:
    # Packed here, read back by a plain redis-py client: the same bytes under the same key.
    client = _client(private_redis_server)
    backend = RedisBackend(client)
    assert backend._commands.direct
    name = f"kept:{uuid.uuid4().hex}:é/ключ/🔒"
    try:
        assert backend.acquire(name, TOKEN, 30, "owner é 🔒")
        assert client.get(name) == f"{TOKEN}||owner é 🔒".encode()
        assert backend.inspect(name).owner == "owner é 🔒"
        assert backend.release(name, TOKEN)
        assert client.exists(name) == 0
    finally:
        backend.close()
        client.close()


@pytest.mark.parametrize(("retries", "failures"), [(0, 1), (2, 1), (2, 2), (2, 3), (3, 5)])
def test_a_failed_send_is_retried_as_often_as_the_clients_policy_says(
    private_redis_server: RedisServer, key: str, retries: int, failures: int
) -> None:
    # The first send runs outside the retry policy; the policy must still see it as its first
    # try, so the sends and disconnects are those of one call_with_retry around every send.
    client = _client(private_redis_server, retry=Retry(NoBackoff(), retries))
    backend = RedisBackend(client)
    sends = 0
    disconnects = 0
    original = _connections._send

    def failing_send(connection: Any, args: tuple[Any, ...], packed: Optional[bytes]) -> Any:
        nonlocal sends
        sends += 1
        if sends <= failures:
            raise redis.ConnectionError(f"injected failure {sends}")
        return original(connection, args, packed)

    def counting_disconnect(*args: Any, **kwargs: Any) -> None:
        nonlocal disconnects
        disconnects += 1
        disconnect(*args, **kwargs)  # the next send connects afresh, as after a real failure

    try:
        # A working connection is kept, and both scripts are cached (no NOSCRIPT, no EVAL).
        assert backend.acquire(key, TOKEN, 30, "o")
        assert backend.release(key, TOKEN)
        assert backend.acquire(key, TOKEN, 30, "o")
        [(connection, _)] = backend._commands._free
        disconnect = connection.disconnect
        connection.disconnect = counting_disconnect
        _connections._send = failing_send
        if failures > retries:
            with pytest.raises(BackendUnavailableError):
                backend.release(key, TOKEN)
            assert sends == retries + 1
            assert disconnects == retries + 2  # one per failure, one more as the call gives up
        else:
            assert backend.release(key, TOKEN)
            assert sends == failures + 1
            assert disconnects == failures
    finally:
        _connections._send = original
        backend.close()
        client.close()


def test_an_error_reply_is_not_retried(private_redis_server: RedisServer, key: str) -> None:
    client = _client(private_redis_server, retry=Retry(NoBackoff(), 3))
    commands = _connections.DirectCommands(client)
    sends = 0
    original = _connections._send

    def counting_send(connection: Any, args: tuple[Any, ...], packed: Optional[bytes]) -> Any:
        nonlocal sends
        sends += 1
        return original(connection, args, packed)

    _connections._send = counting_send
    try:
        client.set(key, "text")
        with pytest.raises(redis.ResponseError):
            commands.execute_command("INCR", key)
        assert sends == 1
        assert commands.kept == 1  # an error reply was read in full: the connection stays
    finally:
        _connections._send = original
        commands.close()
        client.close()


@pytest.mark.parametrize("first_failure", ["script-missing", "connection-dropped"])
def test_a_call_whose_first_send_failed_leaves_nothing_for_the_cyclic_collector(
    private_redis_server: RedisServer, key: str, first_failure: str
) -> None:
    # A dropped lock is given back when its last reference goes; frames kept alive by an error's
    # traceback in a cycle held it (and the caller's frames) until a collection ran instead.
    client = _client(private_redis_server, client_name="cycles", retry=Retry(NoBackoff(), 1))
    backend = RedisBackend(client)
    admin = _client(private_redis_server)
    try:
        assert backend.acquire(key, TOKEN, 30, "o")
        if first_failure == "script-missing":
            admin.script_flush()  # the next EVALSHA is refused, and EVAL follows
        else:
            [entry] = _connections_named(private_redis_server, "cycles")
            admin.client_kill_filter(_id=entry["id"])  # the next send fails, and is retried

        assert errors_left_in_cycles(lambda: backend.release(key, TOKEN)) == []
        assert not backend.is_held(key, TOKEN)
    finally:
        admin.close()
        backend.close()
        client.close()
