"""The MongoDB backend: one document per key, each grant one pipeline upsert judged on ``$$NOW``."""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Iterator, Mapping
from datetime import timezone
from types import MappingProxyType
from typing import Any, Callable, ClassVar, ContextManager, Optional, Union

import pymongo
import pymongo.errors
from bson.codec_options import CodecOptions
from pymongo import IndexModel, ReturnDocument, WriteConcern

from ...errors import ValidationError
from ...validation import check_bool, check_duration
from ..base import Capabilities, Holder, LockState, limit_mismatch
from ..service import ServiceStore, check_amount
from ._client import OPTIONS, plan_client, unavailable_on_outage
from ._statements import (
    counter_update,
    extend_update,
    fence_update,
    grant_filter,
    grant_update,
    held_by,
    held_pipeline,
    live,
    live_by,
    place_extend_update,
    place_fence_update,
    place_filter,
    place_grant_filter,
    place_grant_update,
    place_release_update,
)

__all__ = ["MAJORITY", "MongoBackend", "mongo_indexes"]

#: The default write concern of every lock write: acknowledged by a majority of the replica
#: set, so that an election cannot roll back a grant, an extension or a release.
MAJORITY: Mapping[str, Any] = MappingProxyType({"w": "majority"})

#: Seconds a call may take beyond a caller's budget (see call_budget): a live server's answer
#: with a majority write concern, and the wait of this host's reading thread for a CPU on a
#: busy machine (as the other backends allow).
_ANSWER_MARGIN = 2.0
#: Expiry dates come back as UTC-aware datetimes, whatever the client's own codec options say.
_CODEC: CodecOptions[Any] = CodecOptions(tz_aware=True, tzinfo=timezone.utc)
_TTL_KEY = {"expires": 1}
_MAX_COLLECTION = 200


def _check_collection(collection: object) -> str:
    if not isinstance(collection, str):
        raise ValidationError(f"collection must be a str, not {type(collection).__name__}")
    if not collection or len(collection) > _MAX_COLLECTION or "$" in collection or "\x00" in collection:
        raise ValidationError(
            f"collection must be 1 to {_MAX_COLLECTION} characters without '$' or NUL, got {collection!r}"
        )
    if collection.startswith("system."):
        raise ValidationError(f"collection must not start with 'system.', got {collection!r}")
    return collection


def _fence(place: Mapping[str, Any]) -> Optional[int]:
    fence = place.get("fence")
    return None if fence is None else int(fence)


def mongo_indexes(*, collection: str = "lease_lock") -> dict[str, list[IndexModel]]:
    """The indexes the backend relies on, by the name of the collection that needs them, each
    list in the shape ``Collection.create_indexes()`` takes: for a migration when the
    application may not create indexes (``create_indexes=False``)::

        for name, indexes in mongo_indexes(collection="lease_lock").items():
            database[name].create_indexes(indexes)

    That is the TTL index on the lease collection's ``expires`` field, which sweeps lapsed
    leases. The ``_id`` index, always unique, is what makes a grant exclusive; the fences and
    counters collections need nothing beyond it.
    """
    name = _check_collection(collection)
    return {name: [IndexModel([("expires", pymongo.ASCENDING)], expireAfterSeconds=0)]}


def _write_concern(value: object) -> Optional[WriteConcern]:
    if value is None or isinstance(value, WriteConcern):
        concern = value
    elif isinstance(value, Mapping):
        try:
            concern = WriteConcern(**value)
        except (TypeError, ValueError, pymongo.errors.ConfigurationError) as error:
            raise ValidationError(f"write_concern {dict(value)!r}: {error}") from None
    else:
        raise ValidationError(
            f"write_concern must be a mapping such as {{'w': 'majority'}}, a pymongo WriteConcern or None,"
            f" not {type(value).__name__}"
        )
    if concern is not None and not concern.acknowledged:
        # The backend reads every write's answer (granted or not, deleted or not).
        raise ValidationError("write_concern must be acknowledged (w=0 answers nothing)")
    return concern


