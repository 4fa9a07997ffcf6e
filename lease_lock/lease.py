"""A lease's local timing: where its local end lies and whether an answer came back too late.

Every grant and every extension is judged here, the same way: the local lease starts when the
request *left* (``sent``) and ends :data:`LEASE_MARGIN` of the TTL early, so the holder believes
it holds the key for a little less than the store does. An answer that arrives at or after that
end is too late to rely on: the store's lease may already have run out.
"""

from __future__ import annotations

from typing import Optional

from .backends.base import Backend
from .events import logger

__all__ = ["LEASE_MARGIN", "give_back", "local_end"]

#: The local lease ends this fraction of the TTL early, to absorb clock rate differences.
LEASE_MARGIN = 0.01


def local_end(sent: float, requested: float, received: float) -> Optional[float]:
    """The local end of a lease of ``requested`` seconds asked for by a request that left at
    ``sent``, or ``None`` when its answer (at ``received``) came back too late to rely on."""
    end = sent + requested * (1 - LEASE_MARGIN)
    return end if received < end else None


def give_back(backend: Backend, key: str, token: str) -> None:
    """Return a lease nobody can rely on (a late or unwanted grant); best effort: a lease that
    cannot be given back runs out on its own."""
    try:
        backend.release(key, token)
    except Exception:  # noqa: BLE001 - the lease runs out on its own; nothing to report to
        logger.debug("giving back the lease of %r failed", key, exc_info=True)
