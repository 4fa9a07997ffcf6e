"""The :class:`Lock`: the user's handle on one lease, and leaving a protected block.

A ``Lock`` moves through ``"unlocked" -> "held" -> ("released" | "lost")``. Its local lease
starts when the acquire or extend request *left* and ends 1% of the TTL early, so the holder
believes it holds the key for a little less than the backend does. Reading ``state``,
``lost_reason``, ``held_for``, ``expires_in`` or ``lost`` consults the clock: a lease that ran
out reads lost at once, whether or not the heartbeat thread has run.

A ``Lock`` is thread-safe and not tied to the thread that acquired it. It holds a share of a
lease (the private :mod:`lease_lock._lease` keeps the lease's life); a re-entrant acquire
(``reentrant=True``) gives a second ``Lock`` over the same lease, and the lease counts them.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar

from ._lease import Lease, LockHost, LossSignal, wait_for_loss
from .errors import LostReason
from .options import LockOptions
from .retry import Retry

if TYPE_CHECKING:
    from types import TracebackType

__all__ = ["GuardedBlock", "Lock", "LossSignal", "acquire_or_raise", "give_up", "run_guarded", "wait_for_loss"]

_Result = TypeVar("_Result")


class GuardedBlock:
    """Leaving a protected block, the same way for a ``with`` statement and a wrapped call.

    Subclasses implement ``_finish``, which applies the outcome order: the block's own
    exception first, then a loss, then a failed release.
    """

    __slots__ = ()

    def _finish(self, *, block_raised: bool, result: Any) -> None:
        raise NotImplementedError

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        self._finish(block_raised=exc is not None, result=None)

    def _run(self, function: Callable[..., _Result], *args: Any, **kwargs: Any) -> _Result:
        """Run ``function`` under the held lock(s) with the ``with`` outcome order."""
        try:
            result = function(*args, **kwargs)
        except BaseException:
            self._finish(block_raised=True, result=None)
            raise
        self._finish(block_raised=False, result=result)
        return result


def run_guarded(block: GuardedBlock, function: Callable[..., _Result], *args: Any, **kwargs: Any) -> _Result:
    """Run ``function`` under the already held ``block`` and leave it with the ``with`` outcome
    order (a loss after a completed call carries the call's result)."""
    return block._run(function, *args, **kwargs)


def acquire_or_raise(lock: Lock, options: LockOptions) -> None:
    """Acquire ``lock`` with ``options`` (the Locker's own acquire forms pass theirs), raising
    ``LockHeldError`` on contention."""
    lease = lock._lease.acquire(options, raise_on_contention=True)
    assert lease is not None
    lock._took(lease)


def give_up(block: GuardedBlock) -> None:
    """Leave ``block`` as after an error: release it (a half-acquired set, or a block that
    raised); a failed release becomes a ``release_failed`` event and the key runs out."""
    block._finish(block_raised=True, result=None)


class Lock(GuardedBlock):
    """A lease on one key. Created unacquired by ``Locker.lock()``; ``with`` acquires it.

    Its public names are the whole of it: ``key`` (prefix included), ``token``, ``fence``
    (``int`` or ``None``), the read-only state (``ttl``, ``state``, ``lost``, ``lost_reason``,
    ``lost_cause``, ``held_for``, ``expires_in``, ``holds``, ``thread``, ``retry``),
    ``acquire``, ``release``, ``extend``, ``check``, ``is_held``, ``on_loss`` and ``with``.
    """

    __slots__ = ("__weakref__", "_hold", "_lease")

    def __init__(
        self, host: LockHost, key: str, ttl: float, options: LockOptions, token: str, owner: object = None
    ) -> None:
        # The lease made for this handle is its hold too, also after a re-entrant acquire has
        # joined it to another lease (see Hold).
        self._lease = self._hold = Lease(host, key, ttl, options, token, owner)

    # -- reading -------------------------------------------------------------------------------

    @property
    def key(self) -> str:
        """The key, prefix included."""
        return self._lease.key

    @property
    def token(self) -> str:
        """The random token that holds the key for this lease."""
        return self._lease.token

    @property
    def fence(self) -> Optional[int]:
        """The fencing token of the grant (``None`` before it, or without fencing)."""
        return self._lease.fence

    @property
    def lost(self) -> LossSignal:
        """A ``threading.Event`` set when the lease is lost (see :class:`LossSignal`)."""
        return self._lease.lost

    @property
    def retry(self) -> Retry:
        """The retry policy an acquisition of this lock follows: the lock's own ``retry`` (and
        ``timeout``) merged field by field over the Locker's policy. ``acquire(blocking,
        timeout)`` arguments apply to their call only."""
        return self._lease.retry

    @property
    def lost_cause(self) -> Optional[BaseException]:
        """The error behind a loss (a failed extension's), or ``None``."""
        return self._lease.lost_cause

    def on_loss(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` (on the thread that finds the loss, outside the lock's mutex) when
        the lease is lost; a :class:`~lease_lock.LockSet` listens to its members this way."""
        self._lease.on_loss(listener)

    @property
    def ttl(self) -> float:
        """The latest TTL asked for, in seconds."""
        return self._lease.ttl

    @property
    def state(self) -> str:
        """``"unlocked"``, ``"held"``, ``"lost"`` or ``"released"``, as of now."""
        return self._lease.state

    @property
    def lost_reason(self) -> Optional[LostReason]:
        """Why the lease was lost, or ``None``."""
        return self._lease.lost_reason

    @property
    def held_for(self) -> float:
        """Seconds since the acquisition; stops counting at loss or release."""
        return self._lease.held_for

    @property
    def expires_in(self) -> float:
        """Seconds left of the local lease (0 when not held)."""
        return self._lease.expires_in

    @property
    def holds(self) -> int:
        """How many holds share this lease: 1 for a plain lock, more while re-entrant acquires
        (``reentrant=True``) of the same key by the same thread have joined it; 0 when not held."""
        return self._lease.holds

    @property
    def thread(self) -> Optional[threading.Thread]:
        """The thread that was granted this lease (``None`` before the grant). A re-entrant
        hold shares the lease, so it names the same thread."""
        return self._lease.thread

    def __repr__(self) -> str:
        return repr(self._lease)

    # -- acting --------------------------------------------------------------------------------

    def acquire(self, blocking: Optional[bool] = None, timeout: Optional[float] = None) -> bool:
        """Acquire like ``threading.Lock.acquire``: ``False`` on contention, never raises for it.

        Explicit arguments override the options given to ``lock()``. After a failed acquire the
        lock stays ``"unlocked"`` and may be tried again; a lock that has been held cannot be
        acquired again (``LockStateError``). A store that cannot be reached is no contention:
        ``BackendUnavailableError`` is raised when the last attempt could not reach it.
        """
        options = self._lease.options.with_attempt_budget(blocking, timeout)
        lease = self._lease.acquire(options, raise_on_contention=False)
        if lease is None:
            return False
        self._took(lease)
        return True

    def _took(self, lease: Lease) -> None:
        """Go on with ``lease``, granted to this lock or, by a re-entrant acquire, joined."""
        if lease is not self._lease:
            # Joined: a handle dropped without releasing must still let go of its hold.
            lease.joined(self, self._hold)
            self._lease = lease

    def release(self, *, request_id: Optional[str] = None) -> bool:
        """Give the key back. ``True`` when it deleted our key.

        ``False`` when the key was gone or another's, on a lost lock (which still gives the key
        back if our token holds it), and on every call after a successful one. A driver error
        propagates and leaves the lock as it was (the heartbeat keeps it alive).

        A lease shared by re-entrant holds is given back when the last of them releases; an
        earlier release gives up only its own hold and answers whether the lease is still held.

        ``request_id`` goes with the release request as ``acquire``'s does (the HTTP backend
        sends it as ``X-Volcano-Request-Id``; other backends accept and ignore it).
        """
        return self._lease.release(self._hold, request_id)

    def extend(
        self,
        ttl: Optional[float] = None,
        *,
        cancel: Optional[threading.Event] = None,
        request_id: Optional[str] = None,
    ) -> None:
        """Replace the lease with ``ttl`` seconds from now (default: the latest TTL).

        Clamped to the max-hold deadline. Raises ``LockStateError`` if unlocked or released,
        ``LockLostError`` if lost, not ours (``"extend"``) or answered late (``"late-extend"``;
        the late lease is given back). A driver error propagates; the lock stays held until its
        current lease runs out.

        ``cancel`` is the same kind of event ``acquire`` takes. Set before the renewal starts,
        no request is made; set while its request is on its way, the call still returns when
        the store answers (a request cannot be recalled) and the answer is not applied. Either
        way ``LockHeldError(reason="cancelled")`` is raised and the lock is left as it was:
        still held, with its TTL and heartbeat schedule (its local lease only ever becomes
        shorter, when the store granted less time than was left). ``request_id`` goes with the
        request as ``acquire``'s does.
        """
        self._lease.extend(ttl, cancel=cancel, request_id=request_id)

    def is_held(self) -> bool:
        """Ask the backend whether we still hold the key (one round trip when held).

        ``False`` marks the lock lost with reason ``"observed"``.
        """
        return self._lease.is_held()

    def check(self, verify: bool = False) -> None:
        """Raise ``LockLostError`` if lost, ``LockStateError`` if unlocked or released; local,
        unless ``verify=True`` also asks the store (one round trip).

        ``check()`` reads the local lease only: no round trip, so it sees a lease that ran out
        or a loss the heartbeat found, but not a key that was force-released or taken over
        since the last extension. ``check(verify=True)`` also asks the store whether our token
        still holds the key (one round trip, like :meth:`is_held`); when it does not, the lock
        is marked lost (reason ``"observed"``) and ``LockLostError`` is raised at once.
        """
        self._lease.check(verify)

    # -- context manager and outcome order -----------------------------------------------------

    def __enter__(self) -> Lock:
        self._took(self._lease.enter())
        return self

    def __exit__(self, exc_type: object, exc: Optional[BaseException], traceback: object) -> None:
        # GuardedBlock's exit, one call shorter: it is how most locks are left.
        self._lease.finish(self._hold, exc is not None)

    def _finish(self, *, block_raised: bool, result: Any) -> None:
        self._lease.finish(self._hold, block_raised, result)
