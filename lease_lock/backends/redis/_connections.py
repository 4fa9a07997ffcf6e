"""Commands sent on connections the backend keeps between calls.

``Redis.execute_command`` checks a connection out of the client's pool and back in for every
command: a pool lock, a ``poll()`` for unread data and, in recent redis-py, the client's
observability hooks. On loopback that is about a third of a lock cycle, which is two commands.
:class:`DirectCommands` keeps the connections it used checked out, on a free list of its own,
and sends on them directly, with the connection's own health checks, under the connection's
own retry policy (the client's) once a send fails, exactly as redis-py does once it holds a
connection.

Why this is safe:

- A connection goes back on the free list only after its reply was read in full (an error
  reply included) or after it was disconnected, so no call can ever read another call's reply.
- A connection that sat idle for :data:`IDLE_RECHECK` seconds goes back through the pool, whose
  checkout notices a socket the server closed meanwhile (an idle timeout, ``CLIENT KILL``), so
  an idle release is not sent into a dead socket.
- After a fork the child starts with an empty list: the parent's sockets are never used.
- At most :data:`KEEP` connections are kept; the rest go back to the pool at once, and
  :meth:`DirectCommands.close` returns every kept one.

The commands are packed here too, when redis-py would pack them in Python (no ``hiredis``, no
packer of the caller's): its packer asks five ``isinstance`` questions per argument and joins
the buffer once per argument, about as costly as the round trip's own Python work. The bytes
sent are the same (see :func:`pack_command`).

Clients this cannot serve the same way (a Cluster, a single-connection client, a client-side
cache, RESP3 with its push messages) go through ``execute_command`` unchanged.

Inside a block of :attr:`DirectCommands.budget` (the backend's ``call_budget``) a thread's
commands wait for their replies no longer than the budget plus :data:`CALL_MARGIN`, through
:meth:`DirectCommands.reply_within`, the one bounded way of sending that the waiting line uses
too: a server gone silent then ends a caller's wait at its timeout, not after the client's
socket timeouts and its retries. Outside one a call costs a thread-local read more.
"""

from __future__ import annotations

import inspect
import os
import time
from typing import Any, Callable, Optional

from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..base import CALL_MARGIN, CallBudget

__all__ = ["IDLE_RECHECK", "KEEP", "DirectCommands", "NoReply", "pack_command"]

#: A kept connection idle this long is checked out through the pool again (see module notes).
IDLE_RECHECK = 1.0
#: The most connections kept between calls: about the threads that lock at the same moment.
KEEP = 8


class NoReply(RedisTimeoutError):
    """No reply within a bounded call's time: a redis-py timeout, so that the backend reports
    the store unavailable, raised after the retry policy is done (a silent server would not
    answer a retry either)."""


class _Silent(Exception):
    """No reply in time, inside the retry policy: not a redis-py error, so that it tries no more."""


def _serves_directly(client: Any) -> bool:
    """Whether ``client`` is a plain ``redis.Redis`` whose commands can go out on kept
    connections with the same effect as through ``execute_command``."""
    from redis import Redis

    if not isinstance(client, Redis):  # a RedisCluster is not a Redis: it routes by slot
        return False
    if getattr(client, "connection", None) is not None:
        return False  # single_connection_client: one connection, guarded by the client
    pool = client.connection_pool
    if getattr(pool, "cache", None) is not None:
        return False
    return str(pool.connection_kwargs.get("protocol") or 2) == "2"


def pack_command(args: tuple[Any, ...], encoder: Any) -> bytes:
    """``args`` as one RESP command, byte for byte what redis-py's Python packer sends for them.

    ``encoder`` is the client's (``client.get_encoder()``): ``str`` arguments after the
    command name are encoded with its encoding, and anything but ``str``, ``int`` and
    ``bytes`` goes through its ``encode``, which also raises redis-py's own error for what it
    refuses. The command name (``str`` or ``bytes``) must hold no space (redis-py would split
    it into words).
    """
    encoding, errors = encoder.encoding, encoder.encoding_errors
    # redis-py sends a str command name in UTF-8 whatever the client's encoding (in UTF-16,
    # encoding it like the arguments would turn EVALSHA into something else).
    name = args[0].encode() if type(args[0]) is str else args[0]
    parts = [b"*%d\r\n$%d\r\n%s\r\n" % (len(args), len(name), name)]
    for arg in args[1:]:
        kind = type(arg)
        if kind is str:
            arg = arg.encode(encoding, errors)
        elif kind is int:
            arg = b"%d" % arg
        elif kind is not bytes:
            arg = bytes(encoder.encode(arg))
        parts.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
    return b"".join(parts)


