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
from typing import Callable, NamedTuple, Optional, Protocol, runtime_checkable

__all__ = ["HandoffSource", "HandoffWatcher", "LineGrant", "LineSource", "WaitingLine"]


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


class LineGrant(NamedTuple):
    """A grant that reached a waiting thread through its place in line.

    ``fence`` is the grant's fence (``0`` when none was asked for). ``sent`` is when (on the
    clock the line was given) a request left that the store served before it made the grant,
    and ``lease`` the seconds the store's lease runs from the grant at least, so that the waiter
    can judge its lease as it judges any grant: ``sent + lease``, never longer. ``claimed`` is
    ``True`` for a key a release handed over: its lease is the claim window, which the waiter
    must extend to a full lease before it ends; ``False`` for a key the waiter's own request
    took (a full lease of the TTL asked for).
    """

    fence: int
    sent: float
    lease: float
    claimed: bool


class WaitingLine(abc.ABC):
    """One waiting thread's place in the line of one key: one connection, blocked only while
    :meth:`wait` runs. Made by :meth:`LineSource.join_line`; used by that thread alone."""

    @abc.abstractmethod
    def ask(self) -> Optional[int]:
        """One attempt at the key that keeps this waiter's place: the fence (``0`` when none
        was asked for) of a full grant when the key was free or already this waiter's (its
        place then goes with the grant), else ``None``, with its place taken or refreshed.
        Raises ``BackendUnavailableError`` when the store cannot be reached."""

    @abc.abstractmethod
    def wait(self, seconds: float) -> Optional[LineGrant]:
        """Keep this waiter's place in line for up to ``seconds`` and block until a release
        hands it the key: the grant, or ``None`` when the time ran out first. A place not taken
        yet, or due for its refresh, is taken with :meth:`ask` first, which a free key answers
        with a full grant. Raises ``BackendUnavailableError`` when the store cannot be reached."""

    @abc.abstractmethod
    def leave(self, granted: bool) -> None:
        """Give up the place in line. Unless ``granted`` (the acquisition holds the key, its
        place gone with the grant), a key handed over meanwhile is released again, to the next
        waiter. Best effort: never raises; a place left behind goes stale on its own."""


@runtime_checkable
class LineSource(Protocol):
    """A backend that can hand a released key straight to the next waiter in line."""

    def join_line(
        self, key: str, token: str, ttl: float, owner: str, fenced: bool, clock: Callable[[], float]
    ) -> Optional[WaitingLine]:
        """A place in ``key``'s line for a thread waiting with ``token`` for a lease of ``ttl``
        seconds, timed on ``clock``; ``None`` when no place can be had now (the backend's bound
        on waiting connections is reached, or its configuration allows none). Asks the store
        nothing: the first :meth:`WaitingLine.wait` does."""
