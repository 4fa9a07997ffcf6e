"""The MongoDB backend against a real wire server (see tests/support/mongo_server.py)."""

from __future__ import annotations

import datetime
import threading
import time
import urllib.parse
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import freezegun
import lease_lock
import pymongo
import pymongo.errors
import pytest
from benchmarks.chaos_harness.proxy import TcpProxy
from lease_lock.backends import backend_from_url
from lease_lock.backends.base import Backend
from lease_lock.backends.mongo import MongoBackend, mongo_indexes
from lease_lock.errors import BackendUnavailableError, ValidationError
from lease_lock.testing import BackendContract, ServiceStoreContract, wait_until
from pymongo import monitoring

from tests.support.children import check_forked_children_beside_the_parent
from tests.support.mongo_server import MongoServer
from tests.support.ports import free_port
from tests.support.silent_wait import check_a_silent_store_ends_a_wait_as_an_outage

OWNER = "mongo-test:1"


class TestMongoUrl(BackendContract, ServiceStoreContract):
    """The contract through ``connect("mongodb://...")``, which builds the client."""

    @pytest.fixture
    def backend(self, mongo_server: MongoServer, mongo_database: str) -> Iterator[MongoBackend]:
        backend = backend_from_url(mongo_server.url(mongo_database))
        assert isinstance(backend, MongoBackend)
        yield backend
        backend.close()

    def adopts(self, backend: Backend, key: str) -> bool:
        # A claim is replaced in the grant's one upsert: the contract's adoption tests run.
        assert type(backend).adopt is not Backend.adopt, "MongoBackend must implement adopt"
        return True


class TestMongoClient(BackendContract):
    """The contract on a caller's client, which the backend leaves open."""

    @pytest.fixture
    def backend(self, mongo_server: MongoServer, mongo_database: str) -> Iterator[MongoBackend]:
        client: Any = mongo_server.client()
        backend = MongoBackend(client, database=mongo_database, collection="locks")
        yield backend
        backend.close()
        assert client.admin.command("ping")["ok"], "a caller's client stays open"
        client.close()


@pytest.fixture
def key() -> str:
    return f"mongo-test:{uuid.uuid4().hex}"


def token() -> str:
    return uuid.uuid4().hex


@pytest.fixture
def client(mongo_server: MongoServer) -> Iterator[Any]:
    client = mongo_server.client()
    yield client
    client.close()


@pytest.fixture
def backend(mongo_server: MongoServer, mongo_database: str) -> Iterator[MongoBackend]:
    backend = MongoBackend.from_url(mongo_server.url(mongo_database))
    yield backend
    backend.close()


def test_the_document_is_readable_by_operators(client: Any, backend: MongoBackend, key: str) -> None:
    mine = token()
    fence = backend.acquire_fenced(key, mine, 60, OWNER)
    document = client[backend.database]["lease_lock"].find_one({"_id": key})
    assert {name: document[name] for name in ("_id", "token", "owner", "fence")} == {
        "_id": key, "token": mine, "owner": OWNER, "fence": fence,
    }
    counter = client[backend.database]["lease_lock-fences"].find_one({"_id": key})
    assert counter["fence"] == fence


def test_an_owner_label_is_text_not_a_field_path(backend: MongoBackend, key: str) -> None:
    holder = token()
    assert backend.acquire(key, holder, 30.0, "$token")
    assert backend.inspect(key).owner == "$token"


# -- the server's clock --------------------------------------------------------------------------


def test_expiry_is_judged_on_the_servers_clock_not_the_clients(backend: MongoBackend, key: str) -> None:
    # The client's wall clock a century ahead changes nothing: no statement reads it.
    mine = token()
    with freezegun.freeze_time("2126-01-01"):
        assert backend.acquire_fenced(key, mine, 60, OWNER) is not None
        state = backend.inspect(key)
        assert backend.is_held(key, mine)
        assert backend.extend(key, mine, 60)
    assert state.held and state.expires_at is not None and state.expires_in is not None
    assert abs(state.expires_at.timestamp() - time.time() - 60) < 30
    assert 0 < state.expires_in <= 60