def _packs_in_python(pool: Any) -> bool:
    """Whether redis-py would pack the commands of ``pool``'s connections in Python (no
    ``hiredis``, no packer of the caller's), so that :func:`pack_command` may do it instead."""
    from redis.utils import HIREDIS_AVAILABLE

    return not HIREDIS_AVAILABLE and pool.connection_kwargs.get("command_packer") is None


def _checkout(pool: Any) -> Callable[[], Any]:
    """The pool's checkout as a zero-argument call: redis-py before 5.3 wants a command name."""
    parameter = inspect.signature(pool.get_connection).parameters.get("command_name")
    if parameter is not None and parameter.default is inspect.Parameter.empty:
        return lambda: pool.get_connection("EVALSHA")
    return pool.get_connection  # type: ignore[no-any-return]


class DirectCommands:
    """``execute_command`` for one redis-py client, on connections kept between calls.

    Thread-safe: each call takes a connection of its own off the free list (``list.pop`` and
    ``list.append`` are atomic), or from the pool when the list is empty.
    """

    __slots__ = ("_checkout", "_client", "_direct", "_encoder", "_free", "_pid", "_pool", "budget")

    def __init__(self, client: Any) -> None:
        self._client = client
        self._direct = _serves_directly(client)
        self._pool = client.connection_pool if self._direct else None
        self._checkout = _checkout(self._pool) if self._direct else None
        #: The client's encoder when commands are packed here (see pack_command), else None.
        self._encoder = client.get_encoder() if self._direct and _packs_in_python(self._pool) else None
        #: Kept connections with the clock reading of their last reply.
        self._free: list[tuple[Any, float]] = []
        self._pid = os.getpid()
        #: The backend's call_budget: inside a block, commands wait for their replies no
        #: longer than its deadline (commands through ``execute_command`` excepted).
        self.budget = CallBudget(CALL_MARGIN)

    @property
    def direct(self) -> bool:
        """Whether commands go out on kept connections (``False``: through ``execute_command``)."""
        return self._direct

    @property
    def kept(self) -> int:
        """Connections kept between calls right now."""
        return len(self._free)

    def execute_command(self, *args: Any) -> Any:
        """Send one command and return its raw reply; errors as ``execute_command`` raises them."""
        if not self._direct:
            return self._client.execute_command(*args)
        self._forget_if_forked()
        deadline = self.budget.deadline
        if deadline is not None:
            return self._execute_within(args, deadline - time.monotonic())
        # Packed before a connection is taken: an argument the encoder refuses takes none.
        packed = pack_command(args, self._encoder) if self._encoder is not None else None
        connection = self._take()
        try:
            try:
                return _send(connection, args, packed)
            except Exception as error:  # noqa: BLE001 - the client's retry policy judges it
                failed = [error]
            # Outside the handler: a retry's own error must not show the first as its context.
            return _retry_after(connection, args, packed, failed)
        except BaseException as error:
            if not isinstance(error, ResponseError):
                # A reply may be half read (a connection error, a timeout, an interrupt): this
                # socket must never be read again. An error reply was read in full.
                connection.disconnect()
            raise
        finally:
            self._keep(connection)

    def _execute_within(self, args: tuple[Any, ...], within: float) -> Any:
        connection = self._take()
        timeouts = (connection.socket_timeout, connection.socket_connect_timeout)
        dropped: list[bool] = []
        try:
            return self.reply_within(connection, args, within, lambda: dropped.append(True))
        finally:
            connection.socket_timeout, connection.socket_connect_timeout = timeouts
            if dropped:
                # Its socket was made with the bounded timeouts of one try: the next command
                # makes one with the client's.
                connection.disconnect()
            self._keep(connection)

    def reply_within(self, connection: Any, args: tuple[Any, ...], within: float, dropped: Callable[[], None]) -> Any:
        """Send ``args`` on ``connection`` (a kept or lent one) and return the reply that came
        within ``within`` seconds. A dropped connection is tried again, by the connection's
        retry policy as every command is, on a new socket that hears no more patiently than the
        time left; silence raises :class:`NoReply` at once. ``dropped`` is called whenever the
        connection is dropped: the caller, once done, restores the connection's socket timeouts
        and drops the socket made with the bounded ones. On any error but an error reply the
        connection is left disconnected (a reply may still be on its way)."""
        deadline = time.monotonic() + within

        def attempt() -> Any:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _Silent
            connection.socket_timeout = connection.socket_connect_timeout = left
            self.send(connection, args)
            if not connection.can_read(left):
                raise _Silent
            return connection.read_response()

        def drop(*_error: Any) -> None:
            dropped()
            connection.disconnect()

        try:
            return connection.retry.call_with_retry(attempt, drop)
        except ResponseError:
            raise  # an error reply, read in full: the connection is sound
        except BaseException as error:
            drop()
            if isinstance(error, _Silent):
                raise NoReply(f"no reply to {args[0]} within {max(within, 0.0):.3g}s") from None
            raise

    def lend(self) -> Any:
        """A connection for one caller's blocking commands (a waiter's ``BLPOP``), which it
        sends and reads itself until it gives the connection back with :meth:`take_back`.

        When commands go out on kept connections it is one of those: a waiter that wakes up
        holding a key then returns its connection to the free list, not through the pool's
        check-in (its lock and hooks cost a woken waiter more than a third of its way from the
        grant's arrival to holding the key), and the lock's next commands use it again."""
        if not self._direct:
            return _checkout(self._client.connection_pool)()
        self._forget_if_forked()
        return self._take()

    def send(self, connection: Any, args: tuple[Any, ...]) -> None:
        """Send one command on a connection from :meth:`lend`, packed as :meth:`execute_command`
        packs it, without redis-py's health check: the caller bounds the wait for the reply."""
        if self._encoder is not None:
            connection.send_packed_command([pack_command(args, self._encoder)], check_health=False)
        else:
            connection.send_command(*args, check_health=False)

    def take_back(self, connection: Any) -> None:
        """Take back a connection from :meth:`lend`, its last reply read in full or the
        connection disconnected (so that no later command can read a stray reply)."""
        if self._direct:
            self._keep(connection)
        else:
            self._client.connection_pool.release(connection)

    def _forget_if_forked(self) -> None:
        if self._pid != os.getpid():
            # A forked child: the kept sockets are the parent's. Forget them (closing them here
            # could shut the parent's sockets down); the pool starts afresh in the child too.
            self._free = []
            self._pid = os.getpid()

    def _take(self) -> Any:
        assert self._pool is not None and self._checkout is not None
        try:
            connection, last_reply = self._free.pop()
        except IndexError:
            return self._checkout()
        if time.monotonic() - last_reply < IDLE_RECHECK:
            return connection
        self._pool.release(connection)
        return self._checkout()

    def _keep(self, connection: Any) -> None:
        assert self._pool is not None
        if len(self._free) < KEEP:
            self._free.append((connection, time.monotonic()))
        else:
            self._pool.release(connection)

    def close(self) -> None:
        """Return every kept connection to the pool (in a forked child, forget them)."""
        kept, self._free = self._free, []
        if self._pool is None or self._pid != os.getpid():
            return
        for connection, _ in kept:
            self._pool.release(connection)


