"""Fast hand-off: one release subscription per Locker, fanned out to its waiters.

A waiter registers its interest in a key *before* each attempt, so a release that lands between
a failed attempt and the wait still wakes it. The backend's watcher is started on first need and
shared by every waiter of the locker.

Two kinds of watcher serve it. A backend that can queue waiters in the store
(:class:`~lease_lock.backends.handoff.HandoffSource`: Redis, PostgreSQL, etcd) wakes one waiting process per
release, and the dispatcher wakes that process's longest-waiting thread: the others stay asleep
instead of all trying and all but one failing, which under contention costs more than the
hand-off itself. Otherwise every release notification wakes every waiter of the key.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Optional, Union

from .backends.base import Backend, ReleaseWatcher
from .backends.handoff import HandoffSource, HandoffWatcher
from .events import logger

__all__ = ["ReleaseDispatcher"]


class ReleaseDispatcher:
    """Maps keys to the events of the threads waiting for them (oldest first)."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._mutex = threading.Lock()
        # Insertion-ordered: a wake-one hand-off goes to the thread that has waited longest.
        self._waiters: dict[str, dict[threading.Event, None]] = {}
        self._watcher: Union[ReleaseWatcher, HandoffWatcher, None] = None
        # key -> when (time.monotonic) its holder's lease ends, as read while queueing for it.
        self._lease_ends: dict[str, float] = {}
        self._handoffs: Optional[HandoffSource] = (
            backend if isinstance(backend, HandoffSource) and backend.handoff_ready else None
        )

    @property
    def available(self) -> bool:
        """Whether the backend can deliver release notifications at all."""
        return self._backend.capabilities.release_notify or self._handoffs is not None

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
                if self._handoffs is not None:
                    self._watcher = self._handoffs.watch_handoffs(self._on_handoff)
                else:
                    self._watcher = self._backend.watch_releases(self._on_release)
            watcher = self._watcher
            events = self._waiters.setdefault(key, {})
            first = not events
            events[event] = None
        if start:
            logger.debug("release watcher started for %s", type(self._backend).__name__)
        if first and isinstance(watcher, ReleaseWatcher):
            watcher.wanted(key)
        if first and isinstance(watcher, HandoffWatcher):
            try:
                # Outside the mutex: a round trip to the store.
                left = watcher.want(key)
            except BaseException:
                self.unregister(key, event)
                raise
            if left is not None:
                with self._mutex:
                    self._lease_ends[key] = time.monotonic() + left
            if left == 0.0:
                # Released between the failed attempt and the queueing: try again at once.
                event.set()
        return event

    def lease_left(self, key: str) -> Optional[float]:
        """How long a waiter for ``key`` may sleep before its holder's lease ends, when the
        wake-one watcher knows it without asking the store: seconds (``math.inf`` when
        unknown, i.e. only a release can end the wait early), or ``None`` without a wake-one
        watcher (the caller reads the lease itself).

        The figure read while queueing serves the first wait after it only; a later wait follows
        a lost race, and nobody here knows the new holder's lease. After a woken attempt that
        lost, a watcher that keeps the waiter's turn (:meth:`HandoffWatcher.kept_turn`) says
        when to try again instead.
        """
        watcher = self._watcher
        if not isinstance(watcher, HandoffWatcher):
            return None
        kept = watcher.kept_turn(key)
        if kept is not None:
            # This process's woken attempt lost, and the store keeps its turn: try again then.
            return kept
        with self._mutex:
            end = self._lease_ends.pop(key, math.inf)
        return max(0.0, end - time.monotonic())

    def unregister(self, key: str, event: threading.Event) -> None:
        """Stop waking ``event`` for ``key``.

        A wake-one hand-off that reached ``event`` but was not used (the waiter left on a
        timeout or a cancel, or won by its own attempt) goes on to the next waiter, here or
        in another process, so that no release is swallowed.
        """
        with self._mutex:
            events = self._waiters.get(key)
            if events is None or event not in events:
                return
            del events[event]
            if not events:
                del self._waiters[key]
                self._lease_ends.pop(key, None)
            watcher = self._watcher
            handed_on = not isinstance(watcher, HandoffWatcher) or not event.is_set()
            if not handed_on and events:
                # Another thread here takes it (or is about to try anyway).
                self._wake_one(events)
                handed_on = True
        if not events and isinstance(watcher, ReleaseWatcher):
            watcher.unwanted(key)
        if isinstance(watcher, HandoffWatcher):
            if not events:
                watcher.unwant(key)
            if not handed_on:
                watcher.requeue(key)

    @staticmethod
    def _wake_one(events: dict[threading.Event, None]) -> None:
        for waiting in events:
            if not waiting.is_set():
                waiting.set()
                return

    def _on_handoff(self, key: str) -> bool:
        # Taken when some thread here waits for the key: the longest-waiting one not woken yet
        # is woken; when all were woken already they are about to try anyway.
        with self._mutex:
            events = self._waiters.get(key)
            if not events:
                return False
            self._wake_one(events)
            return True

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
            self._lease_ends.clear()
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
        self._lease_ends = {}
