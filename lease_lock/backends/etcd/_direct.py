"""Plain HTTP/1.1 keep-alive connections to etcd's members, for the backend's own session.

Every lock operation on etcd is a handful of small JSON POSTs, and ``requests`` spends several
times the member's own work on each one (preparing the request, merging settings, building the
response object): on loopback, more than half a millisecond of client CPU per request. When the
backend made its session itself (``session`` not given, or ``from_url``), nothing the caller set
up can hang on that session (adapters, hooks, custom headers), so its requests go through
:mod:`http.client` here instead, with the same TLS settings: the session's ``verify`` (the CA
bundle ``requests`` would use for it) and ``cert``. Watch streams, and every request to a
member the environment routes through a proxy, still go through the session.

Connections are kept per member in a small pool any thread may take from. One is handed out
again only after its answer was read to the end, and only if the member has not closed it
meanwhile (its socket reads as ready: an end of file, or bytes nobody asked for); a failed
request closes its connection, so no answer can be read by the wrong request.
"""

from __future__ import annotations

import http.client
import os
import select
import socket
import ssl
import threading
import urllib.parse
from typing import Any, Optional, Union

__all__ = ["DirectConnections", "tls_context"]

# Idle connections kept per member; beyond it a returned one is closed.
_IDLE = 8
_HEADERS = {"Content-Type": "application/json"}


def tls_context(verify: Union[bool, str], cert: Any) -> ssl.SSLContext:
    """The TLS context of a session's ``verify`` (``True``: ``requests``' own CA bundle; a
    path: that bundle or directory; ``False``: no checks) and ``cert`` (a path, or a pair of
    certificate and key paths)."""
    if verify is False:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        if verify is True:
            from requests.utils import DEFAULT_CA_BUNDLE_PATH

            verify = DEFAULT_CA_BUNDLE_PATH
        if os.path.isdir(verify):
            context = ssl.create_default_context(capath=verify)
        else:
            context = ssl.create_default_context(cafile=verify)
    if cert:
        certfile, keyfile = (cert, None) if isinstance(cert, str) else cert
        context.load_cert_chain(certfile, keyfile)
    return context


def _dropped(connection: http.client.HTTPConnection) -> bool:
    """Whether an idle connection was closed by its member (or has bytes no request asked for)."""
    sock = connection.sock
    if sock is None:
        return True
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    return bool(select.select([sock], [], [], 0)[0])


class DirectConnections:
    """POSTs to members over pooled :mod:`http.client` connections; thread-safe."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._idle: dict[str, list[http.client.HTTPConnection]] = {}

    def post(
        self, endpoint: str, path: str, data: bytes, headers: dict[str, str], timeout: float,
        context: Optional[ssl.SSLContext],
    ) -> tuple[int, bytes]:
        """POST ``data`` to ``path`` on ``endpoint``; the answer's status and body. Any failure
        (``OSError``, ``http.client.HTTPException``) raises as it came, its connection closed."""
        connection = self._take(endpoint)
        if connection is None:
            connection = self._connect(endpoint, timeout, context)
        try:
            if connection.sock is not None:
                connection.sock.settimeout(timeout)
            connection.request("POST", path, body=data, headers={**_HEADERS, **headers})
            response = connection.getresponse()
            body = response.read()
        except BaseException:
            connection.close()
            raise
        if response.will_close:
            connection.close()
        else:
            self._give_back(endpoint, connection)
        return response.status, body

    def _take(self, endpoint: str) -> Optional[http.client.HTTPConnection]:
        while True:
            with self._mutex:
                idle = self._idle.get(endpoint)
                connection = idle.pop() if idle else None
            if connection is None or not _dropped(connection):
                return connection
            connection.close()

    def _give_back(self, endpoint: str, connection: http.client.HTTPConnection) -> None:
        with self._mutex:
            idle = self._idle.setdefault(endpoint, [])
            if len(idle) < _IDLE:
                idle.append(connection)
                return
        connection.close()

    @staticmethod
    def _connect(endpoint: str, timeout: float, context: Optional[ssl.SSLContext]) -> http.client.HTTPConnection:
        parts = urllib.parse.urlsplit(endpoint)
        host, port = parts.hostname or "", parts.port
        connection: http.client.HTTPConnection
        if parts.scheme == "https":
            connection = http.client.HTTPSConnection(host, port, timeout=timeout, context=context)
        else:
            connection = http.client.HTTPConnection(host, port, timeout=timeout)
        try:
            connection.connect()
            # http.client writes a request's head and body separately: without this, the body
            # would wait for the member to acknowledge the head.
            connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except BaseException:
            connection.close()
            raise
        return connection

    def close(self) -> None:
        """Close every idle connection (one in use closes when its request ends with an error,
        or is dropped with its pool)."""
        with self._mutex:
            idle, self._idle = self._idle, {}
        for connections in idle.values():
            for connection in connections:
                connection.close()

    def after_fork(self) -> None:
        """In a forked child: forget the parent's connections (the parent keeps using them) and
        its mutex, which a parent thread may have held at the fork."""
        self._mutex = threading.Lock()
        self._idle = {}
