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

import sys
import threading
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Callable, Generic, Optional, Protocol, TypeVar

from .errors import DroppedLockWarning, LockHeldError

__all__ = ["Dropped", "Held", "HeldEntry", "HeldLeases"]

#: Size at which entries of collected locks are first swept.
_FIRST_SWEEP = 1024


class Held(Protocol):
    """What the held set reads of a lock: its key, the thread granted it, its state."""

    @property
    def key(self) -> str:
        """The lock's key."""

    @property
    def thread(self) -> Optional[threading.Thread]:
        """The thread that was granted it."""

    @property
    def state(self) -> str:
        """Its state as of now (``"held"`` while held)."""


#: The locks of a held set (the library's Lock).
Lock = TypeVar("Lock", bound=Held)

if TYPE_CHECKING:
    _LockRef = weakref.ref[Any]
else:
    _LockRef = weakref.ref


class HeldEntry(_LockRef):
    """A held lock's weak reference, carrying what giving its lease back needs once it is gone.

    The same reference is the lock's entry in the heartbeat (its arrival and its timers), so a
    grant makes one weak reference, not one per place that must not keep the lock alive."""

    __slots__ = ("done", "key", "let_go", "made_by", "token")
    key: str
    token: str
    made_by: str
    #: Set when the lock lets go of the key (released or lost): its collection is then no drop.
    done: bool
    #: For a re-entrant handle's entry: lets go of the handle's hold on the lease it joined.
    let_go: Optional[Callable[[], object]]


class Dropped(Protocol):
    """Where a dropped lock's lease goes to be given back (the heartbeat's ``give_back_dropped``)."""

    def __call__(self, key: str, token: str, let_go: Optional[Callable[[], object]] = None) -> None:
        """Queue giving back ``key`` held with ``token`` (or calling ``let_go`` instead, for a
        joined handle's hold); never blocks, never reaches the store."""


class HeldLeases(Generic[Lock]):
    """The locks granted through one Locker, and by thread and key once asked. Thread-safe.

    ``dropped(key, token)`` is called, inside the garbage collector, for a lock collected while
    still held, and ``dropped(key, token, let_go)`` for a joined handle collected before it let
    go of its hold; it must only queue the work (the heartbeat's ``give_back_dropped`` does).
    """

    def __init__(self, dropped: Dropped) -> None:
        self._mutex = threading.Lock()
        self._dropped = dropped
        # Weak references with a callback (see _collected), each kept here until its lock is
        # collected: the callback then takes it out. A lock that lets go of its key only marks
        # its entry ``done`` (a store, not a call: see forget), so a grant and its release cost
        # one entry and one callback, and no sweep is ever needed.
        self._held: set[HeldEntry] = set()
        # The handles that joined a held lease, kept apart: they hold no lease of their own for
        # closing or the index, and each is discarded when collected (see _collected_joined).
        self._joined: set[HeldEntry] = set()
        # (thread id, key) -> the locks; kept once first asked (see the module docstring):
        # grants are noted from the moment ``_noting`` is set, and the index is read without
        # the mutex once it is complete (``_indexed``).
        self._entries: dict[tuple[int, str], tuple[weakref.ref[Lock], ...]] = {}
        self._sweep_at = _FIRST_SWEEP
        self._noting = False
        self._indexed = False

    # -- the held set --------------------------------------------------------------------------

    def add(self, lock: Lock, key: str, token: str, made_by: str) -> HeldEntry:
        """``lock`` (on ``key`` with ``token``, returned by ``Locker.<made_by>()``) is being
        granted to the calling thread; returns its entry, for :meth:`forget`."""
        reference = HeldEntry(lock, self._collected)
        reference.key = key
        reference.token = token
        reference.made_by = made_by
        reference.done = False
        self._held.add(reference)
        # Checked after adding: an index built meanwhile either saw this lock in the set or is
        # seen here (see _index).
        if self._noting:
            self._note(lock, reference)
        return reference

    def _collected(self, reference: HeldEntry) -> None:
        # Inside the garbage collector. A lock whose entry is not done was dropped while held
        # (closing the locker empties the set first). Nothing here may block or reach the
        # store: the lease is queued for a library thread.
        held = self._held
        if reference not in held:
            return
        held.discard(reference)
        if reference.done or sys.is_finalizing():
            return
        self._dropped(reference.key, reference.token)
        _warn_dropped(reference.key, reference.made_by)

    def joined(
        self, handle: Lock, key: str, token: str, made_by: str, let_go: Callable[[], object]
    ) -> HeldEntry:
        """``handle`` just joined the lease on ``key`` held with ``token`` (a re-entrant
        acquire): if it is collected before it lets go of its hold (:meth:`forget`),
        ``let_go()`` is called for it. Returns its entry."""
        reference = HeldEntry(handle, self._collected_joined)
        reference.key = key
        reference.token = token
        reference.made_by = made_by
        reference.let_go = let_go
        reference.done = False
        self._joined.add(reference)
        return reference

    def _collected_joined(self, reference: HeldEntry) -> None:
        # Inside the garbage collector, as _collected. A handle that let go of its hold (or
        # whose lease the closing locker took) leaves nothing to give back.
        joined = self._joined
        if reference not in joined:
            return
        joined.discard(reference)
        if reference.done or sys.is_finalizing():
            return
        self._dropped(reference.key, reference.token, reference.let_go)
        _warn_dropped(reference.key, reference.made_by)

    @staticmethod
    def forget(reference: Optional[HeldEntry]) -> None:
        """The lock (or re-entrant handle) of ``reference``, its entry from :meth:`add` or
        :meth:`joined`, let go of its key or hold: closing the locker has nothing left to give
        back for it, and collecting it is no drop. The hot path marks ``reference.done``
        itself, which is all this does."""
        if reference is not None:
            reference.done = True

    def take(self) -> list[Lock]:
        """Every lock still granted, emptying the set (the Locker is closing or forked)."""
        held, self._held = self._held, set()
        self._joined = set()
        return [lock for reference in list(held) if not reference.done and (lock := reference()) is not None]

    # -- by thread and key ---------------------------------------------------------------------

    def _note(self, lock: Lock, reference: weakref.ref[Lock]) -> None:
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

    def _index(self) -> dict[tuple[int, str], tuple[weakref.ref[Lock], ...]]:
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

    def find(self, key: str) -> Optional[Lock]:
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


def _alive(references: tuple[weakref.ref[Lock], ...]) -> tuple[weakref.ref[Lock], ...]:
    return tuple(reference for reference in references if reference() is not None)
