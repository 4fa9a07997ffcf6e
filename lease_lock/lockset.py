""":class:`LockSet`: several locks held together, from ``Locker.acquire_many``."""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional, TypeVar

from ._lease import GuardedBlock, Lock, give_up, lost_cause, on_loss, states_of, wait_for_loss
from .errors import LockLostError, LockStateError

_Result = TypeVar("_Result")

__all__ = ["LockSet", "SetLossSignal"]


class SetLossSignal(threading.Event):
    """``lockset.lost``: set as soon as any lock of the set is lost (read against the clock).

    Every member tells the signal when it is lost, so ``wait()`` wakes at once whichever member
    it is; waits are still sliced to re-read the clock for leases that simply run out.
    """

    def __init__(self, locks: tuple[Lock, ...]) -> None:
        super().__init__()
        self._locks = locks
        for lock in locks:
            on_loss(lock, self._member_lost)
        # Made when first read (see LockSet.lost): a member lost before then has told nobody.
        # Looked at after listening, so a loss in between is heard one way or the other.
        if any(lock.state == "lost" for lock in locks):
            super().set()

    def _member_lost(self) -> None:
        super().set()

    def is_set(self) -> bool:
        """``True`` once any lock of the set is lost."""
        return any(lock.lost.is_set() for lock in self._locks)

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block until any lock is lost or ``timeout`` real seconds pass."""
        return wait_for_loss(self, super().wait, self._time_to_lapse, timeout)

    def _time_to_lapse(self) -> float:
        return min(lock.lost._time_to_lapse() for lock in self._locks)

    def set(self) -> None:
        """Not for callers."""
        raise LockStateError("lockset.lost is set by the library")

    def clear(self) -> None:
        """Not for callers."""
        raise LockStateError("lockset.lost cannot be cleared")


class LockSet(GuardedBlock):
    """Locks on several keys, held together; sorted by key.

    Behaves like one :class:`~lease_lock.Lock` in ``with`` (same outcome order), ``check()``,
    ``extend()`` and ``release()``.
    """

    _lost: Optional[SetLossSignal] = None

    def __init__(self, locks: tuple[Lock, ...]) -> None:
        self.locks = locks
        self._mutex = threading.Lock()

    @property
    def lost(self) -> SetLossSignal:
        """A ``threading.Event`` set as soon as any lock of the set is lost (see
        :class:`SetLossSignal`)."""
        # Made on first use: most sets are released without anyone looking at the signal, and
        # a loss before it was made is read from the members themselves.
        signal = self._lost
        if signal is None:
            with self._mutex:
                signal = self._lost
                if signal is None:
                    signal = self._lost = SetLossSignal(self.locks)
        return signal

    @property
    def keys(self) -> tuple[str, ...]:
        """The keys, prefix included, sorted."""
        return tuple(lock.key for lock in self.locks)

    @property
    def state(self) -> str:
        """``"lost"`` if any lock is lost, else the common state of the locks."""
        states = states_of(self.locks)
        if "lost" in states:
            return "lost"
        if "held" in states:
            return "held"
        return states[0]

    def check(self, verify: bool = False) -> None:
        """Raise ``LockLostError`` if any lock is lost, ``LockStateError`` if any is not held;
        local, unless ``verify=True`` also asks the store about every key (see ``Lock.check``)."""
        for lock in self.locks:
            lock.check()
        if verify:
            for lock in self.locks:
                lock.check(verify=True)

    def extend(self, ttl: Optional[float] = None) -> None:
        """Extend every lease (see ``Lock.extend``)."""
        for lock in self.locks:
            lock.extend(ttl)

    def release(self) -> bool:
        """Release every lock; ``True`` only if every release deleted our key.

        Every lock is tried even when one release raises; the first error is raised at the end.
        """
        deleted = True
        first_error: Optional[Exception] = None
        for lock in self.locks:
            try:
                deleted = lock.release() and deleted
            except Exception as error:  # noqa: BLE001 - re-raised below after the others ran
                deleted = False
                first_error = first_error or error
        if first_error is not None:
            raise first_error
        return deleted

    def _require_held(self, doing: str) -> None:
        state = self.state
        if state != "held":
            raise LockStateError(f"cannot {doing} a lock set that is {state}")

    def __enter__(self) -> LockSet:
        self._require_held("enter")
        return self

    def run(self, function: Callable[..., _Result], *args: Any, **kwargs: Any) -> _Result:
        """Run ``function`` under the set with the ``with`` outcome order; returns its result.

        Like ``with lockset:``, a set that is not held (released or lost) raises
        ``LockStateError`` and ``function`` is not called.
        """
        self._require_held("run under")
        return self._run(function, *args, **kwargs)

    def _finish(self, *, block_raised: bool, result: Any) -> None:
        lost: Optional[Lock] = None
        for lock in self.locks:
            give_up(lock)
            # As for one lock: only a loss counts, not a lock the block had released already.
            if lock.state == "lost" and lost is None:
                lost = lock
        if block_raised or lost is None:
            return
        raise LockLostError(
            lost.key, lost.lost_reason or "release", completed=True, result=result
        ) from lost_cause(lost)

    def __repr__(self) -> str:
        return f"<LockSet keys={list(self.keys)!r} state={self.state}>"
