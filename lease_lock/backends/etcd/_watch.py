"""Watch streams over a namespace: release notifications, and the stream the hand-off rides on.

:class:`WatchStream` is one thread reading one watch stream over the whole namespace. After a
dropped stream it reconnects to the next member and resumes from the revision after the last one
it saw, so an event during the gap is still delivered; if etcd compacted that revision away, it
starts again from now (a subclass is told, and may read what it missed first).

:class:`EtcdReleaseWatcher` watches for deletes only (etcd's ``NOPUT`` filter), so one stream
serves every key its locker waits for, and a release, a force release and an expiry all arrive
as the same ``DELETE`` event.

Names in the namespace that start with a NUL byte after it are not lock keys (lock keys contain
no NUL): the hand-off queues and lines and the places of counting keys live there, and with an
empty namespace the rate counters too. A namespace nested in another (``locks/eu/`` in
``locks/``) puts its own there, which the outer one sees with a NUL further in.
:func:`lock_key` tells them all apart: any NUL after the namespace makes a name no lock key.
:func:`counted_key` tells which key a place of a counting key (``key + NUL + "place" + NUL +
token``) belongs to: a place's end announces a release of its key as the key's own delete does.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import socket
import threading
from typing import Any, Callable, ClassVar, Optional

import requests

from ..base import ReleaseWatcher
from ._client import EtcdClient, b64, prefix_end, unb64

__all__ = ["PLACE_MARK", "RESERVED", "EtcdReleaseWatcher", "WatchStream", "counted_key", "lock_key"]

_log = logging.getLogger("lease_lock")

_FIRST_RETRY = 0.05
_MAX_RETRY = 1.0
#: What follows the namespace in every name of the namespace that is not a lock key.
RESERVED = b"\x00"
#: What follows the key in the name of every place of a counting key (see ``_places``).
PLACE_MARK = RESERVED + b"place" + RESERVED


def lock_key(prefix: bytes, name: bytes) -> Optional[bytes]:
    """The lock key (encoded) that ``name`` under ``prefix`` is, or ``None`` for a name of the
    namespace that is no lock (a place in line, a queue entry or a rate counter, of this
    namespace or of one nested in it)."""
    rest = name[len(prefix):]
    return None if RESERVED in rest else rest


def counted_key(prefix: bytes, name: bytes) -> Optional[bytes]:
    """The lock key (encoded) whose place ``name`` under ``prefix`` is, or ``None`` when
    ``name`` is no place of a counting key. A nested namespace's places are places of the
    outer one's key that names the inner namespace and the key, as its lock keys are."""
    key, mark, _token = name[len(prefix):].partition(PLACE_MARK)
    return key if mark and key and RESERVED not in key else None


class WatchStream(abc.ABC):
    """A daemon thread reading one watch stream over every name under ``prefix``.

    A subclass says which events it wants (``_filters``), handles each message's events
    (:meth:`_handle`) and may prepare before each connection (:meth:`_prepare`); it calls
    :meth:`_start` once its own state is set up.
    """

    #: etcd's watch filters for the stream (``NOPUT``, ``NODELETE``).
    _filters: ClassVar[tuple[str, ...]] = ()
    _thread_name: ClassVar[str] = "lease-lock-etcd-watch"

    def __init__(self, client: EtcdClient, prefix: bytes) -> None:
        self._client = client
        self._prefix = prefix
        self._stop = threading.Event()
        self._created = threading.Event()
        self._response: Optional[requests.Response] = None
        self._stream_mutex = threading.Lock()
        #: The first revision the next stream is to deliver (0: from now on).
        self._next_revision = 0
        self._thread = threading.Thread(target=self._run, name=self._thread_name, daemon=True)

    def _start(self) -> None:
        self._thread.start()

    @property
    def active(self) -> bool:
        """``True`` while the stream is open and etcd confirmed the watch."""
        return self._created.is_set() and not self._stop.is_set()

    def wait_active(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for etcd to confirm the watch; whether it did."""
        return self._created.wait(timeout) and not self._stop.is_set()

    @property
    def closed(self) -> bool:
        """``True`` once :meth:`close` was called."""
        return self._stop.is_set()

    def _request(self) -> dict[str, Any]:
        create: dict[str, Any] = {"key": b64(self._prefix), "range_end": b64(prefix_end(self._prefix))}
        if self._filters:
            create["filters"] = list(self._filters)
        if self._next_revision:
            create["start_revision"] = str(self._next_revision)
        return {"create_request": create}

    def _prepare(self) -> None:
        """Before each connection (on the stream's thread); may set ``_next_revision``."""

    @abc.abstractmethod
    def _handle(self, events: list[dict[str, Any]]) -> None:
        """The events of one message, in order (on the stream's thread)."""

    def _run(self) -> None:
        delay = _FIRST_RETRY
        while not self._stop.is_set():
            for endpoint in self._client.order():
                if self._stop.is_set():
                    return
                try:
                    self._prepare()
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
        with self._stream_mutex:
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
                events = message.get("events", [])
                if events:
                    self._handle(events)
                for event in events:
                    revision = max(revision, int(event.get("kv", {}).get("mod_revision") or 0))
                if revision:
                    self._next_revision = revision + 1
        finally:
            with self._stream_mutex:
                self._response = None
            response.close()

    def close(self) -> None:
        """Stop the thread and close its stream. Idempotent."""
        self._stop.set()
        with self._stream_mutex:
            response = self._response
        if response is not None:
            _shut(response)
        if self._thread is not threading.current_thread() and self._thread.ident is not None:
            self._thread.join(5)


class EtcdReleaseWatcher(WatchStream, ReleaseWatcher):
    """A thread reading one watch stream of deletes under ``prefix``; ``callback(key)`` for
    every deleted lock key and every deleted place of a counting key."""

    _filters = ("NOPUT",)

    def __init__(self, client: EtcdClient, prefix: bytes, callback: Callable[[str], None]) -> None:
        super().__init__(client, prefix)
        self._callback = callback
        self._start()

    def _handle(self, events: list[dict[str, Any]]) -> None:
        for event in events:
            if event.get("type") != "DELETE":
                continue
            name = unb64(event.get("kv", {}).get("key"))
            key = lock_key(self._prefix, name)
            if key is None:
                key = counted_key(self._prefix, name)
            if key is not None:
                self._callback(key.decode("utf-8", "replace"))


def _shut(response: requests.Response) -> None:
    # A read blocked on an idle stream only returns when its socket is shut down.
    connection = getattr(response.raw, "connection", None)
    sock = getattr(connection, "sock", None)
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    response.close()
