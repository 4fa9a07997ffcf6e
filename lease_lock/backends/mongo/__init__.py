"""The MongoDB backend (extra ``mongodb``, driver pymongo).

Usage: ``lease_lock.connect("mongodb://host:27017/app")`` or
``Locker(MongoBackend(pymongo.MongoClient(...), database="app"))``. ``mongo_indexes()`` returns
the indexes the backend relies on, for a migration when the application may not create them.
See ``docs/backends/mongodb.md``.
"""

from __future__ import annotations

from ._backend import MAJORITY, MongoBackend, mongo_indexes

__all__ = ["MAJORITY", "MongoBackend", "mongo_indexes"]
