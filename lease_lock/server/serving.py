"""The waitress server of ``lease-lock serve``, with the settings a public lock service needs.

waitress's defaults suit an application behind a proxy, not a service facing many clients:
at most 100 connections, and an idle or half-sent connection keeps its slot for 120 seconds,
so a hundred silent sockets stop the server for everyone. :func:`make_server` raises the
connection limit, closes connections that stay silent for ``channel_timeout`` seconds (idle
keep-alive connections and unfinished request headers alike; a request being answered is never
cut), refuses request headers over 64 KiB, answers what waitress refuses by itself (bodies and
headers too large, malformed requests) with the service's JSON errors, and polls its sockets
with ``poll()`` so that more than 1024 of them work.

It also keeps connections open after bodiless answers: waitress closes the connection after
every ``204`` (it looks for a ``Content-Length``, which a 204 may not carry), so each release
cost the next request a new TCP connection. A 204 ends with its headers, so an HTTP/1.1
connection stays open unless the client asked to close it.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import signal
import socket
import time
from typing import Any, Callable, Optional

from ..errors import ValidationError
from ..validation import install_hint

__all__ = ["DEFAULT_CHANNEL_TIMEOUT", "DEFAULT_CONNECTION_LIMIT", "make_server", "require_waitress", "serve"]

#: Connections one server process keeps open at most (waitress's own default is 100).
DEFAULT_CONNECTION_LIMIT = 1000
#: Seconds a connection may stay silent (no request being answered) before it is closed.
DEFAULT_CHANNEL_TIMEOUT = 10
#: Request line and headers together, in bytes, at most (waitress's own default is 256 KiB).
MAX_HEADER_BYTES = 64 * 1024
# Codes of the JSON errors for what waitress refuses before the application sees it.
_ERROR_CODES = {413: "payload_too_large", 431: "headers_too_large", 400: "invalid_request", 501: "not_implemented"}


def require_waitress() -> Any:
    """The ``waitress`` module, or a :class:`ValidationError` naming the extra to install."""
    try:
        import waitress
    except ImportError as exc:
        raise ValidationError(f"lease-lock serve needs waitress: {install_hint('server')}") from exc
    return waitress


@functools.lru_cache(maxsize=1)
def _channel_class() -> Any:
    """waitress's connection class, keeping HTTP/1.1 connections open after a 204."""
    from waitress.channel import HTTPChannel
    from waitress.task import ErrorTask, WSGITask

    class KeepAliveTask(WSGITask):  # type: ignore[misc] # waitress has no type hints
        """A task that does not close the connection just because an answer has no body."""

        _bodiless = False

        def build_response_header(self) -> bytes:
            self._bodiless = not self.has_body
            try:
                header: bytes = super().build_response_header()
            finally:
                self._bodiless = False
            return header

        def set_close_on_finish(self) -> None:
            wants_close = self.request.headers.get("CONNECTION", "").lower() == "close"
            if self._bodiless and self.version == "1.1" and not wants_close:
                # Called only because no Content-Length was found; a bodiless answer needs none.
                return
            super().set_close_on_finish()

    class JsonErrorTask(ErrorTask):  # type: ignore[misc] # waitress has no type hints
        """waitress's own refusals (too large, malformed) as JSON errors with a code."""

        def execute(self) -> None:
            error = self.request.error
            code = _ERROR_CODES.get(error.code, "invalid_request")
            body = json.dumps({"error": str(error.reason).lower(), "code": code}).encode()
            self.status = f"{error.code} {error.reason}"
            self.response_headers.extend([("Content-Type", "application/json"), ("Cache-Control", "no-store")])
            # The request was not read to its end: the connection cannot carry another one.
            self.set_close_on_finish()
            self.content_length = len(body)
            self.write(body)

    class Channel(HTTPChannel):  # type: ignore[misc] # waitress has no type hints
        """A connection whose requests run as :class:`KeepAliveTask`."""

        task_class = KeepAliveTask
        error_task_class = JsonErrorTask

    return Channel


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValidationError(f"{name} must be a whole number of at least 1, got {value!r}")
    return value


