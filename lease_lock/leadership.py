"""Leader election on one key: :meth:`Locker.elect <lease_lock.Locker.elect>` and :class:`Leadership`.

Every candidate campaigns for the same key with a blocking acquire that never gives up; the
holder is the leader. The heartbeat keeps its lease alive; when the lease is lost (the store
said it is not ours, an extension came too late, the process was paused past its lease) the
candidate reports the loss and campaigns again. A candidate that resigns or closes gives the
key back, so a waiting candidate (woken by the release notification on backends that have
them) takes over at once instead of after the lease runs out.

Leadership is only as exclusive as a lease is: a leader paused past its lease may still act for
a moment after it resumes. Protect what the leader writes with the fence (``Locker(fencing=True)``)
and have the resource refuse writes whose fence is lower than the last it saw.
"""

from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING, Callable, Optional, Protocol

from .errors import LockStateError, ValidationError
from .events import logger
from .retry import Retry

if TYPE_CHECKING:
    from types import TracebackType

    from .lock import Lock

__all__ = ["Campaigner", "Leadership"]

#: A campaign waits for ever: only resign() or close() ends it.
_FOR_EVER = Retry(retries=math.inf, timeout=math.inf)
#: How often a leader looks at its lease while it waits for resign() or close(): a loss the
#: heartbeat found is reported within this; a lease that runs out, and a stop, at once.
_LOSS_SLICE = 0.05
#: After a failed campaign attempt (store unreachable, driver error): the first pause, and the
#: longest, in seconds; each failure doubles the pause.
_FIRST_BACKOFF = 0.1
_MAX_BACKOFF = 2.0


class Campaigner(Protocol):
    """What a candidate needs from its Locker: new locks on the key, and whether it closed."""

    @property
    def closed(self) -> bool:
        """``True`` once the Locker is closed: the campaign ends."""

    def lock(
        self,
        key: str,
        ttl: Optional[float] = None,
        *,
        retry: Optional[Retry] = None,
        cancel: Optional[threading.Event] = None,
        max_hold: Optional[float] = None,
        limit: Optional[int] = None,
    ) -> Lock:
        """An unacquired lock on ``key`` with the options a campaign uses."""


