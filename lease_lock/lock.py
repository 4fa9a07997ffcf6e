"""The :class:`Lock`: the user's handle on one lease, and leaving a protected block.

A ``Lock`` moves through ``"unlocked" -> "held" -> ("released" | "lost")``. Its local lease
starts when the acquire or extend request *left* and ends 1% of the TTL early, so the holder
believes it holds the key for a little less than the backend does. Reading ``state``,
``lost_reason``, ``held_for``, ``expires_in`` or ``lost`` consults the clock: a lease that ran
out reads lost at once, whether or not the heartbeat thread has run.

A ``Lock`` is thread-safe and not tied to the thread that acquired it. It holds a share of a
lease; a re-entrant acquire (``reentrant=True``) gives a second ``Lock`` over the same lease, and
the lease counts them. Both live in the private :mod:`lease_lock._lease`, with the lease's whole
life; this module is the public home of the names a user meets.
"""

from __future__ import annotations

from ._lease import Lock, LossSignal

__all__ = ["Lock", "LossSignal"]
