"""The LISTEN side of the fast hand-off: one dedicated connection and one daemon thread."""

from __future__ import annotations

import logging
import os
import select
import threading
from typing import Any, Callable, Optional

import psycopg2
import psycopg2.extensions

from ..base import ReleaseWatcher

__all__ = ["PostgresReleaseWatcher"]

logger = logging.getLogger("lease_lock")

#: Seconds of silence after which the listener proves its connection with a query, so that a
#: connection that died without closing its socket is noticed and replaced.
_PING_AFTER = 10.0
_FIRST_BACKOFF = 0.05
_MAX_BACKOFF = 2.0


def _listener_name(parameters: dict[str, str]) -> str:
    """``application_name`` of the listening connection, so operators can tell it apart."""
    given = parameters.get("application_name")
    if given is None and "dsn" in parameters:
        given = psycopg2.extensions.parse_dsn(parameters["dsn"]).get("application_name")
    return f"{given or 'lease_lock'} listener"


class PostgresReleaseWatcher(ReleaseWatcher):
    """Listens on the table's channel and calls ``callback(key)`` for every release.

    The connection is opened by the watcher itself (from the backend's connection
    parameters) and is never shared. When it breaks (server restart, ``pg_terminate_backend``,
    network loss), ``active`` turns ``False`` and the thread reconnects with a growing pause
    (50 ms up to 2 s); releases that happen in that gap are not reported, which is why waiters
    fall back to the holder's remaining lease while ``active`` is ``False``. The connection's
    ``application_name`` is the backend's own followed by ``listener``.
    """

    def __init__(
        self, parameters: dict[str, str], channel: str, callback: Callable[[str], None]
    ) -> None:
        self._parameters = dict(parameters, application_name=_listener_name(parameters))
        self._channel = channel
        self._callback = callback
        self._stop = threading.Event()
        self._connected = threading.Event()
        self._pid: Optional[int] = None
        # A self-pipe wakes the select() at once when close() is called.
        self._wake_read, self._wake_write = os.pipe()
        self._thread = threading.Thread(
            target=self._run, name=f"lease_lock-listen-{channel}", daemon=True
        )
        self._thread.start()

    @property
    def active(self) -> bool:
        """``True`` while subscribed on a live connection."""
        return self._connected.is_set() and not self._stop.is_set()

    @property
    def backend_pid(self) -> Optional[int]:
        """The server process id of the listening connection; ``None`` while disconnected."""
        return self._pid if self.active else None

    def close(self) -> None:
        """Stop the thread and close the connection. Idempotent."""
        if self._stop.is_set():
            return
        self._stop.set()
        os.write(self._wake_write, b"x")
        if threading.current_thread() is not self._thread:
            self._thread.join(10)
        os.close(self._wake_read)
        os.close(self._wake_write)

    def _run(self) -> None:
        backoff = _FIRST_BACKOFF
        while not self._stop.is_set():
            conn: Optional[Any] = None
            try:
                conn = self._subscribe()
                backoff = _FIRST_BACKOFF
                self._listen(conn)
            except (psycopg2.OperationalError, psycopg2.InterfaceError) as exc:
                if not self._stop.is_set():
                    logger.warning("release listener lost its connection (%s); reconnecting", exc)
            finally:
                self._connected.clear()
                if conn is not None:
                    conn.close()
            if self._stop.wait(backoff):
                return
            backoff = min(backoff * 2, _MAX_BACKOFF)

    def _subscribe(self) -> Any:
        conn = psycopg2.connect(**self._parameters)
        try:
            conn.autocommit = True
            with conn.cursor() as cursor:
                cursor.execute(f'LISTEN "{self._channel}"')
        except BaseException:
            conn.close()
            raise
        self._pid = int(conn.info.backend_pid)
        self._connected.set()
        return conn

    def _listen(self, conn: Any) -> None:
        while not self._stop.is_set():
            readable, _, _ = select.select([conn, self._wake_read], [], [], _PING_AFTER)
            if self._stop.is_set():
                return
            if not readable:
                with conn.cursor() as cursor:
                    cursor.execute("SELECT 1")
            conn.poll()
            while conn.notifies:
                notification = conn.notifies.pop(0)
                try:
                    self._callback(notification.payload)
                except Exception:
                    # The contract says callbacks do not raise; one that does must not stop
                    # the hand-off for every other waiter of the locker.
                    logger.exception("release callback raised; ignored")
