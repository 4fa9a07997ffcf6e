"""Fast hand-off: one release subscription per Locker, fanned out to its waiters.

A waiter registers its interest in a key *before* each attempt, so a release that lands between
a failed attempt and the wait still wakes it. The backend's watcher is started on first need and
shared by every waiter of the locker.
"""

from __future__ import annotations

import threading
from typing import Optional

from .backends.base import Backend, ReleaseWatcher
from .events import logger

__all__ = ["ReleaseDispatcher"]


class ReleaseDispatcher:
    """Maps keys to the events of the threads waiting for them."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._mutex = threading.Lock()
        self._waiters: dict[str, set[threading.Event]] = {}
        self._watcher: Optional[ReleaseWatcher] = None

    @property
    def available(self) -> bool:
        """Whether the backend can deliver release notifications at all."""
        return self._backend.capabilities.release_notify

    @property
    def watching(self) -> bool:
        """``True`` once a watcher was started (until :meth:`close`)."""
        return self._watcher is not None

    @property
    def active(self) -> bool:
        """``True`` while notifications are flowing."""
        watcher = self._watcher
        return watcher is not None and watcher.active

    def register(self, key: str) -> threading.Event:
        """An event that is set when ``key`` is released; starts the watcher if needed.

        What starting the watcher raises (``BackendUnavailableError`` for a store that is down)
        propagates, and nothing stays registered.
        """
        event = threading.Event()
        with self._mutex:
            start = self._watcher is None
            if start:
                self._watcher = self._backend.watch_releases(self._on_release)
            self._waiters.setdefault(key, set()).add(event)
        if start:
            logger.debug("release watcher started for %s", type(self._backend).__name__)
        return event

    def unregister(self, key: str, event: threading.Event) -> None:
        """Stop waking ``event`` for ``key``."""
        with self._mutex:
            events = self._waiters.get(key)
            if events is not None:
                events.discard(event)
                if not events:
                    del self._waiters[key]

    def _on_release(self, key: str) -> None:
        with self._mutex:
            events = list(self._waiters.get(key, ()))
        for event in events:
            event.set()

    def close(self) -> None:
        """Stop the watcher. Idempotent."""
        with self._mutex:
            watcher, self._watcher = self._watcher, None
            waiting = [event for events in self._waiters.values() for event in events]
            self._waiters.clear()
        # Wake every waiter: its next look finds the locker closed.
        for event in waiting:
            event.set()
        if watcher is not None:
            watcher.close()

    def after_fork(self) -> None:
        """In a forked child: the parent's watcher thread is gone; forget it without closing
        (its connection belongs to the parent)."""
        self._mutex = threading.Lock()
        self._watcher = None
        self._waiters = {}
