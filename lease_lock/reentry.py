"""Which key each thread holds through one Locker: re-entrant holds, and telling a thread that
it is waiting for itself.

A :class:`ThreadHolds` index maps ``(thread, key)`` to the lock that thread was granted, so that
a nested acquire of a key the same thread already holds through the same locker can join that
lease (``reentrant=True``), or, without it, fail with an error that says what happened instead
of "held elsewhere".
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Optional

from .errors import LockHeldError

if TYPE_CHECKING:
    from .lock import Lock

__all__ = ["ThreadHolds"]

_Entry = tuple["weakref.ref[threading.Thread]", "weakref.ref[Lock]"]
#: Index size at which entries of collected locks are first swept.
_FIRST_SWEEP = 1024


class ThreadHolds:
    """The locks granted to each thread, by key, for one Locker. Thread-safe."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._entries: dict[tuple[int, str], _Entry] = {}
        # Entries of collected locks are swept once the index grows past this (see note).
        self._sweep_at = _FIRST_SWEEP

    def note(self, lock: Lock) -> None:
        """``lock`` was just granted to the calling thread."""
        # Plain weak references (no callback, so CPython hands out the object's existing one):
        # a collected lock's entry reads as absent in find() and is swept in bulk below, which
        # costs the uncontended cycle nothing, where a callback per lock cost a closure and a
        # second pass through the mutex.
        entry = (weakref.ref(threading.current_thread()), weakref.ref(lock))
        slot = (threading.get_ident(), lock.key)
        with self._mutex:
            self._entries[slot] = entry
            if len(self._entries) >= self._sweep_at:
                self._entries = {
                    key: value for key, value in self._entries.items() if value[1]() is not None
                }
                # Sweeping again only after as many new entries as live ones keeps it amortized O(1).
                self._sweep_at = max(_FIRST_SWEEP, 2 * len(self._entries))

    def find(self, key: str) -> Optional[Lock]:
        """The lock the calling thread holds on ``key`` (read against the clock), else ``None``."""
        slot = (threading.get_ident(), key)
        with self._mutex:
            entry = self._entries.get(slot)
        if entry is None:
            return None
        thread, reference = entry
        lock = reference()
        # A thread id can be reused once its thread ended: the entry must be this very thread's.
        if thread() is not threading.current_thread() or lock is None or lock.state != "held":
            return None
        return lock

    def explain(self, key: str, error: LockHeldError) -> LockHeldError:
        """``error``, or a clearer one when the calling thread itself holds ``key``."""
        if error.reason not in ("held", "timeout") or self.find(key) is None:
            return error
        name = threading.current_thread().name
        return LockHeldError(
            key,
            attempts=error.attempts,
            elapsed=error.elapsed,
            reason=error.reason,
            holder=(
                f"is held by this very thread ({name!r}) through this Locker; a nested acquire "
                "contends with the outer hold unless reentrant=True is given (to the Locker or "
                "to the call), which joins the outer hold instead"
            ),
        )