class Leadership:
    """One candidate in the election for a key; made by :meth:`Locker.elect`.

    The candidate campaigns on its own thread. ``on_elected(lock)`` is called with the held
    :class:`~lease_lock.Lock` (``lock.fence`` is the leadership's fence with a fencing locker);
    ``on_revoked(reason)`` when that leadership ends: the lease's lost reason (``"expired"``,
    ``"extend"``, ``"late-extend"``, ...), ``"resigned"`` or ``"closed"``. Both run on the
    campaign thread, one at a time and in order (never two at once, every ``on_elected``
    followed by exactly one ``on_revoked``), so they should return quickly: start the leader's
    work elsewhere and stop it in ``on_revoked``. A callback that raises is logged and the
    campaign goes on. ``is_leader`` turns true when the key is granted, just before
    ``on_elected`` runs. A term has no max-hold deadline: it lasts until the lease is lost or
    the candidate resigns or closes.
    """

    def __init__(
        self,
        locker: Campaigner,
        key: str,
        *,
        on_elected: Optional[Callable[[Lock], object]] = None,
        on_revoked: Optional[Callable[[str], object]] = None,
        ttl: Optional[float] = None,
    ) -> None:
        for name, callback in (("on_elected", on_elected), ("on_revoked", on_revoked)):
            if callback is not None and not callable(callback):
                raise ValidationError(f"{name} must be callable or None, not {type(callback).__name__}")
        self._locker = locker
        self._on_elected = on_elected
        self._on_revoked = on_revoked
        self._ttl = ttl
        self._stop = threading.Event()
        self._stop_reason = "closed"
        self._changed = threading.Condition()
        self._lock: Optional[Lock] = None
        # Built here so that a bad key or ttl raises in the caller, before any thread starts.
        first = self._new_lock(key)
        self.key: str = first.key
        self._thread = threading.Thread(
            target=self._campaign, args=(key, first), name=f"lease-lock-elect {self.key}", daemon=True
        )
        self._thread.start()

    # -- reading -------------------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        """``True`` while this candidate holds the key, read against the clock now (a lease
        that ran out reads ``False`` at once, like ``lock.lost``)."""
        lock = self._lock
        return lock is not None and lock.state == "held"

    @property
    def fence(self) -> Optional[int]:
        """The fence of the current leadership (with a fencing locker), else ``None``."""
        lock = self._lock
        if lock is None or lock.state != "held":
            return None
        return lock.fence

    @property
    def lock(self) -> Optional[Lock]:
        """The held lock while leader, else ``None``."""
        lock = self._lock
        return lock if lock is not None and lock.state == "held" else None

    @property
    def closed(self) -> bool:
        """``True`` once the candidacy ended: :meth:`resign`, :meth:`close`, or the locker closed."""
        return self._stop.is_set()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block until this candidate is leader (``True``), ``timeout`` seconds pass or the
        candidacy ends (``False``)."""
        with self._changed:
            self._changed.wait_for(lambda: self.is_leader or self._stop.is_set(), timeout)
        return self.is_leader and not self._stop.is_set()

    # -- ending --------------------------------------------------------------------------------

    def resign(self) -> None:
        """Stop campaigning and, when leader, give the key to the next candidate at once
        (``on_revoked("resigned")`` runs before the key is given back)."""
        self._end("resigned")

    def close(self) -> None:
        """Stop campaigning and give the key back if held (``on_revoked("closed")``).
        Idempotent; waits for the campaign thread unless called from a callback."""
        self._end("closed")

    def _end(self, reason: str) -> None:
        with self._changed:
            if not self._stop.is_set():
                self._stop_reason = reason
                self._stop.set()
            self._changed.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def __enter__(self) -> Leadership:
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "leader" if self.is_leader else "candidate"
        return f"<Leadership key={self.key!r} {state}>"

    # -- the campaign thread -------------------------------------------------------------------

    def _new_lock(self, key: str) -> Lock:
        # No max-hold deadline: a term lasts until the lease is lost, or resign() or close().
        # One leader at a time, whatever limit the Locker gives its other locks.
        return self._locker.lock(key, self._ttl, retry=_FOR_EVER, cancel=self._stop, max_hold=math.inf, limit=1)

    def _set_lock(self, lock: Optional[Lock]) -> None:
        with self._changed:
            self._lock = lock
            self._changed.notify_all()

    def _campaign(self, key: str, lock: Lock) -> None:
        backoff = _FIRST_BACKOFF
        while not self._stop.is_set():
            try:
                # False only when resign() or close() cancelled the wait, or a late grant.
                granted = lock.acquire()
            except LockStateError:
                break  # the locker was closed
            except Exception:  # noqa: BLE001 - the store is down or the driver failed: keep campaigning
                logger.warning("leader election for %r: acquiring failed; retrying", self.key, exc_info=True)
                self._stop.wait(backoff)
                backoff = min(_MAX_BACKOFF, backoff * 2)
                continue
            if not granted:
                continue
            backoff = _FIRST_BACKOFF
            self._lead(lock)
            if self._stop.is_set() or self._locker.closed:
                break
            try:
                # A Lock is held once; the next term needs a new one.
                lock = self._new_lock(key)
            except LockStateError:
                break  # the locker was closed meanwhile
        # The candidacy is over (also when the locker closed): wake every wait().
        with self._changed:
            self._lock = None
            self._stop.set()
            self._changed.notify_all()

    def _lead(self, lock: Lock) -> None:
        self._set_lock(lock)
        self._call(self._on_elected, lock)
        # Waiting on the stop request keeps resign() a prompt hand-over; the wait is cut to the
        # lease's end, so a lapse is seen on time too.
        while not lock.lost.is_set():
            if self._stop.wait(min(_LOSS_SLICE, max(lock.expires_in, 0.001))):
                break
        if lock.lost.is_set():
            reason = lock.lost_reason or "expired"
            self._set_lock(None)
            self._call(self._on_revoked, reason)
            # Give back whatever is left (a lease the store still has under our token would
            # otherwise block the others until it runs out); best effort.
            self._release(lock)
            return
        self._set_lock(None)
        # The application stops its leader work before the next leader can start its own.
        self._call(self._on_revoked, self._stop_reason)
        self._release(lock)

    def _release(self, lock: Lock) -> None:
        try:
            lock.release()
        except Exception:  # noqa: BLE001 - the lease runs out on its own
            logger.warning("leader election for %r: giving the key back failed", self.key, exc_info=True)

    def _call(self, callback: Optional[Callable[..., object]], argument: object) -> None:
        if callback is None:
            return
        try:
            callback(argument)
        except Exception:  # noqa: BLE001 - a callback error must not end the campaign
            logger.exception("leader election for %r: %s raised", self.key, getattr(callback, "__name__", callback))
