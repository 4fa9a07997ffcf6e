"""A loopback TCP proxy that lets one request through and drops its answer, then goes down.

``AnswerDroppingProxy(host, port)`` forwards ``127.0.0.1:<proxy.port>`` to the server. After
``drop_next_answer(b"POST /v3/kv/txn", b'"succeeded":true')``, the next request that starts
with the first bytes and whose answer holds the second reaches the server (which acts on it),
but its answer never reaches the client: the proxy throws it away and goes down at that
moment, resetting every open connection and closing each new one at once, until :meth:`up`.
The client sees the request fail with a dropped connection, and knows nothing of what the
server did: an unknown outcome, then an outage. Other answers pass.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from typing import Optional

__all__ = ["AnswerDroppingProxy"]

_CHUNK = 65536


class _Connection:
    """One client connection and its connection to the server."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        #: A request whose answer may be the one to drop went out on this connection.
        self.doomed = False


class AnswerDroppingProxy:
    """Forwards to ``(host, port)``; drops one chosen answer and goes down (see the module)."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._mutex = threading.Lock()
        self._connections: set[_Connection] = set()
        self._armed: Optional[tuple[bytes, bytes]] = None
        self._down = False
        self._closed = False
        #: Set once an answer was dropped (the proxy is down from then on, until up()).
        self.dropped = threading.Event()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port: int = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, name=f"answer-proxy-{self.port}", daemon=True).start()

    def drop_next_answer(self, request_start: bytes, answer_holds: bytes) -> None:
        """Drop the next answer that holds ``answer_holds`` to a request that starts with
        ``request_start``."""
        with self._mutex:
            self._armed = (request_start, answer_holds)

    def up(self) -> None:
        """Accept and forward connections again."""
        with self._mutex:
            self._down = False

    def close(self) -> None:
        """Stop listening and drop every connection."""
        with self._mutex:
            self._closed = True
            connections = list(self._connections)
        with contextlib.suppress(OSError):
            self._listener.close()
        for connection in connections:
            self._reset(connection)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._mutex:
                refused = self._down or self._closed
            if refused:
                _abort(client)
                continue
            try:
                upstream = socket.create_connection(self._target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                _abort(client)
                continue
            connection = _Connection(client, upstream)
            with self._mutex:
                self._connections.add(connection)
            threading.Thread(target=self._requests, args=(connection,), daemon=True).start()
            threading.Thread(target=self._answers, args=(connection,), daemon=True).start()

    def _requests(self, connection: _Connection) -> None:
        while True:
            data = _receive(connection.client)
            if not data:
                break
            with self._mutex:
                # A request's body may come in a later chunk than its first line.
                if self._armed is not None and data.startswith(self._armed[0]):
                    connection.doomed = True
            try:
                connection.upstream.sendall(data)
            except OSError:
                break
        self._reset(connection)

    def _answers(self, connection: _Connection) -> None:
        while True:
            data = _receive(connection.upstream)
            if not data:
                break
            if connection.doomed:
                connection.doomed = False
                with self._mutex:
                    chosen = self._armed is not None and self._armed[1] in data
                    if chosen:
                        self._armed = None
                if chosen:
                    self._go_down()
                    return
            try:
                connection.client.sendall(data)
            except OSError:
                break
        self._reset(connection)

    def _go_down(self) -> None:
        with self._mutex:
            self._down = True
            connections = list(self._connections)
        self.dropped.set()
        for connection in connections:
            self._reset(connection)

    def _reset(self, connection: _Connection) -> None:
        with self._mutex:
            self._connections.discard(connection)
        _abort(connection.client)
        _abort(connection.upstream)


def _receive(sock: socket.socket) -> bytes:
    try:
        return sock.recv(_CHUNK)
    except OSError:
        return b""


def _abort(sock: socket.socket) -> None:
    # No lingering: the peer's next read or write fails at once. The shutdown wakes this
    # proxy's own thread blocked reading the socket, which a close alone would not.
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
