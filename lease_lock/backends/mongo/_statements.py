"""The filters and update pipelines of the MongoDB backend: plain documents, no driver import.

A lease is one document per key in the lease collection::

    {"_id": key, "token": str, "owner": str, "expires": date, "fence": int (fenced grants)}

A counting key (``limit`` > 1) is one document too, its places in an array::

    {"_id": key, "limit": int, "expires": date (the latest end of a place),
     "places": [{"token": str, "owner": str, "expires": date, "fence": int or null}, ...]}

Its top-level ``expires`` is the end of its last place, so the filters of exclusive leases
(held while ``expires`` is later than now, taken over once it is not) and the TTL index treat
it as held exactly while one of its places runs.

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
    "held_by",
    "held_pipeline",
    "live",
    "live_by",
    "milliseconds",
    "place_extend_update",
    "place_fence_update",
    "place_filter",
    "place_grant_filter",
    "place_grant_update",
    "place_release_update",
]

#: A lease still running: its expiry is later than the server's now.
LIVE: dict[str, Any] = {"$gt": ["$expires", "$$NOW"]}
#: A place of a counting key (``$$place`` in an array operator) still running.
_PLACE_LIVE: dict[str, Any] = {"$gt": ["$$place.expires", "$$NOW"]}
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


def _place_live(token: str) -> dict[str, Any]:
    """Expression: the document has a running place of ``token`` (false for an exclusive lease,
    which has no places)."""
    mine = {"$and": [{"$eq": ["$$place.token", token]}, _PLACE_LIVE]}
    return {"$gt": [{"$size": {"$filter": {"input": {"$ifNull": ["$places", []]}, "as": "place", "cond": mine}}}, 0]}


def place_filter(key: str, token: str) -> dict[str, Any]:
    """Filter: ``key``'s counting document while ``token`` holds a running place in it."""
    return {"_id": key, "$expr": _place_live(token)}


def held_by(key: str, token: str) -> dict[str, Any]:
    """Filter: ``key``'s document while ``token`` holds its running lease or a running place."""
    return {"_id": key, "$expr": {"$or": [{"$and": [{"$eq": ["$token", token]}, LIVE]}, _place_live(token)]}}


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
                # A counting key's lapsed places, when the grant takes its document over.
                "places": "$$REMOVE",
                "limit": "$$REMOVE",
            }
        }
    ]


def place_grant_filter(key: str, limit: int) -> dict[str, Any]:
    """Filter of a counting grant: ``key``'s counting document of the same ``limit`` (running
    or not), or any document of ``key`` that nobody holds. No match with a document present
    means a running exclusive lease or running places of another limit: as for an exclusive
    grant, the upsert's insert then meets the ``_id`` index (``DuplicateKeyError``), having
    written nothing."""
    return {"_id": key, "$or": [{"limit": limit}, _LAPSED]}


def _latest_end(places: Any) -> dict[str, Any]:
    # $reduce rather than $max over the array: every server takes the two-argument $max alike.
    return {"$reduce": {"input": places, "initialValue": None, "in": {"$max": ["$$value", "$$this.expires"]}}}


def _running_places() -> dict[str, Any]:
    return {"$filter": {"input": {"$ifNull": ["$places", []]}, "as": "place", "cond": _PLACE_LIVE}}


def place_grant_update(token: str, ttl: float, owner: str, limit: int) -> list[dict[str, Any]]:
    """Update pipeline of a counting grant (inputs: the grantee's token, the lease in seconds,
    the owner label, the key's limit), applied to a document :func:`place_grant_filter`
    matched (or to a new one). Result: places whose lease ended are dropped; a running place
    of ``token`` runs until now + ``ttl`` (fence kept, owner updated); else, while fewer than
    ``limit`` places run, a place of ``token`` is added with a null fence (numbered by the
    caller from the key's fence counter); else the places are left as they are (the key is
    full). ``expires`` is the end of the last place; an exclusive lease's fields, when the
    grant took a lapsed one over, are dropped."""
    end = _lease_end(ttl)
    renewed = {
        "$map": {
            "input": "$live",
            "as": "place",
            "in": {
                "$cond": [
                    {"$eq": ["$$place.token", token]},
                    {"token": token, "owner": {"$literal": owner}, "expires": end, "fence": "$$place.fence"},
                    "$$place",
                ]
            },
        }
    }
    place = {"token": token, "owner": {"$literal": owner}, "expires": end, "fence": None}
    added = {"$concatArrays": ["$live", [place]]}
    return [
        {"$set": {"live": _running_places()}},
        {
            "$set": {
                "places": {
                    "$cond": [
                        {"$in": [token, "$live.token"]},
                        renewed,
                        {"$cond": [{"$lt": [{"$size": "$live"}, limit]}, added, "$live"]},
                    ]
                }
            }
        },
        {"$set": {"expires": _latest_end("$places"), "limit": limit}},
        {"$unset": ["live", "token", "owner", "fence"]},
    ]


