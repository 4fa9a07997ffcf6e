"""The filters and update pipelines of the MongoDB backend: plain documents, no driver import.

A lease is one document per key in the lease collection::

    {"_id": key, "token": str, "owner": str, "expires": date, "fence": int (fenced grants)}

Every comparison with "now" uses ``$$NOW``, the server's clock when the statement runs, so no
statement reads the client's clock. Each builder below is headed by its inputs and by what the
server answers.
"""

from __future__ import annotations

import math
import re
from typing import Any, Optional

__all__ = [
    "counter_update",
    "extend_update",
    "fence_update",
    "grant_filter",
    "grant_update",
    "held_pipeline",
    "live",
    "live_by",
    "milliseconds",
]

#: A lease still running: its expiry is later than the server's now.
LIVE: dict[str, Any] = {"$gt": ["$expires", "$$NOW"]}
#: A lease that ran out (or a document without an expiry, which nobody holds: a missing field
#: sorts before every date).
_LAPSED: dict[str, Any] = {"$expr": {"$lte": ["$expires", "$$NOW"]}}


def milliseconds(seconds: float) -> int:
    """A lease's length as whole milliseconds (BSON dates count those), rounded up so that the
    server's lease is never shorter than the one asked for."""
    return max(1, math.ceil(seconds * 1000))


def live(key: str) -> dict[str, Any]:
    """Filter: ``key``'s lease document while its lease runs, whoever holds it."""
    return {"_id": key, "$expr": LIVE}


def live_by(key: str, token: str) -> dict[str, Any]:
    """Filter: ``key``'s lease document while ``token`` holds a running lease on it."""
    return {"_id": key, "token": token, "$expr": LIVE}


def grant_filter(key: str, *tokens: str) -> dict[str, Any]:
    """Filter of a grant: ``key``'s document when one of ``tokens`` is in it (live or not) or
    its lease ran out. No match with a document present means another token holds a live
    lease: the upsert then tries to insert a second document with the same ``_id`` and the
    server answers ``DuplicateKeyError``, which is the grant's "held"."""
    return {"_id": key, "$or": [*({"token": token} for token in tokens), _LAPSED]}


def _lease_end(ttl: float) -> dict[str, Any]:
    return {"$add": ["$$NOW", milliseconds(ttl)]}


def extend_update(ttl: float) -> list[dict[str, Any]]:
    """Update pipeline of an extension (input: the lease in seconds). Result: the lease ends
    ``ttl`` from the server's now, replacing its old end (never added to it)."""
    return [{"$set": {"expires": _lease_end(ttl)}}]


def grant_update(token: str, ttl: float, owner: str) -> list[dict[str, Any]]:
    """Update pipeline of a grant (inputs: the grantee's token, the lease in seconds, the
    owner label). Result: the document holds ``token`` until now + ``ttl`` on the server's
    clock. A running lease of ``token`` itself keeps its fence (a renewal); any other grant
    drops the old fence, so that the fenced grant numbers it afresh. Every field is computed
    from the document as it was before the update."""
    renewal = {"$and": [{"$eq": ["$token", token]}, LIVE]}
    return [
        {
            "$set": {
                "token": token,
                # A label such as "$token" is text, not a field path.
                "owner": {"$literal": owner},
                "expires": _lease_end(ttl),
                "fence": {"$cond": [renewal, "$fence", "$$REMOVE"]},
            }
        }
    ]


def fence_update() -> list[dict[str, Any]]:
    """Update pipeline of a key's fence counter (a document ``{"_id": key, "fence": int}`` in
    the fences collection). Result: ``fence`` is the larger of its last value plus one and the
    server's clock in milliseconds times 1000 (below 2**53 until the year 2255). The clock term
    keeps fences rising when the counter is lost (a dropped collection, a restore from an
    older backup), unless the server's clock stepped back past the last fence; a round trip
    takes far longer than the thousandth of a millisecond that each counted grant moves the
    counter ahead of the clock, so the counter never runs away from it."""
    clock = {"$multiply": [{"$toLong": "$$NOW"}, 1000]}
    return [{"$set": {"fence": {"$max": [{"$add": [{"$ifNull": ["$fence", 0]}, 1]}, clock]}}}]


def counter_update(window_ms: float, amount: int) -> list[dict[str, Any]]:
    """Update pipeline of a fixed-window counter ``{"_id": name, "window": n, "count": c,
    "at": date}`` (inputs: the window in milliseconds, the amount to add). Result: ``window`` is
    the number of the window the server's now falls in, ``count`` the amount added to the
    count of that window (a new window starts from the amount alone) and ``at`` the server's now,
    from which the caller works out the time left in the window."""
    current = {"$floor": {"$divide": [{"$toLong": "$$NOW"}, window_ms]}}
    return [
        {"$set": {"current": current, "at": "$$NOW"}},
        {
            "$set": {
                "count": {"$cond": [{"$eq": ["$window", "$current"]}, {"$add": ["$count", amount]}, amount]},
                "window": "$current",
            }
        },
        {"$unset": "current"},
    ]


def held_pipeline(key: Optional[str] = None, prefix: Optional[str] = None) -> list[dict[str, Any]]:
    """Aggregation of the live leases of ``key``, or of every key starting with ``prefix``
    (sorted by key). Result: per lease ``_id``, ``owner``, ``fence``, ``expires`` and
    ``left``, the milliseconds it has left on the server's clock."""
    match: dict[str, Any] = {"$expr": LIVE}
    if key is not None:
        match["_id"] = key
    elif prefix:
        # Anchored and escaped: a prefix match the server can serve from the _id index.
        match["_id"] = {"$regex": "^" + re.escape(prefix)}
    stages: list[dict[str, Any]] = [
        {"$match": match},
        {"$project": {"owner": 1, "fence": 1, "expires": 1, "left": {"$subtract": ["$expires", "$$NOW"]}}},
    ]
    if key is None:
        stages.append({"$sort": {"_id": 1}})
    return stages