class MongoBackend(ServiceStore):
    """Leases in a MongoDB collection, shared by every process that reaches the deployment.

    ``client`` is a ``pymongo.MongoClient``; ``database`` names the database (default: the
    client's default database, the one its URL names). The collection ``collection`` (default
    ``lease_lock``) holds one document per key: ``_id`` (the key, prefix included), ``token``,
    ``owner``, ``expires`` (a date on the server's clock) and ``fence``. A grant is one
    ``find_one_and_update`` with an update pipeline and upsert that matches the key's document
    when the token is in it or its lease ran out (``$$NOW``); when another token holds a live
    lease the upsert's insert meets the ``_id`` index and the server answers
    ``DuplicateKeyError``, which is "held". Extensions and releases match the token and a
    running lease. No operation reads the client's clock.

    A counting key (``limit`` > 1) is one document too: ``limit``, ``places`` (one
    ``{token, owner, expires, fence}`` per holder) and ``expires``, the end of its last place,
    so that exclusive grants find it held while a place runs. A place is granted, renewed,
    extended or released by one pipeline update of that document that drops the places that
    ended first; a new place is numbered by the key's fence counter as a fenced grant is.
    Releases wake nobody (``join_line`` answers ``None``): waiters pause between attempts.

    Fences come from a counter document per key in ``<collection>-fences``, moved by a second
    write after the grant and then written into the lease (a third, guarded by the token and
    a running lease): a fence counts only when the counter's answer came back before the lease
    could have ended (on this process's monotonic clock) and the lease was still running on the
    server after the counter moved, so the next holder's counter moves later. Counters outlive
    lease documents, and each fence is at least the server's clock in microseconds, so fences
    keep rising when a counter is lost. Shared counters of the lock service live in
    ``<collection>-counters``.

    ``create_indexes=True`` creates the TTL index on ``expires`` (see :func:`mongo_indexes`) on
    first use; ``False`` checks once that it exists and raises ``ValidationError`` naming it
    when not (a failed check is repeated on the next call). ``write_concern`` is every write's
    (default ``{"w": "majority"}``; a mapping of ``WriteConcern`` arguments, a
    ``WriteConcern``, or ``None`` for the client's own); reads go to the primary.

    A server that cannot be reached or does not answer in time raises
    :class:`~lease_lock.errors.BackendUnavailableError` from pymongo's error; other pymongo
    errors pass through. ``close_client=True`` hands the client over (:meth:`close` closes
    it); a client built by :meth:`from_url` is also replaced in a child made by ``fork()``,
    which never touches the parent's.
    """

    capabilities: ClassVar[Capabilities] = Capabilities(
        server_clock=True,
        fencing=True,
        release_notify=False,
        replica_wait=True,
        scan=True,
        batch_extend=False,
        counting=True,
        min_ttl=0.0,
        clock="the MongoDB server's clock ($$NOW)",
        wake="none: waiters pause 0.2 s between attempts",
    )
    url_options: ClassVar[Mapping[str, Callable[[str], Any]]] = OPTIONS

    def __init__(
        self,
        client: Any,
        *,
        database: Optional[str] = None,
        collection: str = "lease_lock",
        create_indexes: bool = True,
        write_concern: Union[Mapping[str, Any], WriteConcern, None] = MAJORITY,
        close_client: bool = False,
    ) -> None:
        if not isinstance(client, pymongo.MongoClient):
            raise ValidationError(f"client must be a pymongo.MongoClient, not {type(client).__name__}")
        if database is not None and (not isinstance(database, str) or not database):
            raise ValidationError("database must be a non-empty str or None (the client's default database)")
        #: The name of the lease collection; the fences and counters collections add a suffix.
        self.collection = _check_collection(collection)
        self.create_indexes = check_bool(create_indexes, "create_indexes")
        #: The write concern of every write (``None``: the client's own).
        self.write_concern = _write_concern(write_concern)
        self._database = database
        self._close_client = check_bool(close_client, "close_client")
        #: Builds a replacement client in a forked child (only for a client built from a URL).
        self._rebuild: Optional[Callable[[], Any]] = None
        self._inherited: list[Any] = []
        self._bind(client)

    @classmethod
    def from_url(cls, url: str, **options: Any) -> MongoBackend:
        """``mongodb://[user:password@]host[:port][,host...]/DATABASE`` or
        ``mongodb+srv://...``; options (query string or keyword) ``collection`` and
        ``create_indexes``, keyword ``write_concern``. Every other query option is pymongo's
        and goes to the client (``replicaSet``, ``tls``, ``authSource``, ...); a URL that sets
        ``w``, ``journal`` or ``wTimeoutMS`` keeps that write concern. Unless the URL sets them,
        the client gives up on selecting a server or connecting after 5 s and on an answer
        after 10 s."""
        plan = plan_client(url, options)
        settings = dict(plan.options)
        if plan.own_write_concern:
            settings.setdefault("write_concern", None)
        client = plan.client()
        try:
            backend = cls(client, database=plan.database, close_client=True, **settings)
        except BaseException:
            client.close()
            raise
        backend._rebuild = plan.client
        return backend

    def _bind(self, client: Any) -> None:
        try:
            database = client.get_database(self._database) if self._database else client.get_default_database()
        except pymongo.errors.ConfigurationError:
            raise ValidationError(
                "the client's URL names no database: pass database= or name it in the URL (mongodb://host/DATABASE)"
            ) from None
        #: The pymongo client the backend talks through.
        self.client = client
        #: The name of the database that holds the collections.
        self.database: str = database.name
        settings: dict[str, Any] = {"codec_options": _CODEC, "read_preference": pymongo.ReadPreference.PRIMARY}
        if self.write_concern is not None:
            settings["write_concern"] = self.write_concern
        self._leases = database.get_collection(self.collection, **settings)
        self._fences = database.get_collection(f"{self.collection}-fences", **settings)
        self._counters = database.get_collection(f"{self.collection}-counters", **settings)
        self._where = f"{self.database}.{self.collection}"
        self._ready = False
        self._setup = threading.Lock()
        self._pid = os.getpid()

    def __repr__(self) -> str:
        return f"MongoBackend(database={self.database!r}, collection={self.collection!r})"

    # -- every call ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _calls(self) -> Iterator[None]:
        """The frame of every operation: a fresh client in a forked child, the indexes on first
        use, and pymongo's outage errors turned into ``BackendUnavailableError``."""
        if self._pid != os.getpid():
            self._after_fork()
        with unavailable_on_outage(self._where):
            if not self._ready:
                self._prepare()
            yield

    def _after_fork(self) -> None:
        # The parent's client is kept, never used or closed here: closing it could end sessions
        # the parent still uses. A client of the caller's is the caller's to replace.
        if self._rebuild is None:
            self._pid = os.getpid()
            return
        self._inherited.append(self.client)
        self._bind(self._rebuild())

    def _prepare(self) -> None:
        with self._setup:
            if self._ready:
                return
            if self.create_indexes:
                self._leases.create_indexes(mongo_indexes(collection=self.collection)[self.collection])
            elif not any(
                dict(index["key"]) == _TTL_KEY and "expireAfterSeconds" in index
                for index in self._leases.list_indexes()
            ):
                raise ValidationError(
                    f"MongoDB collection {self._where} has no TTL index on 'expires' (expireAfterSeconds=0), which"
                    " sweeps lapsed leases: create it from mongo_indexes() or pass create_indexes=True"
                )
            self._ready = True

    def call_budget(self, seconds: float) -> ContextManager[None]:
        """Bound every pymongo call of this thread inside the block to ``seconds`` plus two
        seconds (``pymongo.timeout``); a call out of time raises ``BackendUnavailableError``."""
        if math.isinf(seconds):
            return contextlib.nullcontext()
        return pymongo.timeout(max(seconds, 0.0) + _ANSWER_MARGIN)

    # -- grants --------------------------------------------------------------------------------

    def _upsert(self, collection: Any, match: Mapping[str, Any], update: list[dict[str, Any]]) -> Any:
        """One pipeline upsert; the document after it. Two first upserts of a new document can
        race, and the loser's insert meets the ``_id`` index: it is sent again, and then finds
        the document."""
        try:
            return collection.find_one_and_update(match, update, upsert=True, return_document=ReturnDocument.AFTER)
        except pymongo.errors.DuplicateKeyError:
            return collection.find_one_and_update(match, update, upsert=True, return_document=ReturnDocument.AFTER)

    def _grant(self, key: str, tokens: tuple[str, ...], token: str, ttl: float, owner: str) -> Optional[Any]:
        """The lease document after a grant to ``token`` (when ``key`` is free or one of
        ``tokens`` is in it), or ``None`` when another token holds it."""
        try:
            return self._leases.find_one_and_update(
                grant_filter(key, *tokens),
                grant_update(token, ttl, owner),
                projection={"fence": True},
                upsert=True,
                return_document=ReturnDocument.AFTER,
            )
        except pymongo.errors.DuplicateKeyError:
            return None

    def _fenced(self, key: str, tokens: tuple[str, ...], token: str, ttl: float, owner: str) -> Optional[int]:
        sent = time.monotonic()
        with self._calls():
            granted = self._grant(key, tokens, token, ttl, owner)
            if granted is None:
                return None
            if granted.get("fence") is not None:
                return int(granted["fence"])  # the holder's renewal keeps its fence
            holding = live_by(key, token)
            return self._numbered(
                key, sent, ttl, lambda: self._leases.delete_one(holding),
                lambda fence: self._leases.update_one(holding, {"$set": {"fence": fence}}),
            )

    def _numbered(
        self, key: str, sent: float, ttl: float, give_back: Callable[[], object], record: Callable[[int], Any]
    ) -> Optional[int]:
        """The fence of a new grant of ``key`` (a lease, or a place) whose request left at
        ``sent``: drawn from the key's counter, then written by ``record`` (an update that
        matches only while the grant runs on the server's clock: then the counter moved before
        the grant ended, so before any later grant of the key). ``None`` when the counter
        answered too late (the grant is then given back) or the grant ended meanwhile."""
        fence = self._next_fence(key, sent, ttl)
        if fence is None:
            give_back()
            return None
        return fence if record(fence).matched_count == 1 else None

    def _next_fence(self, key: str, sent: float, ttl: float) -> Optional[int]:
        """Move ``key``'s fence counter for a grant asked for at ``sent`` (monotonic) with a
        lease of ``ttl``; the fence, or ``None`` when the answer came too late to count: the
        counter may have moved after the lease ended, and after the next holder's counter, so
        the fence would not be ordered by the lease (the caller gives the grant back)."""
        fence = int(self._upsert(self._fences, {"_id": key}, fence_update())["fence"])
        return fence if time.monotonic() - sent < ttl else None

    def acquire(self, key: str, token: str, ttl: float, owner: str) -> bool:
        """Grant or renew ``key`` for ``token``: one pipeline upsert."""
        with self._calls():
            return self._grant(key, (token,), token, ttl, owner) is not None

    def acquire_fenced(self, key: str, token: str, ttl: float, owner: str) -> Optional[int]:
        """Grant or renew ``key`` for ``token``; a new grant is numbered by the key's counter."""
        return self._fenced(key, (token,), token, ttl, owner)

    def adopt(self, key: str, claim_token: str, token: str, ttl: float, owner: str) -> Optional[int]:
        """Replace the claim ``claim_token`` on ``key`` (or take a free key) with a new fenced
        grant to ``token``, in the grant's one upsert; ``token``'s own lease is renewed."""
        return self._fenced(key, (claim_token, token), token, ttl, owner)

    def _place(self, key: str, token: str, ttl: float, owner: str, limit: int) -> Optional[Any]:
        """The counting document of ``key`` after a grant of a place to ``token``, or ``None``
        when the key was held otherwise at each of two tries; raises the limit mismatch."""
        for _ in range(2):
            try:
                return self._leases.find_one_and_update(
                    place_grant_filter(key, limit),
                    place_grant_update(token, ttl, owner, limit),
                    projection={"places": True},
                    upsert=True,
                    return_document=ReturnDocument.AFTER,
                )
            except pymongo.errors.DuplicateKeyError:
                # Nothing was written. A running lease of another kind or limit is the mismatch;
                # a document that changed in between (or the first two grants of a key racing to
                # insert it) is sent again.
                held = self._leases.find_one(live(key), projection={"limit": True})
                if held is not None and int(held.get("limit", 1)) != limit:
                    raise limit_mismatch(key, limit, int(held.get("limit", 1))) from None
        return None

    def acquire_counted(self, key: str, token: str, ttl: float, owner: str, limit: int) -> Optional[int]:
        """Grant or renew one of the ``limit`` places of ``key`` for ``token``: one pipeline
        upsert decides; a new place is then numbered by the key's fence counter, the one
        exclusive grants of the key use, as a fenced exclusive grant is."""
        sent = time.monotonic()
        with self._calls():
            granted = self._place(key, token, ttl, owner, limit)
            place = None if granted is None else next((p for p in granted["places"] if p["token"] == token), None)
            if place is None:
                return None
            if place.get("fence") is not None:
                return int(place["fence"])  # the holder's renewal keeps its fence
            holding = place_filter(key, token)
            return self._numbered(
                key, sent, ttl, lambda: self._leases.update_one(holding, place_release_update(token)),
                lambda fence: self._leases.update_one(holding, place_fence_update(token, fence)),
            )

    # -- the holder's operations ---------------------------------------------------------------

    def release(self, key: str, token: str) -> bool:
        """Delete ``key``'s document if ``token`` holds a running lease on it, else drop
        ``token``'s running place of a counting key."""
        with self._calls():
            if self._leases.delete_one(live_by(key, token)).deleted_count == 1:
                return True
            released = self._leases.update_one(place_filter(key, token), place_release_update(token))
            return bool(released.matched_count)

    def extend(self, key: str, token: str, ttl: float) -> bool:
        """Set ``key``'s lease, or ``token``'s place of a counting key, to ``ttl`` from the
        server's now if ``token`` holds it."""
        with self._calls():
            if self._leases.update_one(live_by(key, token), extend_update(ttl)).matched_count == 1:
                return True
            extended = self._leases.update_one(place_filter(key, token), place_extend_update(token, ttl))
            return bool(extended.matched_count)

    def is_held(self, key: str, token: str) -> bool:
        """``True`` if ``token`` holds a running lease or place on ``key`` (read from the primary)."""
        with self._calls():
            return self._leases.find_one(held_by(key, token), projection={"_id": True}) is not None

    # -- reads and administration --------------------------------------------------------------

    @staticmethod
    def _state(document: Mapping[str, Any]) -> LockState:
        if "places" in document:
            holders = [
                Holder(place.get("owner"), _fence(place), place["expires"], place["left"] / 1000)
                for place in document["places"]
            ]
            return LockState.counting(document["_id"], int(document["limit"]), holders)
        return LockState(
            key=document["_id"],
            held=True,
            expires_at=document["expires"],
            fence=_fence(document),
            owner=document.get("owner"),
            expires_in=document["left"] / 1000,
        )

    def inspect(self, key: str) -> LockState:
        """The state of ``key``; ``expires_in`` is measured on the server's clock."""
        with self._calls():
            found = list(self._leases.aggregate(held_pipeline(key=key)))
        return self._state(found[0]) if found else LockState.free(key)

    def scan(self, prefix: str) -> Iterator[LockState]:
        """Keys with a running lease starting with ``prefix``, sorted by key."""
        with self._calls():
            found = list(self._leases.aggregate(held_pipeline(prefix=prefix)))
        return iter([self._state(document) for document in found])

    def force_release(self, key: str) -> bool:
        """Delete ``key``'s document whoever holds it; ``True`` when a running lease went."""
        with self._calls():
            return bool(self._leases.delete_one(live(key)).deleted_count == 1)

    def count_in_window(self, name: str, window: float, amount: int = 1) -> tuple[int, float]:
        """Add ``amount`` to counter ``name`` in the current window of the server's clock."""
        check_amount(amount)
        seconds = check_duration(window, "window")
        with self._calls():
            counter = self._upsert(self._counters, {"_id": name}, counter_update(seconds * 1000, amount))
        left = (float(counter["window"]) + 1) * seconds - counter["at"].timestamp()
        return int(counter["count"]), max(0.0, left)

    def close(self) -> None:
        """Close the client if the backend owns it (``close_client=True``, or built from a URL)."""
        if self._close_client and self._pid == os.getpid():
            self.client.close()
