"""Objects that must stay usable in a child made by ``os.fork()``.

``fork()`` copies only the calling thread. A ``threading.Lock`` that another thread held at that
moment is copied locked and is never released in the child, so the child's first use of it
hangs for ever; worse, the other thread may have been inside a C library (SQLite) holding that
library's own mutexes, which no Python code in the child can renew.

An object registered here takes part in every fork: ``before_fork()`` runs in the forking
thread just before the fork (take the mutex that guards every call into the store, so no other
thread is inside one while the process is copied), ``after_fork_in_parent()`` runs in the parent
after it (release it), and ``after_fork()`` runs in the child, while it has a single thread
(start with fresh locks). Registration holds only a weak reference: it never keeps an object
alive.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Protocol

__all__ = ["ForkAware", "MutexForkGuard", "register"]


class ForkAware(Protocol):
    """The three fork hooks of an object registered with :func:`register`."""

    def before_fork(self) -> None:
        """In the forking thread, just before the fork: quiesce (take your mutex)."""

    def after_fork_in_parent(self) -> None:
        """In the parent, after the fork: undo :meth:`before_fork`."""

    def after_fork(self) -> None:
        """In the child: replace every lock of the parent and forget its threads."""


class MutexForkGuard:
    """The fork hooks of an object whose every call into its store runs under ``self._mutex``.

    The mutex is held across the fork, so no other thread is inside a call (or inside the
    store's C library) while the process is copied; the child starts with a fresh mutex, since
    the copied one would stay locked for ever. Subclasses still call :func:`register`.
    """

    _mutex: threading.Lock

    def before_fork(self) -> None:
        """Fork hook: wait until no thread is inside a call, and keep it so."""
        self._mutex.acquire()

    def after_fork_in_parent(self) -> None:
        """Fork hook: let the parent's threads call again."""
        self._mutex.release()

    def after_fork(self) -> None:
        """Fork hook, in the child: a fresh mutex (the copied one stays locked for ever)."""
        self._mutex = threading.Lock()


_REGISTERED: weakref.WeakSet[ForkAware] = weakref.WeakSet()
# The objects quiesced by the fork in progress, in the order they were: the parent must undo
# exactly those (one registered while the fork waited is not among them).
_QUIESCED: list[ForkAware] = []


def register(instance: ForkAware) -> None:
    """Make ``instance`` take part in every ``os.fork()`` while it is alive."""
    _REGISTERED.add(instance)


def _before() -> None:
    _QUIESCED.clear()
    for instance in list(_REGISTERED):
        instance.before_fork()
        _QUIESCED.append(instance)


def _after_in_parent() -> None:
    quiesced = list(_QUIESCED)
    _QUIESCED.clear()
    for instance in reversed(quiesced):
        instance.after_fork_in_parent()


def _after_in_child() -> None:
    _QUIESCED.clear()
    for instance in list(_REGISTERED):
        instance.after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before, after_in_parent=_after_in_parent, after_in_child=_after_in_child)
