"""The locks one Locker holds, and which key each thread holds through it: closing and forking
give back or drop the held locks, re-entrant holds join them, and a thread waiting for itself is
told so.

A :class:`HeldLeases` keeps every granted lock under a weak reference, so that a lock dropped
while held is collected (and stops being extended). Its collection is reported: the reference's
callback, which runs inside the garbage collector, only hands the lease's key and token to be
given back by a library thread (the heartbeat's) and warns with a
:class:`~lease_lock.errors.DroppedLockWarning`: a ``RuntimeWarning``, which Python shows by
default, since the code meant to run under the lock now runs without it. A handle that joined
another lease (a re-entrant acquire) is kept the same way, and its drop is given back the same
way: the library thread lets go of its hold, which gives the key back only when it was the last
one.

Finding the lock a thread holds on a key goes through an index of ``(thread, key)``, which is
built only once something asks (a re-entrant acquire, or a contention error to explain): a
program that never does pays nothing for it per acquisition. Once built, it is kept up to date
with every grant.
"""

from __future__ import annotations

import functools
import sys
import threading
import warnings
import weakref
from typing import TYPE_CHECKING, Callable, Optional, Protocol

from .errors import DroppedLockWarning, LockHeldError

if TYPE_CHECKING:
    from ._lease import Hold, Lease

__all__ = ["Dropped", "HeldLeases"]

#: Size at which entries of collected locks are first swept.
_FIRST_SWEEP = 1024


if TYPE_CHECKING:
    _LockRef = weakref.ref[Lease]
    _HandleRef = weakref.ref[object]
else:
    _LockRef = _HandleRef = weakref.ref


class _Held(_LockRef):
    """A held lock's weak reference, carrying what giving its lease back needs once it is gone."""

    __slots__ = ("key", "made_by", "token")
    key: str
    token: str
    made_by: str


class _Joined(_HandleRef):
    """A joined handle's weak reference, carrying the lease it joined and the handle's hold: what
    letting go of that hold needs once the handle is gone."""

    __slots__ = ("hold", "lease")
    hold: Hold
    lease: Lease


class Dropped(Protocol):
    """Where a dropped lock's lease goes to be given back (the heartbeat's ``give_back_dropped``)."""

    def __call__(self, key: str, token: str, let_go: Optional[Callable[[], object]] = None) -> None:
        """Queue giving back ``key`` held with ``token`` (or calling ``let_go`` instead, for a
        joined handle's hold); never blocks, never reaches the store."""