def test_a_lapsed_lease_still_stored_is_taken_over(
    mongo_server: MongoServer, mongo_database: str, client: Any, key: str
) -> None:
    # A real server's TTL monitor runs about once a minute, so a lapsed lease can still be
    # there when the next grant comes: the grant takes it over instead of failing on the _id.
    # Here the TTL index sweeps only after a year, so the lapsed document is surely still there.
    leases = client[mongo_database]["lease_lock"]
    leases.create_index("expires", expireAfterSeconds=365 * 86400)
    backend = MongoBackend.from_url(mongo_server.url(mongo_database), create_indexes=False)
    try:
        first = backend.acquire_fenced(key, token(), 60, OWNER)
        # An hour ago (on this host's clock; far beyond any skew from the server's).
        lapsed = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(hours=1)
        leases.update_one({"_id": key}, {"$set": {"expires": lapsed}})
        assert not backend.inspect(key).held and not list(backend.scan(key))
        assert leases.count_documents({"_id": key}) == 1
        second = token()
        fence = backend.acquire_fenced(key, second, 60, OWNER)
        assert backend.is_held(key, second)
        assert first is not None and fence is not None and fence > first
        assert leases.count_documents({"_id": key}) == 1
    finally:
        backend.close()


# -- fences ------------------------------------------------------------------------------------


def test_fences_rise_after_the_lease_document_is_deleted_by_hand(
    client: Any, backend: MongoBackend, key: str
) -> None:
    first = backend.acquire_fenced(key, token(), 60, OWNER)
    client[backend.database]["lease_lock"].delete_one({"_id": key})
    second = backend.acquire_fenced(key, token(), 60, OWNER)
    assert first is not None and second is not None and second > first


def test_fences_rise_after_the_counters_are_lost(client: Any, backend: MongoBackend, key: str) -> None:
    # A counter a thousand grants ahead of the clock floor, then every counter and lease gone:
    # the clock floor still puts the next fence above the last one handed out.
    first = backend.acquire_fenced(key, token(), 60, OWNER)
    assert first is not None
    database = client[backend.database]
    database["lease_lock-fences"].update_one({"_id": key}, {"$inc": {"fence": 1000}})
    database["lease_lock"].delete_one({"_id": key})
    ahead = backend.acquire_fenced(key, token(), 60, OWNER)
    assert ahead is not None and ahead >= first + 1000
    database.drop_collection("lease_lock-fences")
    database.drop_collection("lease_lock")
    wait_until(lambda: time.time() * 1e6 > ahead + 10_000, 30)
    after = backend.acquire_fenced(key, token(), 60, OWNER)
    assert after is not None and after > ahead


