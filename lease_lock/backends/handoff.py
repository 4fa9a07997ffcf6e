"""Optional interface: wake one waiting process per release instead of every one.

A broadcast release notification (:meth:`Backend.watch_releases`) wakes every process waiting
for a key; all of them try, one wins, and the failed attempts of the others cost more than the
hand-off itself. A backend that can queue waiters in the store offers
:meth:`HandoffSource.watch_handoffs` as well: each release then wakes one waiting watcher, the
one that has waited longest, and the others stay asleep.

The core uses it when ``handoff_ready`` is true and falls back to ``watch_releases``
otherwise. A store-side wake that finds nobody waiting in the process that received it is put
back (:meth:`HandoffWatcher.requeue`) so that another process gets it.

A backend can go one step further (:class:`LineSource`): a waiting thread takes a place in the
key's line in the store and blocks on a connection of its own, and a release hands the key to
the first live waiter in line *in the same atomic step*. The waiter wakes up already holding the
key, for a short claim window (:class:`LineGrant`), which its heartbeat turns into a full lease;
a waiter that died, stopped or left before it could do so loses the key when the window ends.
"""

from __future__ import annotations

import abc
from typing import Callable, Optional, Protocol, runtime_checkable

__all__ = ["HandoffSource", "HandoffWatcher"]


class HandoffWatcher(abc.ABC):
    """A running wake-one subscription: one connection and one thread per watcher.

    Its callback receives a key whose release woke this watcher and answers whether a waiter
    of this process took the wake; on ``False`` the watcher puts the wake back for another
    process. The callback runs on the watcher's thread, must return quickly and must not raise.
    """

    @property
    @abc.abstractmethod
    def active(self) -> bool:
        """``True`` while wakes are flowing (connected and queued for the wanted keys)."""

    @abc.abstractmethod
    def want(self, key: str) -> Optional[float]:
        """Queue this watcher for releases of ``key`` until :meth:`unwant`.

        Returns once a release of ``key`` from now on is certain to leave a wake for some
        watcher: the seconds left of the key's lease as the store saw it then (``0.0`` when
        the key is free, so a release before this call is not missed), or ``None`` when the
        watcher was queued already and asked the store nothing. Raises
        ``BackendUnavailableError`` when the store cannot be reached.
        """

    @abc.abstractmethod
    def unwant(self, key: str) -> None:
        """Stop queueing for ``key`` (a wake already on its way is put back)."""

    @abc.abstractmethod
    def requeue(self, key: str) -> None:
        """Put back a wake for ``key`` that was taken but not used (best effort, never raises)."""

    def kept_turn(self, key: str) -> Optional[float]:
        """Seconds until a waiter here whose woken attempt at ``key`` just lost should try
        again on its own, or ``None`` (wait for the next wake as usual).

        A store may keep a woken waiter's turn for a moment after it lost the race to a holder
        that took the key straight back: releases meanwhile wake nobody, and the waiter tries
        again when this says. Each figure is handed out once. The default keeps no turn.
        """
        return None

    @abc.abstractmethod
    def close(self) -> None:
        """Stop the thread and free the connection. Idempotent."""


@runtime_checkable
class HandoffSource(Protocol):
    """A backend that can wake one waiting process per release."""

    @property
    def handoff_ready(self) -> bool:
        """Whether :meth:`watch_handoffs` works with this backend's configuration."""

    def watch_handoffs(self, callback: Callable[[str], bool]) -> HandoffWatcher:
        """Start a wake-one watcher calling ``callback(key)`` (see :class:`HandoffWatcher`)."""