def place_fence_update(token: str, fence: int) -> list[dict[str, Any]]:
    """Update pipeline that writes ``fence`` into ``token``'s place (apply it with
    :func:`place_filter`, so that it lands only while the place runs)."""
    numbered = {"$mergeObjects": ["$$place", {"fence": fence}]}
    return [
        {
            "$set": {
                "places": {
                    "$map": {
                        "input": "$places",
                        "as": "place",
                        "in": {"$cond": [{"$eq": ["$$place.token", token]}, numbered, "$$place"]},
                    }
                }
            }
        }
    ]


def place_extend_update(token: str, ttl: float) -> list[dict[str, Any]]:
    """Update pipeline of a place's extension (apply it with :func:`place_filter`). Result:
    ``token``'s place ends ``ttl`` from the server's now, places that ended are dropped and
    ``expires`` is the end of the last place."""
    extended = {"$mergeObjects": ["$$place", {"expires": _lease_end(ttl)}]}
    return [
        {
            "$set": {
                "places": {
                    "$map": {
                        "input": _running_places(),
                        "as": "place",
                        "in": {"$cond": [{"$eq": ["$$place.token", token]}, extended, "$$place"]},
                    }
                }
            }
        },
        {"$set": {"expires": _latest_end("$places")}},
    ]


def place_release_update(token: str) -> list[dict[str, Any]]:
    """Update pipeline of a place's release (apply it with :func:`place_filter`). Result:
    ``token``'s place and the places that ended are dropped; ``expires`` is the end of the
    last place left, or the server's now when none is (the document is then free, and the TTL
    index sweeps it)."""
    others = {"$and": [{"$ne": ["$$place.token", token]}, _PLACE_LIVE]}
    return [
        {"$set": {"places": {"$filter": {"input": "$places", "as": "place", "cond": others}}}},
        {"$set": {"expires": {"$ifNull": [_latest_end("$places"), "$$NOW"]}}},
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


_HOLDER = {
    "owner": "$$place.owner",
    "fence": "$$place.fence",
    "expires": "$$place.expires",
    "left": {"$subtract": ["$$place.expires", "$$NOW"]},
}


def held_pipeline(key: Optional[str] = None, prefix: Optional[str] = None) -> list[dict[str, Any]]:
    """Aggregation of the live leases of ``key``, or of every key starting with ``prefix``
    (sorted by key). Result: per lease ``_id``, ``owner``, ``fence``, ``expires`` and
    ``left``, the milliseconds it has left on the server's clock; a counting key has
    ``limit`` and ``places`` instead, one ``{owner, fence, expires, left}`` per running place."""
    match: dict[str, Any] = {"$expr": LIVE}
    if key is not None:
        match["_id"] = key
    elif prefix:
        # Anchored and escaped: a prefix match the server can serve from the _id index.
        match["_id"] = {"$regex": "^" + re.escape(prefix)}
    stages: list[dict[str, Any]] = [
        {"$match": match},
        {
            "$project": {
                "owner": 1,
                "fence": 1,
                "expires": 1,
                "left": {"$subtract": ["$expires", "$$NOW"]},
                "limit": 1,
                "places": {
                    "$cond": [
                        {"$isArray": "$places"},
                        {"$map": {"input": _running_places(), "as": "place", "in": _HOLDER}},
                        "$$REMOVE",
                    ]
                },
            }
        },
    ]
    if key is None:
        stages.append({"$sort": {"_id": 1}})
    return stages