def make_server(
    app: Any,
    host: str,
    port: int,
    *,
    threads: int = 8,
    connection_limit: int = DEFAULT_CONNECTION_LIMIT,
    channel_timeout: int = DEFAULT_CHANNEL_TIMEOUT,
    max_request_body_size: int = 1024 * 1024,
    sock: Optional[socket.socket] = None,
    **adjustments: Any,
) -> Any:
    """A waitress server for ``app`` on ``host:port`` (port 0 picks one); call ``run()``.

    Every number is checked first (``ValidationError`` naming it): ``threads`` answering
    requests, ``connection_limit`` open connections, ``channel_timeout`` seconds of silence
    before a connection is closed. ``sock`` is a listening socket to accept on instead of
    binding ``host:port`` (how several worker processes share one port).
    ``adjustments`` pass through to ``waitress.create_server``.
    """
    waitress = require_waitress()
    _positive_int(threads, "threads")
    _positive_int(connection_limit, "connection_limit")
    _positive_int(channel_timeout, "channel_timeout")
    where: dict[str, Any] = {"sockets": [sock]} if sock is not None else {"host": host, "port": port}
    # A connection is read while its request runs, so that a request held by the wait
    # extension learns when its client closed the connection (waitress.client_disconnected).
    adjustments.setdefault("channel_request_lookahead", 1)
    # waitress 3 drops X-Forwarded-* headers that no trusted proxy set; 2.x kept them, with a
    # DeprecationWarning on every server built. The same behaviour on both, and no warning.
    adjustments.setdefault("clear_untrusted_proxy_headers", True)
    server = waitress.create_server(
        app,
        **where,
        threads=threads,
        connection_limit=connection_limit,
        channel_timeout=channel_timeout,
        # Silent connections are found by a sweep every cleanup_interval seconds.
        cleanup_interval=max(1, channel_timeout // 2),
        asyncore_use_poll=True,
        ident="lease-lock",
        max_request_body_size=max_request_body_size,
        max_request_header_size=MAX_HEADER_BYTES,
        **adjustments,
    )
    server.channel_class = _channel_class()
    return server


def serve(
    build_app: Callable[[], Any],
    host: str,
    port: int,
    *,
    workers: int = 1,
    close_app: Optional[Callable[[Any], None]] = None,
    announce: Optional[Callable[[str, int], None]] = None,
    **settings: Any,
) -> int:
    """Serve ``build_app()`` on ``host:port`` until ``SIGTERM``/``SIGINT``; returns 0.

    With ``workers`` above 1 the port is bound once and that many processes are forked to
    accept on it, each calling ``build_app()`` for an application of its own (its own store
    connection); a worker that dies is replaced, and a signal to this process stops them all.
    ``close_app(app)`` runs in each process when it stops; ``announce(url, workers)`` once the
    port accepts connections. ``settings`` are :func:`make_server`'s.
    """
    _positive_int(workers, "workers")
    if workers == 1:
        return _run(build_app(), host, port, None, close_app, announce, settings)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.create_server((host, port), family=family, backlog=1024)
    return _supervise(build_app, listener, workers, close_app, announce, settings)


def _shown(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _run(
    app: Any,
    host: str,
    port: int,
    listener: Optional[socket.socket],
    close_app: Optional[Callable[[Any], None]],
    announce: Optional[Callable[[str, int], None]],
    settings: dict[str, Any],
) -> int:
    server = make_server(app, host, port, sock=listener, **settings)
    if listener is None and announce is not None:
        announce(_shown(host, server.effective_port), 1)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
        if close_app is not None:
            close_app(app)
    return 0


def _supervise(
    build_app: Callable[[], Any],
    listener: socket.socket,
    workers: int,
    close_app: Optional[Callable[[Any], None]],
    announce: Optional[Callable[[str, int], None]],
    settings: dict[str, Any],
) -> int:
    log = logging.getLogger("lease_lock.server")
    host, port = listener.getsockname()[:2]
    children: set[int] = set()
    stopping = False

    def stop(_signum: int, _frame: Any) -> None:
        nonlocal stopping
        stopping = True
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    def spawn() -> None:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child, which never returns
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            status = 1
            try:
                status = _run(build_app(), host, port, listener, close_app, None, settings)
            except BaseException:  # a worker reports and exits, never returns to the caller
                log.exception("worker %d failed", os.getpid())
            finally:
                os._exit(status)
        children.add(pid)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for _ in range(workers):
        spawn()
    if announce is not None:
        announce(_shown(host, port), workers)
    while children:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        children.discard(pid)
        if not stopping:
            log.error("worker %d exited (status %d); starting another", pid, status)
            time.sleep(1.0)  # a worker that fails at once must not make a hot loop
            if not stopping:
                spawn()
    listener.close()
    return 0