class _SlowCounter(monitoring.CommandListener):
    """Holds back every write to a fences collection by ``delay`` seconds before it is sent."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        target = str(event.command.get("findAndModify", ""))
        if event.command_name.lower() == "findandmodify" and target.endswith("-fences"):
            time.sleep(self.delay)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


def test_a_fence_counted_after_the_lease_ended_is_not_handed_out(
    mongo_server: MongoServer, mongo_database: str, client: Any, key: str
) -> None:
    # The counter's answer comes back after the grant's lease (50 ms) could have ended: the
    # fence is not ordered by the lease, so it is not handed out and the grant is given back.
    slow = pymongo.MongoClient(mongo_server.base, event_listeners=[_SlowCounter(0.2)])
    backend = MongoBackend(slow, database=mongo_database)
    try:
        assert backend.acquire_fenced(key, token(), 0.05, OWNER) is None
        document = client[mongo_database]["lease_lock"].find_one({"_id": key})
        assert document is None or "fence" not in document
        assert client[mongo_database]["lease_lock-fences"].find_one({"_id": key}) is not None
        # In time, the same slow counter gives a fence.
        assert backend.acquire_fenced(key, token(), 60, OWNER) is not None
    finally:
        backend.close()
        slow.close()


# -- counting keys -------------------------------------------------------------------------------


def test_a_counting_key_is_one_document_readable_by_operators(
    client: Any, backend: MongoBackend, key: str
) -> None:
    first, second = token(), token()
    fences = [backend.acquire_counted(key, first, 60, OWNER, 3), backend.acquire_counted(key, second, 30, "other", 3)]
    document = client[backend.database]["lease_lock"].find_one({"_id": key})
    assert set(document) == {"_id", "limit", "expires", "places"} and document["limit"] == 3
    assert [(place["token"], place["owner"], place["fence"]) for place in document["places"]] == [
        (first, OWNER, fences[0]), (second, "other", fences[1]),
    ]
    assert document["expires"] == max(place["expires"] for place in document["places"])
    # Places are numbered by the key's one fence counter, the one exclusive grants use.
    assert client[backend.database]["lease_lock-fences"].find_one({"_id": key})["fence"] == fences[1]


def test_lapsed_documents_of_either_kind_still_stored_are_taken_over(
    mongo_server: MongoServer, mongo_database: str, client: Any, key: str
) -> None:
    # As in test_a_lapsed_lease_still_stored_is_taken_over: the TTL index sweeps only after a
    # year, so each lapsed document is surely still there for the next grant to take over.
    leases = client[mongo_database]["lease_lock"]
    leases.create_index("expires", expireAfterSeconds=365 * 86400)
    backend = MongoBackend.from_url(mongo_server.url(mongo_database), create_indexes=False)
    lapsed = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(hours=1)
    try:
        exclusive = backend.acquire_fenced(key, token(), 60, OWNER)
        leases.update_one({"_id": key}, {"$set": {"expires": lapsed}})
        place = backend.acquire_counted(key, token(), 60, OWNER, 2)
        assert exclusive is not None and place is not None and place > exclusive
        document = leases.find_one({"_id": key})
        assert set(document) == {"_id", "limit", "expires", "places"} and len(document["places"]) == 1
        # Lapsed places of another limit: the key is free, and the new limit is the key's.
        leases.update_one({"_id": key}, {"$set": {"expires": lapsed, "places.0.expires": lapsed}})
        other = backend.acquire_counted(key, token(), 60, OWNER, 3)
        assert other is not None and other > place and backend.inspect(key).limit == 3
        leases.update_one({"_id": key}, {"$set": {"expires": lapsed, "places.0.expires": lapsed}})
        holder = token()
        again = backend.acquire_fenced(key, holder, 60, OWNER)
        assert again is not None and again > other
        document = leases.find_one({"_id": key})
        assert set(document) == {"_id", "token", "owner", "expires", "fence"} and document["token"] == holder
    finally:
        backend.close()


def test_a_place_numbered_after_its_lease_ended_is_given_back(
    mongo_server: MongoServer, mongo_database: str, client: Any, key: str
) -> None:
    # As for an exclusive grant: the counter answers after the place (50 ms) could have ended.
    slow = pymongo.MongoClient(mongo_server.base, event_listeners=[_SlowCounter(0.2)])
    backend = MongoBackend(slow, database=mongo_database)
    late = token()
    try:
        assert backend.acquire_counted(key, late, 0.05, OWNER, 2) is None
        document = client[mongo_database]["lease_lock"].find_one({"_id": key})
        assert document is None or late not in [place["token"] for place in document["places"]]
        assert backend.acquire_counted(key, token(), 60, OWNER, 2) is not None
    finally:
        backend.close()
        slow.close()


def test_racing_counting_grants_never_exceed_the_limit(backend: MongoBackend, key: str) -> None:
    limit, inside, most, fences = 3, [0], [0], []
    guard = threading.Lock()

    def worker() -> None:
        for _ in range(15):
            mine = token()
            fence = backend.acquire_counted(key, mine, 60, OWNER, limit)
            if fence is None:
                continue
            with guard:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
                fences.append(fence)
            time.sleep(0.005)
            with guard:
                inside[0] -= 1
            assert backend.release(key, mine)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert 1 <= most[0] <= limit and len(fences) == len(set(fences))
    assert not backend.inspect(key).held


# -- indexes and options -----------------------------------------------------------------------


def test_the_ttl_index_is_created_on_first_use(client: Any, backend: MongoBackend, key: str) -> None:
    assert backend.acquire(key, token(), 60, OWNER)
    indexes = {index["name"]: index for index in client[backend.database]["lease_lock"].list_indexes()}
    ttl = [index for index in indexes.values() if dict(index["key"]) == {"expires": 1}]
    assert len(ttl) == 1 and ttl[0]["expireAfterSeconds"] == 0


def test_without_create_indexes_a_missing_ttl_index_is_refused_until_made(
    mongo_server: MongoServer, mongo_database: str, client: Any, key: str
) -> None:
    url = mongo_server.url(mongo_database, collection="locks", create_indexes="false")
    backend = MongoBackend.from_url(url)
    try:
        with pytest.raises(ValidationError, match=r"no TTL index on 'expires'.*mongo_indexes"):
            backend.acquire(key, token(), 60, OWNER)
        assert "locks" not in client[mongo_database].list_collection_names()
        for name, indexes in mongo_indexes(collection="locks").items():
            client[mongo_database][name].create_indexes(indexes)
        assert backend.acquire(key, token(), 60, OWNER)
    finally:
        backend.close()


def test_the_url_names_database_collection_and_pymongo_options(
    mongo_server: MongoServer, mongo_database: str, client: Any, key: str
) -> None:
    url = mongo_server.url(mongo_database, collection="app-locks", appname="ll-test", serverSelectionTimeoutMS="2500")
    with lease_lock.connect(url) as locker:
        backend = locker.backend
        assert isinstance(backend, MongoBackend)
        assert (backend.database, backend.collection) == (mongo_database, "app-locks")
        assert backend.client.options.pool_options.metadata["application"]["name"] == "ll-test"
        assert backend.client.options.server_selection_timeout == 2.5
        with locker.lock(key):
            assert client[mongo_database]["app-locks"].count_documents({"_id": key}) == 1


def test_writes_ask_a_majority_unless_told_otherwise(mongo_server: MongoServer, mongo_database: str) -> None:
    plain = MongoBackend.from_url(mongo_server.url(mongo_database))
    own = MongoBackend.from_url(mongo_server.url(mongo_database, w="1"))
    given = MongoBackend.from_url(mongo_server.url(mongo_database), write_concern={"w": 1, "wtimeout": 5000})
    try:
        assert plain.write_concern == pymongo.WriteConcern(w="majority")
        assert own.write_concern is None and own.client.write_concern == pymongo.WriteConcern(w=1)
        assert given.write_concern == pymongo.WriteConcern(w=1, wtimeout=5000)
        for backend in (plain, own, given):
            assert backend.acquire(f"wc:{uuid.uuid4().hex}", token(), 60, OWNER)
    finally:
        for backend in (plain, own, given):
            backend.close()


@pytest.mark.parametrize(
    ("url", "options", "message"),
    [
        ("mongodb://127.0.0.1:1/", {}, "must name its database"),
        ("mongodb://127.0.0.1:1/db?colection=x", {}, "colection"),
        ("mongodb://127.0.0.1:1/db?serverSelectionTimeoutMS=soon", {}, "serverselectiontimeoutms"),
        ("mongodb://127.0.0.1:1/db?create_indexes=maybe", {}, "create_indexes"),
        ("mongodb://127.0.0.1:1/db?write_concern=majority", {}, "pymongo's own options w"),
        ("mongodb://127.0.0.1:1/db", {"collection": "system.locks"}, "system."),
        ("mongodb://127.0.0.1:1/db", {"collection": ""}, "collection must be"),
        ("mongodb://127.0.0.1:1/db", {"write_concern": {"w": 0}}, "acknowledged"),
        ("mongodb://127.0.0.1:1/db", {"write_concern": "majority"}, "write_concern must be a mapping"),
        ("mongodb://127.0.0.1:1/db", {"tabel": "x"}, "tabel"),
        ("mongodb://u:s3cret@127.0.0.1:1/", {}, r"u:\*\*\*@"),
    ],
)
def test_bad_urls_and_options_are_validation_errors(url: str, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message) as caught:
        lease_lock.connect(url, **options)
    assert "s3cret" not in str(caught.value)


# -- outages -----------------------------------------------------------------------------------


def test_an_unreachable_server_is_backend_unavailable() -> None:
    url = f"mongodb://127.0.0.1:{free_port()}/db?serverSelectionTimeoutMS=300"
    with lease_lock.connect(url) as locker:
        with pytest.raises(BackendUnavailableError) as caught:
            locker.try_acquire("k")
        assert isinstance(caught.value.__cause__, pymongo.errors.ServerSelectionTimeoutError)
        assert caught.value.backend == "mongodb"
        with pytest.raises(BackendUnavailableError):
            locker.get("k")


def test_a_silent_server_ends_a_wait_at_its_timeout(mongo_server: MongoServer, mongo_database: str, key: str) -> None:
    # The waiter reaches the server through a proxy that then holds every byte back, with a
    # socket timeout far longer than the wait: the call budget must end the wait.
    port = int(urllib.parse.urlsplit(mongo_server.base).port or 27017)
    proxy = TcpProxy("127.0.0.1", port)
    holder = MongoBackend.from_url(mongo_server.url(mongo_database))
    silent = mongo_server.url(mongo_database, socketTimeoutMS="60000").replace(f":{port}/", f":{proxy.port}/", 1)
    waiter = MongoBackend.from_url(silent)
    try:
        check_a_silent_store_ends_a_wait_as_an_outage(
            holder, waiter, key, proxy.stall, proxy.resume, pymongo.errors.PyMongoError
        )
    finally:
        waiter.close()
        proxy.close()
        holder.force_release(key)
        holder.close()


def test_other_driver_errors_pass_through(mongo_server: MongoServer, mongo_database: str, client: Any) -> None:
    # An index on 'expires' without expiry, made by someone else: creating the TTL index is
    # refused by the server, an error of the statement, not an outage.
    client[mongo_database]["lease_lock"].create_index("expires")
    backend = MongoBackend.from_url(mongo_server.url(mongo_database))
    try:
        with pytest.raises(pymongo.errors.OperationFailure) as caught:
            backend.acquire("k", token(), 60, OWNER)
        assert not isinstance(caught.value, pymongo.errors.ConnectionFailure)
    finally:
        backend.close()


# -- fork ------------------------------------------------------------------------------------------


def test_forked_children_use_clients_of_their_own(backend: MongoBackend) -> None:
    # Each child's first call replaces the client the URL built (pymongo would warn about one
    # opened before the fork, which the suite turns into an error): its cycles must all work
    # while the parent keeps using its own client.
    parent_client = backend.client

    def child_cycles(index: int) -> int:
        mine = f"child-{index}-" + "c" * 24
        for cycle in range(20):
            name = f"forked:{index}:{cycle}"
            if backend.acquire_fenced(name, mine, 60, OWNER) is None or not backend.release(name, mine):
                return 1
        return 0 if backend.client is not parent_client else 2

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_forked_children_beside_the_parent(backend, child_cycles, token())
    assert backend.client is parent_client
