"""A process-wide :class:`~lease_lock.Locker`, built on first use and rebuilt after ``fork``.

Web servers, task queues and management commands fork worker processes from a parent that may
already have imported (or even used) the integration. A locker's backend connections must not
be shared across that fork, so each process builds its own the first time it asks.
"""

from __future__ import annotations

import atexit
import os
import threading
import weakref
from typing import Any, Callable, Optional

from ..locker import Locker

__all__ = ["LazyLocker", "LockerProxy"]

_HOLDERS: weakref.WeakSet[LazyLocker] = weakref.WeakSet()


def _forget_after_fork() -> None:
    for holder in list(_HOLDERS):
        holder._after_fork()


def _close_at_exit() -> None:
    for holder in list(_HOLDERS):
        holder.reset()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
atexit.register(_close_at_exit)


class LazyLocker:
    """Holds the one ``Locker`` of this process, made by ``factory`` on first :meth:`get`.

    Guarantees: ``factory`` runs at most once per process until :meth:`reset`; the locker is
    closed at interpreter exit (its held locks are given back); a forked child never uses or
    closes its parent's locker and builds its own on first use.
    """

    def __init__(self, factory: Callable[[], Locker]) -> None:
        self._factory = factory
        self._mutex = threading.Lock()
        self._locker: Optional[Locker] = None
        self._pid = os.getpid()
        # A child keeps its parent's locker referenced but unused: letting it be collected
        # could close driver connections whose sockets the parent still uses.
        self._inherited: list[Locker] = []
        _HOLDERS.add(self)

    def get(self) -> Locker:
        """This process's locker, built now if there is none yet."""
        with self._mutex:
            if self._pid != os.getpid():
                self._orphan()
            if self._locker is None or self._locker.closed:
                self._locker = self._factory()
            return self._locker

    @property
    def built(self) -> bool:
        """``True`` when this process has a locker (``get()`` will not build one)."""
        return self._locker is not None and self._pid == os.getpid() and not self._locker.closed

    def reset(self) -> None:
        """Close this process's locker, if any; the next :meth:`get` builds a new one (for
        example after the settings changed)."""
        with self._mutex:
            if self._pid != os.getpid():
                self._orphan()
            locker, self._locker = self._locker, None
        if locker is not None:
            locker.close()

    def _orphan(self) -> None:
        if self._locker is not None:
            self._inherited.append(self._locker)
        self._locker = None
        self._pid = os.getpid()

    def _after_fork(self) -> None:
        # The parent's mutex may have been held by another thread at the moment of the fork.
        self._mutex = threading.Lock()
        self._orphan()


class LockerProxy:
    """Stands for the locker of a :class:`LazyLocker`, looked up (and built) on every use.

    Attribute access is forwarded, so a module-level ``locker`` can be imported once and still
    reach the right ``Locker`` in every process, including forked children.
    """

    __slots__ = ("_holder",)

    def __init__(self, holder: LazyLocker) -> None:
        self._holder = holder

    def __getattr__(self, name: str) -> Any:
        return getattr(self._holder.get(), name)

    def __repr__(self) -> str:
        # repr() must not connect to anything, so an unbuilt locker is only described.
        if self._holder.built:
            return f"<LockerProxy for {self._holder.get()!r}>"
        return "<LockerProxy (built on first use)>"
