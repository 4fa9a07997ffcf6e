"""Counting keys on etcd (``limit`` > 1): one etcd key per place, on the place's own lease.

A place of the counting key ``key`` held by ``token`` is the name
``namespace + key + NUL + "place" + NUL + token``; its value is the token, a NUL byte, the
owner label, a NUL byte and the limit it was granted with, as decimal digits. It rides on an
etcd lease of its own, so etcd ends each place by itself when its lease runs out, and a release
deletes it. The lock key ``namespace + key`` does not exist while the key is counted. A place's
name contains a NUL, so it is no lock key, and it lies in the range of every key prefix its
key starts with: a listing reads lock keys and places in one range and lists a counting key
once, from its places; and a namespace nested in another (``locks/eu/`` in ``locks/``) has the
places of its key ``k`` where the outer one has those of ``eu/k``, as it has its lock keys.

etcd's transactions cannot count keys, so a grant is decided on a read and written by one
transaction guarded by what the decision rests on: "no lock key (no exclusive holder) and no
place of the key created after the read" (a compare over the range of the key's places: every
place's ``create_revision`` at most the read's revision). A place that went since the read only
frees room, so the decision stands; a place granted since fails the guard, and the failed
transaction's answer is the new read to decide on. The first attempt decides on "free" without
a read: guarded by "no lock key and no place at all", it grants at once, and otherwise its answer
is the read. Exclusive grants put the same "no place at all" compare beside their own, so the
two kinds never hold a key at once.

A place's fence is its ``create_revision``: the revision of the grant's write, larger than every
revision before it, so fences rise across places and exclusive grants of the key alike (an
exclusive grant's fence is a ``create_revision`` too, or, for a key handed over, at most the
revision of the handing write). A renewal puts the place on a new lease and keeps its
``create_revision``.
"""

from __future__ import annotations

from typing import Any

from ._client import b64, prefix_end, unb64
from ._watch import PLACE_MARK

__all__ = [
    "limit_of", "no_places", "place_name", "place_prefix", "place_value", "places_created_by", "places_range",
]


def place_prefix(prefix: bytes, key: bytes) -> bytes:
    """The first bytes of every place of lock key ``key`` under ``prefix``."""
    return prefix + key + PLACE_MARK


def place_name(prefix: bytes, key: bytes, token: str) -> bytes:
    """The name of ``token``'s place of ``key``."""
    return place_prefix(prefix, key) + token.encode()


def place_value(token: str, owner: str, limit: int) -> bytes:
    """A place's value: token, owner and the limit it was granted with."""
    return b"%s\x00%s\x00%d" % (token.encode(), owner.encode(), limit)


def limit_of(kv: dict[str, Any]) -> int:
    """The limit a place (as etcd answers it) was granted with."""
    return int(unb64(kv.get("value")).rsplit(b"\x00", 1)[-1] or 0)


def places_range(prefix: bytes, key: bytes, **options: Any) -> dict[str, Any]:
    """The request that reads every place of ``key`` (``options``: more fields of etcd's range
    request)."""
    start = place_prefix(prefix, key)
    return {"request_range": {"key": b64(start), "range_end": b64(prefix_end(start)), **options}}


def no_places(prefix: bytes, key: bytes) -> dict[str, Any]:
    """The compare of "``key`` has no place": every key in the range of its places was created
    before revision 1, which only an empty range satisfies."""
    return places_created_by(prefix, key, 0)


def places_created_by(prefix: bytes, key: bytes, revision: int) -> dict[str, Any]:
    """The compare of "no place of ``key`` was created after ``revision``" (an empty range
    satisfies it: etcd compares an absent key as one of revision 0)."""
    start = place_prefix(prefix, key)
    return {
        "key": b64(start), "range_end": b64(prefix_end(start)),
        "target": "CREATE", "result": "LESS", "create_revision": str(revision + 1),
    }