class HeldLeases:
    """The locks granted through one Locker, and by thread and key once asked. Thread-safe.

    ``dropped(key, token)`` is called, inside the garbage collector, for a lock collected while
    still held, and ``dropped(key, token, let_go)`` for a joined handle collected before it let
    go of its hold; it must only queue the work (the heartbeat's ``give_back_dropped`` does).
    """

    def __init__(self, dropped: Dropped) -> None:
        self._mutex = threading.Lock()
        self._dropped = dropped
        # Weak references with a callback (see _collected); a live one equals any weak reference
        # to the same lock, so forget() finds it with a plain one. A reference whose lock was
        # collected reads None and is swept in bulk (see _sweep_held), which costs a grant
        # nothing. A dead reference equals only itself, so the sweep can never drop a live lock
        # that happens to reuse a collected one's id.
        self._held: set[weakref.ref[Lease]] = set()
        self._held_sweep_at = _FIRST_SWEEP
        # The handles that joined a held lease, kept apart: they hold no lease of their own for
        # closing or the index, and each is discarded when collected (see _collected_joined).
        self._joined: set[_Joined] = set()
        # (thread id, key) -> the locks; kept once first asked (see the module docstring):
        # grants are noted from the moment ``_noting`` is set, and the index is read without
        # the mutex once it is complete (``_indexed``).
        self._entries: dict[tuple[int, str], tuple[weakref.ref[Lease], ...]] = {}
        self._sweep_at = _FIRST_SWEEP
        self._noting = False
        self._indexed = False

    # -- the held set --------------------------------------------------------------------------

    def add(self, lock: Lease) -> None:
        """``lock`` was just granted to the calling thread."""
        reference = _Held(lock, self._collected)
        reference.key = lock.key
        reference.token = lock.token
        reference.made_by = lock.made_by
        self._held.add(reference)
        if len(self._held) >= self._held_sweep_at:
            self._sweep_held()
        # Checked after adding: an index built meanwhile either saw this lock in the set or is
        # seen here (see _index).
        if self._noting:
            self._note(lock, reference)

    def _sweep_held(self) -> None:
        with self._mutex:
            # list() copies the set in one step, while other threads may be adding to it.
            for reference in [reference for reference in list(self._held) if reference() is None]:
                self._held.discard(reference)
            # Sweeping again only after as many new entries as live ones keeps it amortized O(1).
            self._held_sweep_at = max(_FIRST_SWEEP, 2 * len(self._held))

    def _collected(self, reference: _Held) -> None:
        # Inside the garbage collector: a lock still in the set was dropped while held (a
        # released or lost lock was forgotten already, and closing the locker empties the set).
        # Nothing here may block or reach the store: the lease is queued for a library thread.
        held = self._held
        if reference not in held or sys.is_finalizing():
            return
        held.discard(reference)
        self._dropped(reference.key, reference.token)
        _warn_dropped(reference.key, reference.made_by)

    def joined(self, handle: object, hold: Hold, lease: Lease) -> None:
        """``handle`` just joined ``lease`` (a re-entrant acquire) with ``hold``: if it is
        collected before ``hold`` lets go, the hold is let go of for it."""
        reference = _Joined(handle, self._collected_joined)
        reference.hold = hold
        reference.lease = lease
        self._joined.add(reference)

    def _collected_joined(self, reference: _Joined) -> None:
        # Inside the garbage collector, as _collected. A handle that let go of its hold (or
        # whose lease the closing locker took) leaves nothing to give back.
        joined = self._joined
        if reference not in joined or sys.is_finalizing():
            return
        joined.discard(reference)
        hold, lease = reference.hold, reference.lease
        if hold.let_go:
            return
        self._dropped(lease.key, lease.token, functools.partial(lease.release, hold))
        # The handle's own hold remembers the call that returned the handle.
        _warn_dropped(lease.key, hold.made_by)

    def forget(self, lock: Lease) -> None:
        """``lock`` was released or lost: closing the locker has nothing left to give back for
        it, and collecting it is no drop."""
        self._held.discard(weakref.ref(lock))

    def take(self) -> list[Lease]:
        """Every lock still granted, emptying the set (the Locker is closing or forked)."""
        held, self._held = self._held, set()
        self._joined = set()
        return [lock for reference in list(held) if (lock := reference()) is not None]

    # -- by thread and key ---------------------------------------------------------------------

    def _note(self, lock: Lease, reference: weakref.ref[Lease]) -> None:
        thread = lock.thread
        if thread is None or thread.ident is None:
            return
        with self._mutex:
            entries = self._entries
            # The latest grant to this thread on this key is the one it holds.
            entries[(thread.ident, lock.key)] = (reference,)
            if len(entries) >= self._sweep_at:
                self._entries = entries = {
                    slot: alive for slot, references in entries.items() if (alive := _alive(references))
                }
                self._sweep_at = max(_FIRST_SWEEP, 2 * len(entries))

    def _index(self) -> dict[tuple[int, str], tuple[weakref.ref[Lease], ...]]:
        if self._indexed:
            return self._entries
        with self._mutex:
            if not self._noting:
                # Built under the mutex, which _note waits for, and published before the held
                # set is read: a grant is either in the set now or notes itself afterwards. The
                # order of grants is not known here, so every lock the thread was granted on a
                # key is kept (find() reads their state, which reads the clock and may run event
                # hooks, so not under the mutex).
                self._noting = True
                built = self._entries
                for reference in list(self._held):
                    lock = reference()
                    thread = None if lock is None else lock.thread
                    if lock is not None and thread is not None and thread.ident is not None:
                        slot = (thread.ident, lock.key)
                        built[slot] = (*built.get(slot, ()), reference)
                # Only now may a thread read the index without the mutex.
                self._indexed = True
            return self._entries

    def find(self, key: str) -> Optional[Lease]:
        """The lock the calling thread holds on ``key`` (read against the clock), else ``None``."""
        current = threading.current_thread()
        for reference in self._index().get((threading.get_ident(), key), ()):
            lock = reference()
            # A thread id can be reused once its thread ended: the lock must be this very thread's.
            if lock is not None and lock.thread is current and lock.state == "held":
                return lock
        return None

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


def _warn_dropped(key: str, made_by: str) -> None:
    # Called once the work is queued: the warning may be turned into an error.
    handle = "LockSet" if made_by == "acquire_many" else "Lock"
    warnings.warn(
        f"the {handle} on {key!r} that Locker.{made_by}() returned was dropped while held, so the "
        f"key is given back now and the code meant to run under it runs unprotected: keep the "
        f"returned {handle} in a variable and release it, or use it in 'with'",
        DroppedLockWarning,
        stacklevel=3,
    )


def _alive(references: tuple[weakref.ref[Lease], ...]) -> tuple[weakref.ref[Lease], ...]:
    return tuple(reference for reference in references if reference() is not None)