def _retry_after(connection: Any, args: tuple[Any, ...], packed: Optional[bytes], failed: list[Exception]) -> Any:
    """The rest of a call whose first send raised the one error in ``failed``, under the
    connection's retry policy.

    The first try ran outside ``call_with_retry`` so that a call that succeeds builds no
    closures. Re-raising that error as the policy's own first try lets it count that failure,
    disconnect, pick the backoff, and refuse what it does not retry (an error reply included),
    so the attempts, pauses and errors are those of one ``call_with_retry`` around every send.

    The error is taken out of ``failed`` as it is raised again: the frames of the error that
    ends the call (its traceback) must not hold it, or the error and those frames would make a
    reference cycle that only the cyclic collector frees, keeping the caller's frames and
    their locals (a held lock the caller has dropped, say) alive until it runs.
    """

    def attempt() -> Any:
        if failed:
            raise failed.pop()
        return _send(connection, args, packed)

    return connection.retry.call_with_retry(attempt, lambda _error, *_rest: connection.disconnect())


def _send(connection: Any, args: tuple[Any, ...], packed: Optional[bytes]) -> Any:
    if packed is None:
        connection.send_command(*args)
    else:
        connection.send_packed_command([packed])  # a list of buffers, as redis-py's packer gives
    return connection.read_response()
