"""Release notifications over one etcd watch stream per watcher.

The watcher watches the whole namespace for deletes only (etcd's ``NOPUT`` filter), so one
stream serves every key its locker waits for, and a release, a force release and an expiry all
arrive as the same ``DELETE`` event. After a dropped stream it reconnects to the next member and
resumes from the revision after the last one it saw, so a release during the gap is still
delivered; if etcd compacted that revision away, it starts again from now.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from typing import Any, Callable, Optional

import requests

from ..base import ReleaseWatcher
from ._client import EtcdClient, b64, prefix_end, unb64

__all__ = ["EtcdReleaseWatcher"]

_log = logging.getLogger("lease_lock")

_FIRST_RETRY = 0.05
_MAX_RETRY = 1.0


class EtcdReleaseWatcher(ReleaseWatcher):
    """A thread reading one watch stream of deletes under ``prefix``."""

    def __init__(self, client: EtcdClient, prefix: bytes, callback: Callable[[str], None]) -> None:
        self._client = client
        self._prefix = prefix
        self._callback = callback
        self._stop = threading.Event()
        self._created = threading.Event()
        self._response: Optional[requests.Response] = None
        self._mutex = threading.Lock()
        self._next_revision = 0
        self._thread = threading.Thread(target=self._run, name="lease-lock-etcd-watch", daemon=True)
        self._thread.start()

    @property
    def active(self) -> bool:
        """``True`` while the stream is open and etcd confirmed the watch."""
        return self._created.is_set() and not self._stop.is_set()

    @property
    def closed(self) -> bool:
        """``True`` once :meth:`close` was called."""
        return self._stop.is_set()

    def _request(self) -> dict[str, Any]:
        create: dict[str, Any] = {
            "key": b64(self._prefix),
            "range_end": b64(prefix_end(self._prefix)),
            "filters": ["NOPUT"],
        }
        if self._next_revision:
            create["start_revision"] = str(self._next_revision)
        return {"create_request": create}

    def _run(self) -> None:
        delay = _FIRST_RETRY
        while not self._stop.is_set():
            for endpoint in self._client.order():
                if self._stop.is_set():
                    return
                try:
                    self._follow(endpoint)
                    delay = _FIRST_RETRY
                except Exception as error:  # noqa: BLE001 - the stream must outlive any failure
                    if not self._stop.is_set():
                        _log.debug("etcd watch on %s ended: %s", endpoint, error)
                finally:
                    self._created.clear()
            self._stop.wait(delay)
            delay = min(delay * 2, _MAX_RETRY)

    def _follow(self, endpoint: str) -> None:
        response = self._client.watch(endpoint, self._request())
        with self._mutex:
            if self._stop.is_set():
                response.close()
                return
            self._response = response
        try:
            for message in self._client.messages(response):
                if message.get("compact_revision") and message.get("canceled"):
                    # The revision to resume from is gone: watch from now on.
                    self._next_revision = 0
                    return
                if message.get("canceled"):
                    return
                if message.get("created"):
                    self._created.set()
                revision = int(message.get("header", {}).get("revision") or 0)
                for event in message.get("events", []):
                    if event.get("type") == "DELETE":
                        name = unb64(event.get("kv", {}).get("key"))
                        self._callback(name[len(self._prefix):].decode("utf-8", "replace"))
                    revision = max(revision, int(event.get("kv", {}).get("mod_revision") or 0))
                if revision:
                    self._next_revision = revision + 1
        finally:
            with self._mutex:
                self._response = None
            response.close()

    def close(self) -> None:
        """Stop the thread and close its stream. Idempotent."""
        self._stop.set()
        with self._mutex:
            response = self._response
        if response is not None:
            _shut(response)
        if self._thread is not threading.current_thread():
            self._thread.join(5)


def _shut(response: requests.Response) -> None:
    # A read blocked on an idle stream only returns when its socket is shut down.
    connection = getattr(response.raw, "connection", None)
    sock = getattr(connection, "sock", None)
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    response.close()
