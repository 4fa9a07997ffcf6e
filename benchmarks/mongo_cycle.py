"""Acquire+release cycles on MongoDB: the library against the same statements typed by hand.

    python -m benchmarks.mongo_cycle [--url mongodb://127.0.0.1:27017/bench] [--seconds 4]

Every contestant alternates with its floor one cycle at a time and is judged on the median cycle
time (see ``measure.py``). The floor is the backend's own pair typed by hand with pymongo on the
same client and collection, with the same write concern (``w: "majority"``): a
``find_one_and_update`` with the grant's update pipeline and upsert (a live lease is matched by
token, a lapsed one through ``$$NOW``), then the token-checked ``delete_one``. Contestants:

- ``backend acquire/release``: ``MongoBackend.acquire`` and ``release``.
- ``Locker``: ``locker.acquire(key).release()``, the whole public path.
- ``backend fenced`` and ``Locker fenced``: a fenced grant adds two writes (the key's counter,
  then the fence into the lease), so these rows show what fencing costs against the same
  two-statement floor.

The server is what the URL names: a ``mongod`` replica set for figures that mean something for
production, or the tests' mongoeco wire server (``tests/support/mongo_server.py``), whose
figures compare the library with hand-typed pymongo on one server and nothing more.
"""

from __future__ import annotations

import argparse
import uuid
from collections.abc import Callable
from typing import Any, Optional

import pymongo
from lease_lock.backends.mongo import MongoBackend
from lease_lock.locker import Locker

from benchmarks.measure import add_json_argument, grant_cycle, locker_cycle, paired, write_json

__all__ = ["main"]

TTL = 30.0
TOKEN = "b" * 32


def _by_hand(collection: Any) -> Callable[[], None]:
    """The grant and the release typed by hand on ``collection``, reading what each answers."""
    key = f"bench:raw:{uuid.uuid4().hex[:8]}"
    live = {"$gt": ["$expires", "$$NOW"]}
    grant_filter = {"_id": key, "$or": [{"token": TOKEN}, {"$expr": {"$lte": ["$expires", "$$NOW"]}}]}
    grant = [
        {
            "$set": {
                "token": TOKEN,
                "owner": "bench",
                "expires": {"$add": ["$$NOW", int(TTL * 1000)]},
                "fence": {"$cond": [{"$and": [{"$eq": ["$token", TOKEN]}, live]}, "$fence", "$$REMOVE"]},
            }
        }
    ]
    release = {"_id": key, "token": TOKEN, "$expr": live}

    def cycle() -> None:
        collection.find_one_and_update(
            grant_filter, grant, projection={"fence": True}, upsert=True,
            return_document=pymongo.ReturnDocument.AFTER,
        )
        assert collection.delete_one(release).deleted_count == 1

    return cycle


def main(argv: Optional[list[str]] = None) -> None:
    """Run the cycles and print the table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", 1)[0])
    parser.add_argument("--url", default="mongodb://127.0.0.1:27017/bench")
    parser.add_argument("--seconds", type=float, default=4.0, help="per contestant")
    add_json_argument(parser)
    args = parser.parse_args(argv)
    collection = f"bench_{uuid.uuid4().hex[:6]}"
    backend = MongoBackend.from_url(args.url, collection=collection)
    fenced_backend = MongoBackend.from_url(args.url, collection=collection)
    version = backend.client.admin.command("hello").get("version", "?")
    print(f"server {version} ({args.url.split('@')[-1]}); pymongo {pymongo.version}; write concern w=majority")
    # The floor shares the backend's client, collection and write concern: only the client-side
    # work differs.
    floor = _by_hand(
        backend.client[backend.database].get_collection(
            collection, write_concern=backend.write_concern, read_preference=pymongo.ReadPreference.PRIMARY
        )
    )
    contestants: list[tuple[str, Callable[[], None]]] = [
        ("backend acquire/release", grant_cycle(backend.acquire, backend.release, TOKEN, TTL)),
        ("Locker", locker_cycle(Locker(backend, ttl=TTL))),
        ("backend fenced", grant_cycle(fenced_backend.acquire_fenced, fenced_backend.release, TOKEN, TTL)),
        ("Locker fenced", locker_cycle(Locker(fenced_backend, ttl=TTL, fencing=True))),
    ]
    output: dict[str, Any] = {"cycles": []}
    print("\nUncontended acquire+release cycles, each contestant alternating one cycle at a time with")
    print("the same find_one_and_update + delete_one typed by hand with pymongo on the same collection.")
    print(f"{args.seconds:g} s each; rates at the median cycle time of each side")
    print(f"{'contestant':<28} {'cycles/s':>9} {'floor/s':>8} {'vs floor':>9}")
    for name, cycle in contestants:
        pairing = paired(floor, cycle, args.seconds)
        print(f"{name:<28} {pairing.rate:>9,.0f} {pairing.floor_rate:>8,.0f} {pairing.ratio:>8.2f}x")
        output["cycles"].append({"name": name, "rate": pairing.rate, "floor_rate": pairing.floor_rate,
                                 "ratio": pairing.ratio})
    write_json(args.json, "mongo_cycle", argv, output)
    database = backend.client[backend.database]
    for suffix in ("", "-fences", "-counters"):
        database.drop_collection(collection + suffix)
    backend.close()
    fenced_backend.close()


if __name__ == "__main__":
    main()
