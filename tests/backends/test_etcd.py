"""The etcd backend on real etcd members: the contract, its layout, URLs, failover, auth, TLS."""

from __future__ import annotations

import base64
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any, NamedTuple

import lease_lock
import pytest
import requests
from benchmarks.chaos_harness.proxy import TcpProxy
from lease_lock import BackendUnavailableError, ExtendRequest, ValidationError
from lease_lock.admin import held_locks
from lease_lock.backends import backend_from_url
from lease_lock.backends.base import Backend
from lease_lock.backends.etcd import EtcdBackend, EtcdError, lease_seconds
from lease_lock.testing import BackendContract, ServiceStoreContract, wait_until

from tests.support.children import check_forked_children_beside_the_parent, exit_codes, fork_children
from tests.support.cycles import errors_left_in_cycles
from tests.support.etcd_nested import INNER, nested_namespaces
from tests.support.etcd_server import CountingSession, EtcdCluster, EtcdFactory, queue_entries
from tests.support.handoff import note_taken_wakes
from tests.support.ports import free_port

OWNER = "etcd-test:1"


def raw(cluster: EtcdCluster, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """One request to the first member, by hand, to look at what the backend left in etcd."""
    answer = requests.post(cluster.endpoints[0] + path, json=body, timeout=10).json()
    assert isinstance(answer, dict)
    return answer


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def live_leases(cluster: EtcdCluster) -> set[str]:
    return {lease["ID"] for lease in raw(cluster, "/v3/lease/leases", {}).get("leases", [])}


class TestEtcdBackend(BackendContract, ServiceStoreContract):
    @pytest.fixture
    def backend(self, etcd_cluster: EtcdCluster) -> Iterator[EtcdBackend]:
        backend = EtcdBackend.from_url(etcd_cluster.url)
        yield backend
        backend.close()

    def adopts(self, backend: Backend, key: str) -> bool:
        # etcd adopts a claim (one guarded transaction): the contract's adoption tests run.
        assert type(backend).adopt is not Backend.adopt, "EtcdBackend must implement adopt"
        return True


@pytest.fixture
def backend(etcd_backend: EtcdBackend) -> EtcdBackend:
    return etcd_backend


@pytest.fixture
def key() -> str:
    return f"etcd-test:{uuid.uuid4().hex}"


def token() -> str:
    return uuid.uuid4().hex


# -- layout ------------------------------------------------------------------------------------


def test_the_key_holds_token_and_owner_under_the_namespace(
    etcd_server: EtcdCluster, backend: EtcdBackend, key: str
) -> None:
    mine = token()
    fence = backend.acquire_fenced(key, mine, 30, OWNER)
    kvs = raw(etcd_server, "/v3/kv/range", {"key": b64("lease_lock/" + key)})["kvs"]
    assert base64.b64decode(kvs[0]["value"]) == f"{mine}\x00{OWNER}".encode()
    # The fence is the key's create_revision, and the key rides on a lease of its own.
    assert fence == int(kvs[0]["create_revision"])
    lease = raw(etcd_server, "/v3/lease/timetolive", {"ID": kvs[0]["lease"], "keys": True})
    assert [base64.b64decode(name).decode() for name in lease["keys"]] == ["lease_lock/" + key]


def test_namespaces_keep_lockers_apart(etcd_server: EtcdCluster, key: str) -> None:
    first = EtcdBackend.from_url(etcd_server.url + "?namespace=team-a/")
    second = EtcdBackend(etcd_server.endpoints, namespace="team-b/")
    try:
        assert first.acquire(key, token(), 30, OWNER)
        assert second.acquire(key, token(), 30, OWNER)
        assert [state.key for state in first.scan(key)] == [key]
        assert raw(etcd_server, "/v3/kv/range", {"key": b64("team-a/" + key)}).get("count") == "1"
    finally:
        first.close()
        second.close()


def test_an_outer_namespace_lists_only_lock_keys_of_a_nested_one(etcd_server: EtcdCluster) -> None:
    # The inner namespace's line places and queue entries lie in the outer one's range too.
    with nested_namespaces(etcd_server) as outer, lease_lock.connect(f"{etcd_server.url}?namespace={outer}") as locker:
        assert [state.key for state in locker.list()] == [f"{INNER}a", f"{INNER}b"]
        assert [state.key for state in locker.list(f"{INNER}a")] == [f"{INNER}a"]
        assert [state.key for state in held_locks(locker, INNER)] == [f"{INNER}a", f"{INNER}b"]


def test_rate_counters_stay_out_of_every_scan_even_of_the_empty_namespace(etcd_server: EtcdCluster) -> None:
    whole = EtcdBackend(etcd_server.endpoints, namespace="")
    try:
        name = f"counter-{uuid.uuid4().hex[:8]}"
        assert whole.count_in_window(name, 60, 3)[0] == 3
        assert whole.count_in_window(name, 60)[0] == 4
        assert not [state.key for state in whole.scan("") if name in state.key]
    finally:
        whole.close()


def counted_places(cluster: EtcdCluster, key: str, namespace: str = "lease_lock/") -> list[dict[str, Any]]:
    """The places of the counting key ``key`` in etcd, oldest first, read by hand."""
    start = f"{namespace}{key}\x00place\x00"
    body = {"key": b64(start), "range_end": b64(start[:-1] + "\x01")}
    return sorted(raw(cluster, "/v3/kv/range", body).get("kvs", []), key=lambda kv: int(kv["create_revision"]))


def test_counting_places_are_keys_of_their_own_on_leases_of_their_own(
    etcd_server: EtcdCluster, backend: EtcdBackend, key: str
) -> None:
    first, second = token(), token()
    fences = [backend.acquire_counted(key, item, 30, OWNER, 3) for item in (first, second)]
    # No lock key: the places hold the key, each its fence as create_revision and its limit.
    assert "kvs" not in raw(etcd_server, "/v3/kv/range", {"key": b64("lease_lock/" + key)})
    places = counted_places(etcd_server, key)
    names = [base64.b64decode(kv["key"]).decode() for kv in places]
    assert names == [f"lease_lock/{key}\x00place\x00{item}" for item in (first, second)]
    values = [f"{item}\x00{OWNER}\x003".encode() for item in (first, second)]
    assert [base64.b64decode(kv["value"]) for kv in places] == values
    assert fences == [int(kv["create_revision"]) for kv in places]
    assert len({kv["lease"] for kv in places}) == 2
    # An exclusive grant finds the key held, and writes nothing.
    assert backend.acquire_fenced(key, token(), 30, OWNER) is None
    assert backend.adopt(key, token(), token(), 30, OWNER) is None
    assert "kvs" not in raw(etcd_server, "/v3/kv/range", {"key": b64("lease_lock/" + key)})
    # A place's release deletes its key and no other; the place's lease is kept as a spare.
    assert backend.release(key, first)
    assert [kv["key"] for kv in counted_places(etcd_server, key)] == [places[1]["key"]]
    assert places[0]["lease"] in live_leases(etcd_server)


def test_counting_grant_on_a_free_key_is_one_transaction(etcd_server: EtcdCluster, key: str) -> None:
    session = CountingSession()
    backend = EtcdBackend(etcd_server.endpoints, session=session)
    try:
        assert backend.acquire_counted(key, token(), 30, OWNER, 2) is not None
        assert session.paths.count("/v3/kv/txn") == 1
        # With a place taken, the first transaction's failure brings the read; one more writes.
        session.paths.clear()
        assert backend.acquire_counted(key, token(), 30, OWNER, 2) is not None
        assert session.paths.count("/v3/kv/txn") == 2
        session.paths.clear()
        assert backend.acquire_counted(key, token(), 30, OWNER, 2) is None
        assert session.paths.count("/v3/kv/txn") == 1
    finally:
        backend.close()


def test_counting_a_place_released_by_another_backend_is_released_by_a_guarded_delete(
    etcd_server: EtcdCluster, backend: EtcdBackend, key: str
) -> None:
    mine = token()
    assert backend.acquire_counted(key, mine, 30, OWNER, 2) is not None
    other = EtcdBackend(etcd_server.endpoints)
    try:
        assert other.is_held(key, mine)
        assert other.extend(key, mine, 30)
        assert other.release(key, mine)
        assert not counted_places(etcd_server, key)
        assert not backend.is_held(key, mine)
    finally:
        other.close()


def test_counting_keys_of_a_nested_namespace_are_listed_once_by_the_outer_one(etcd_server: EtcdCluster) -> None:
    outer = f"nest-{uuid.uuid4().hex[:8]}/"
    inner = EtcdBackend(etcd_server.endpoints, namespace=outer + INNER)
    whole = EtcdBackend(etcd_server.endpoints, namespace=outer)
    try:
        for _ in range(2):
            assert inner.acquire_counted("c", token(), 30, OWNER, 3) is not None
        assert inner.acquire("d", token(), 30, OWNER)
        assert [(state.key, state.limit, len(state.holders)) for state in whole.scan("")] == [
            (f"{INNER}c", 3, 2), (f"{INNER}d", 1, 1),
        ]
        assert [state.key for state in whole.scan(f"{INNER}c")] == [f"{INNER}c"]
        assert [state.key for state in inner.scan("")] == ["c", "d"]
        # The outer namespace's key eu/c is the inner one's c, places and all.
        assert whole.inspect(f"{INNER}c").limit == 3
        assert whole.acquire(f"{INNER}c", token(), 30, OWNER) is False
        assert whole.force_release(f"{INNER}c")
        assert not inner.inspect("c").held
    finally:
        inner.close()
        whole.close()


def test_counting_a_place_released_wakes_a_waiter_of_another_backend(etcd_server: EtcdCluster, key: str) -> None:
    holder = EtcdBackend(etcd_server.endpoints)
    woken: list[str] = []
    backend = EtcdBackend(etcd_server.endpoints)
    note_taken_wakes(backend, woken.append)
    # The retry delay bounds every wait: one this long leaves the waiter only the place's wake.
    waiter = lease_lock.Locker(backend, ttl=30, limit=2, retry=lease_lock.Retry(delay=600))
    try:
        first, second = token(), token()
        assert holder.acquire_counted(key, first, 30, OWNER, 2) is not None
        assert holder.acquire_counted(key, second, 30, OWNER, 2) is not None
        got = threading.Event()

        def wait() -> None:
            with waiter.lock(key, timeout=1200):
                got.set()

        thread = threading.Thread(target=wait)
        thread.start()
        assert wait_until(lambda: bool(queue_entries(etcd_server, key)), 30)
        started = time.monotonic()
        assert holder.release(key, first)
        assert got.wait(20)
        # Woken by the release, long before the places' 30 s leases end.
        assert time.monotonic() - started < 10
        assert woken == [key]
        thread.join(30)
    finally:
        holder.force_release(key)
        holder.close()
        waiter.close()
        backend.close()


def test_ttls_are_whole_seconds_at_least_two() -> None:
    assert [lease_seconds(ttl) for ttl in (0.1, 1.0, 2.0, 2.01, 29.5)] == [2, 2, 2, 3, 30]
    with pytest.raises(ValidationError, match="ttl must be at most"):
        lease_seconds(1e12)


def test_a_lease_is_granted_rounded_up(etcd_server: EtcdCluster, backend: EtcdBackend, key: str) -> None:
    assert backend.acquire(key, token(), 2.2, OWNER)
    kvs = raw(etcd_server, "/v3/kv/range", {"key": b64("lease_lock/" + key)})["kvs"]
    assert raw(etcd_server, "/v3/lease/timetolive", {"ID": kvs[0]["lease"]})["grantedTTL"] == "3"


def key_lease(cluster: EtcdCluster, name: str) -> str:
    """The lease the key of lock ``name`` is attached to (in the default namespace)."""
    kvs = raw(cluster, "/v3/kv/range", {"key": b64("lease_lock/" + name)}).get("kvs", [])
    assert kvs, f"{name} is not held"
    return str(kvs[0]["lease"])


def test_a_lease_outlives_its_key_only_as_a_spare_and_close_revokes_the_spares(
    etcd_server: EtcdCluster, key: str
) -> None:
    backend = EtcdBackend.from_url(etcd_server.url)
    before = live_leases(etcd_server)
    mine, other = token(), token()
    try:
        assert backend.acquire(key, mine, 30, OWNER)
        first = key_lease(etcd_server, key)
        assert backend.acquire(key, mine, 30, OWNER)  # re-acquire: the key moves to a new lease
        assert first not in live_leases(etcd_server)  # and the old one is revoked
        assert not backend.acquire(key, other, 30, OWNER)  # contention: its lease is kept
        (lost_race,) = live_leases(etcd_server) - before - {key_lease(etcd_server, key)}
        assert backend.extend(key, mine, 20)  # another length: a new lease again
        held = key_lease(etcd_server, key)
        assert live_leases(etcd_server) - before == {lost_race, held}
        assert backend.release(key, mine)
        assert held in live_leases(etcd_server)  # a released key's lease is kept, as a spare of 20 s
        assert backend.acquire(key, other, 30, OWNER)  # on the spare of its length
        assert key_lease(etcd_server, key) == lost_race
        assert not backend.acquire(key, mine, 30, OWNER)  # a new grant, kept
        (again,) = live_leases(etcd_server) - before - {lost_race, held}
        assert backend.force_release(key)
        assert live_leases(etcd_server) - before == {held, again}  # the key's lease is revoked
    finally:
        backend.close()
    assert live_leases(etcd_server) - before == set()


class Counted(NamedTuple):
    """A backend whose requests are counted, and another backend to hold keys against it."""

    session: CountingSession
    backend: EtcdBackend
    holder: EtcdBackend


@pytest.fixture
def counted(etcd_server: EtcdCluster) -> Iterator[Counted]:
    session = CountingSession()
    backend = EtcdBackend(etcd_server.endpoints, session=session)
    holder = EtcdBackend(etcd_server.endpoints)
    yield Counted(session, backend, holder)
    backend.close()
    holder.close()


def test_a_refused_attempt_keeps_its_lease_and_the_next_renews_it_instead_of_a_grant(
    etcd_server: EtcdCluster, counted: Counted, key: str
) -> None:
    session, backend, holder = counted
    held, waiting = token(), token()
    assert holder.acquire(key, held, 30, OWNER)
    session.paths.clear()
    assert not backend.acquire(key, waiting, 30, OWNER)
    assert session.paths == ["/v3/lease/grant", "/v3/kv/txn"]  # no revoke
    session.paths.clear()
    assert not backend.acquire(key, waiting, 30, OWNER)
    assert session.paths == ["/v3/lease/keepalive", "/v3/kv/txn"]  # no grant, no revoke
    assert holder.release(key, held)
    session.paths.clear()
    assert backend.acquire_fenced(key, waiting, 30, OWNER) is not None
    assert session.paths == ["/v3/lease/keepalive", "/v3/kv/txn"]
    lease = key_lease(etcd_server, key)
    # Renewed to its whole length by that keep-alive, and held by the key.
    assert int(raw(etcd_server, "/v3/lease/timetolive", {"ID": lease})["TTL"]) > 25
    assert backend.release(key, waiting)


def kept_lease(cluster: EtcdCluster, backend: EtcdBackend, holder: EtcdBackend, key: str, ttl: float) -> str:
    """The lease ``backend`` keeps after an attempt on ``key`` that ``holder`` holds."""
    before = live_leases(cluster)
    assert holder.acquire(key, token(), 30, OWNER)
    held = key_lease(cluster, key)
    assert not backend.acquire(key, token(), ttl, OWNER)
    (kept,) = live_leases(cluster) - before - {held}
    assert holder.force_release(key)
    return kept


def test_a_kept_lease_that_ran_out_is_replaced_by_a_new_grant(
    etcd_server: EtcdCluster, counted: Counted, key: str
) -> None:
    session, backend, holder = counted
    kept = kept_lease(etcd_server, backend, holder, key, 30)
    raw(etcd_server, "/v3/lease/revoke", {"ID": kept})  # gone, as if it had run out
    session.paths.clear()
    mine = token()
    assert backend.acquire(key, mine, 30, OWNER)
    assert session.paths == ["/v3/lease/keepalive", "/v3/lease/grant", "/v3/kv/txn"]
    assert key_lease(etcd_server, key) != kept
    assert backend.release(key, mine)


def test_a_released_keys_lease_that_ran_out_as_a_spare_is_never_used_for_a_grant(
    etcd_server: EtcdCluster, counted: Counted, key: str
) -> None:
    session, backend, _holder = counted
    mine = token()
    assert backend.acquire(key, mine, 30, OWNER)
    spare = key_lease(etcd_server, key)
    assert backend.release(key, mine)
    raw(etcd_server, "/v3/lease/revoke", {"ID": spare})  # gone while kept, as if it had run out
    session.paths.clear()
    assert backend.acquire(f"{key}:next", mine, 30, OWNER)
    assert session.paths == ["/v3/lease/keepalive", "/v3/lease/grant", "/v3/kv/txn"]
    assert key_lease(etcd_server, f"{key}:next") != spare
    assert backend.release(f"{key}:next", mine)


def test_a_lease_kept_a_whole_length_is_not_renewed(etcd_server: EtcdCluster, counted: Counted, key: str) -> None:
    session, backend, holder = counted
    kept = kept_lease(etcd_server, backend, holder, key, 2)
    set_aside = time.monotonic()
    # Past its whole length since it was kept: it ran out (unless a leader change restarted
    # it), so no keep-alive is spent on it.
    assert wait_until(
        lambda: time.monotonic() - set_aside > 2.5 and kept not in live_leases(etcd_server), timeout=30
    )
    session.paths.clear()
    mine = token()
    assert backend.acquire(key, mine, 2, OWNER)
    assert session.paths == ["/v3/lease/grant", "/v3/kv/txn"]
    assert backend.release(key, mine)


# -- release -------------------------------------------------------------------------------------


def release_requests(session: CountingSession, backend: EtcdBackend, key: str, mine: str) -> list[str]:
    """The requests a successful release of ``key`` by ``mine`` sent."""
    session.paths.clear()
    assert backend.release(key, mine)
    return list(session.paths)


@pytest.mark.parametrize("moved", [False, True], ids=["its first lease", "moved to another length"])
def test_a_release_is_one_guarded_delete_and_the_next_lock_takes_its_lease_without_a_grant(
    etcd_server: EtcdCluster, counted: Counted, key: str, moved: bool
) -> None:
    session, backend, _holder = counted
    mine, next_one = token(), token()
    assert backend.acquire(key, mine, 30, OWNER)
    ttl = 30
    if moved:
        first = key_lease(etcd_server, key)
        assert backend.extend(key, mine, 20)  # the key goes on a new lease, the old is revoked
        assert first not in live_leases(etcd_server)
        ttl = 20
    lease = key_lease(etcd_server, key)
    assert release_requests(session, backend, key, mine) == ["/v3/kv/txn"]
    assert not raw(etcd_server, "/v3/kv/range", {"key": b64("lease_lock/" + key)}).get("kvs")
    assert not backend.release(key, mine)  # a second release finds nothing to end
    # The lease is kept for the next lock of its length: renewed, not granted.
    session.paths.clear()
    assert backend.acquire(f"{key}:next", next_one, ttl, OWNER)
    assert session.paths == ["/v3/lease/keepalive", "/v3/kv/txn"]
    assert key_lease(etcd_server, f"{key}:next") == lease
    assert int(raw(etcd_server, "/v3/lease/timetolive", {"ID": lease})["TTL"]) > ttl - 5
    assert backend.release(f"{key}:next", next_one)
    backend.close()
    assert lease not in live_leases(etcd_server)


@pytest.mark.parametrize("ended_by", ["force release", "lease ran out"])
def test_a_release_after_the_holding_ended_reports_it_and_leaves_the_next_holder_alone(
    etcd_server: EtcdCluster, counted: Counted, key: str, ended_by: str
) -> None:
    _session, backend, holder = counted
    mine, theirs = token(), token()
    assert backend.acquire(key, mine, 30, OWNER)
    if ended_by == "force release":
        assert holder.force_release(key)
    else:
        raw(etcd_server, "/v3/lease/revoke", {"ID": key_lease(etcd_server, key)})
    assert holder.acquire(key, theirs, 30, OWNER)
    assert not backend.release(key, mine)
    assert holder.is_held(key, theirs)
    assert holder.release(key, theirs)


def test_a_token_taken_by_another_backend_is_released_by_a_guarded_delete(
    etcd_server: EtcdCluster, counted: Counted, key: str
) -> None:
    session, backend, holder = counted
    theirs = token()
    assert holder.acquire(key, theirs, 30, OWNER)
    lease = key_lease(etcd_server, key)
    session.paths.clear()
    assert not backend.release(key, token())  # another token: nothing is deleted
    assert holder.is_held(key, theirs)
    assert backend.release(key, theirs)
    assert session.paths == ["/v3/kv/txn", "/v3/kv/txn", "/v3/lease/revoke"]
    assert lease not in live_leases(etcd_server)
    assert not holder.release(key, theirs)


def test_the_oldest_noted_holding_is_forgotten_beyond_the_bound(
    etcd_server: EtcdCluster, counted: Counted, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A lock taken and never released (a service's abandoned lease) must not grow the notes for
    # ever; a forgotten one is still released, by the guarded path.
    monkeypatch.setattr("lease_lock.backends.etcd._backend._HOLDINGS", 2)
    session, backend, _holder = counted
    mine = token()
    names = [f"{key}:{index}" for index in range(3)]
    for name in names:
        assert backend.acquire(name, mine, 30, OWNER)
    leases = [key_lease(etcd_server, name) for name in names]
    assert release_requests(session, backend, names[2], mine) == ["/v3/kv/txn"]
    assert release_requests(session, backend, names[0], mine) == ["/v3/kv/txn", "/v3/lease/revoke"]
    assert release_requests(session, backend, names[1], mine) == ["/v3/kv/txn"]
    # The forgotten holding's lease is revoked; the noted ones are kept as spares.
    assert live_leases(etcd_server) & set(leases) == {leases[1], leases[2]}
    assert not any(backend.inspect(name).held for name in names)


class HookedSession(requests.Session):
    """A session that runs ``hook`` once, right after its first request to ``path``."""

    def __init__(self, path: str, hook: Any) -> None:
        super().__init__()
        self.path = path
        self.hook = hook

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        response = super().send(request, **kwargs)
        if str(request.path_url) == self.path and self.hook is not None:
            hook, self.hook = self.hook, None
            hook()
        return response


def test_a_force_release_never_deletes_a_holder_that_came_after_it(etcd_server: EtcdCluster, key: str) -> None:
    holder = EtcdBackend(etcd_server.endpoints)
    mine, theirs = token(), token()

    def hand_over() -> None:
        assert holder.release(key, mine)
        assert holder.acquire(key, theirs, 30, OWNER)

    # Between the force release's read and its delete, the holder releases and another holder
    # takes the key: that newer holding stays.
    forcing = EtcdBackend(etcd_server.endpoints, session=HookedSession("/v3/kv/range", hand_over))
    try:
        assert holder.acquire(key, mine, 30, OWNER)
        assert forcing.force_release(key)
        assert holder.is_held(key, theirs)
        assert not holder.release(key, mine)
        assert holder.release(key, theirs)
    finally:
        forcing.close()
        holder.close()


def test_a_force_release_never_revokes_a_lease_its_holder_released_and_took_again(
    etcd_server: EtcdCluster, key: str
) -> None:
    # The holder keeps a released key's lease for its next lock: a force release that read the
    # key on that lease before the release must not revoke it (that would end the next lock).
    holder = EtcdBackend(etcd_server.endpoints)
    mine, next_one = token(), token()

    def release_and_take_another() -> None:
        assert holder.release(key, mine)
        assert holder.acquire(f"{key}:next", next_one, 30, OWNER)

    forcing = EtcdBackend(etcd_server.endpoints, session=HookedSession("/v3/kv/range", release_and_take_another))
    try:
        assert holder.acquire(key, mine, 30, OWNER)
        lease = key_lease(etcd_server, key)
        assert forcing.force_release(key)
        assert key_lease(etcd_server, f"{key}:next") == lease  # on the released key's lease
        assert lease in live_leases(etcd_server)
        assert holder.extend(f"{key}:next", next_one, 30)
        assert holder.release(f"{key}:next", next_one)
    finally:
        forcing.close()
        holder.close()


def test_a_force_release_revokes_the_lease_the_key_was_on_so_the_holder_learns_of_it(
    etcd_server: EtcdCluster, backend: EtcdBackend, key: str
) -> None:
    holder = EtcdBackend(etcd_server.endpoints)
    mine = token()
    try:
        assert holder.acquire(key, mine, 30, OWNER)
        lease = key_lease(etcd_server, key)
        assert backend.force_release(key)
        assert lease not in live_leases(etcd_server)
        assert not holder.extend(key, mine, 30)
        assert not holder.release(key, mine)
        # That lease is no spare: the holder's next lock is on a new one.
        assert holder.acquire(f"{key}:next", mine, 30, OWNER)
        assert key_lease(etcd_server, f"{key}:next") != lease
        assert holder.release(f"{key}:next", mine)
    finally:
        holder.close()


def test_a_force_release_deletes_a_key_on_no_lease(etcd_server: EtcdCluster, backend: EtcdBackend, key: str) -> None:
    # Written by hand, without a lease: the revoke has nothing to end, the delete does it.
    raw(etcd_server, "/v3/kv/put", {"key": b64("lease_lock/" + key), "value": b64(f"{token()}\x00{OWNER}")})
    assert backend.inspect(key).held
    assert backend.force_release(key)
    assert not backend.inspect(key).held
    assert not backend.force_release(key)


def test_extend_many_sends_one_transaction_and_one_keepalive_stream_per_hundred_keys(
    etcd_server: EtcdCluster, key: str
) -> None:
    session = CountingSession()
    backend = EtcdBackend(etcd_server.endpoints, session=session)
    try:
        mine = token()
        names = [f"{key}:{index}" for index in range(250)]
        for name in names:
            assert backend.acquire(name, mine, 30, OWNER)
        session.paths.clear()
        assert backend.extend_many([ExtendRequest(name, mine, 30) for name in names]) == [True] * 250
        # The gateway may cut a keep-alive stream's answers short; the rest go out again.
        assert session.paths.count("/v3/kv/txn") == 3
        assert 3 <= session.paths.count("/v3/lease/keepalive") < 250
        assert set(session.paths) == {"/v3/kv/txn", "/v3/lease/keepalive"}
        assert backend.extend_many([ExtendRequest(names[0], token(), 30)]) == [False]
    finally:
        backend.close()
    # The session was ours: the backend leaves it open.
    assert session.adapters


# -- URLs and construction ---------------------------------------------------------------------


def test_connect_builds_a_locker_on_etcd(etcd_cluster: EtcdCluster, key: str) -> None:
    with lease_lock.connect(etcd_cluster.url, fencing=True, ttl=5) as locker:
        assert isinstance(locker.backend, EtcdBackend)
        assert locker.backend.endpoints == etcd_cluster.endpoints
        with locker.lock(key) as lock:
            assert lock.fence is not None and locker.get(key).held
        assert not locker.get(key).held


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("etcd://127.0.0.1:99999", "bad port"),
        ("etcd://127.0.0.1:2379,:2379", "at least one host"),
        ("etcd://127.0.0.1:2379/prefix", "no path"),
        ("etcd://127.0.0.1:2379?colour=red", "unknown etcd URL option 'colour'"),
        ("etcd://127.0.0.1:2379?ca=/tmp/ca.pem", "etcds://"),
        ("etcds://127.0.0.1:2379?cert=/tmp/c.pem", "cert and key go together"),
        ("etcd://127.0.0.1:2379?timeout=0", "timeout"),
        ("etcd://root@127.0.0.1:2379", None),
    ],
)
def test_bad_urls_are_validation_errors(url: str, message: str) -> None:
    if message is None:
        # A user without a password is not an error of the URL: etcd allows empty passwords.
        backend_from_url(url).close()
        return
    with pytest.raises(ValidationError, match=message):
        backend_from_url(url)


def test_bad_constructor_arguments() -> None:
    with pytest.raises(ValidationError, match="endpoints"):
        EtcdBackend([])
    with pytest.raises(ValidationError, match="endpoints"):
        EtcdBackend("http://127.0.0.1:2379")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="endpoints"):
        EtcdBackend(["127.0.0.1:2379"])
    with pytest.raises(ValidationError, match="user and password"):
        EtcdBackend(["http://127.0.0.1:2379"], user="root")


def test_a_url_lists_every_member(etcd_cluster: EtcdCluster) -> None:
    backend = EtcdBackend.from_url(etcd_cluster.url.replace("127.0.0.1", "localhost", 1))
    try:
        assert backend.endpoints[0].startswith("http://localhost:")
        assert len(backend.endpoints) == 3
    finally:
        backend.close()


def test_a_callers_session_is_used_and_left_open(etcd_server: EtcdCluster, key: str) -> None:
    session = CountingSession()
    backend = EtcdBackend(etcd_server.endpoints, session=session)
    assert backend.acquire(key, token(), 30, OWNER)
    assert "/v3/kv/txn" in session.paths
    backend.close()
    assert backend.force_release(key) is True  # the session still works


def test_proxies_from_the_environment_are_honoured_and_read_once_per_member(
    etcd_server: EtcdCluster, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[str] = []
    merge = requests.Session.merge_environment_settings

    def counted(self: requests.Session, url: Any, *args: Any) -> Any:
        reads.append(str(url))
        return merge(self, url, *args)

    monkeypatch.setattr(requests.Session, "merge_environment_settings", counted)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    for name in ("HTTP_PROXY", "http_proxy"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{free_port()}")  # a proxy nobody runs
    through_proxy = EtcdBackend(etcd_server.endpoints, timeout=1)
    try:
        with pytest.raises(BackendUnavailableError):
            through_proxy.inspect(key)
    finally:
        through_proxy.close()
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.setenv(name, "127.0.0.1")
    del reads[:]
    backend = EtcdBackend(etcd_server.endpoints)
    try:
        mine = token()
        assert backend.acquire(key, mine, 30, OWNER)
        assert backend.inspect(key).held
        assert backend.release(key, mine)
        # Six requests, one reading of the environment.
        assert reads == etcd_server.endpoints
    finally:
        backend.close()


# -- failover and outages ----------------------------------------------------------------------


def test_a_dead_endpoint_is_passed_over(etcd_server: EtcdCluster, key: str) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    backend = EtcdBackend([dead, *etcd_server.endpoints], timeout=2)
    try:
        for _ in range(4):  # whichever member a client starts on
            mine = token()
            assert backend.acquire(key, mine, 30, OWNER)
            assert backend.release(key, mine)
    finally:
        backend.close()


@pytest.mark.parametrize("given_session", [False, True], ids=["own connections", "caller's session"])
def test_an_unreachable_cluster_is_backend_unavailable(key: str, given_session: bool) -> None:
    endpoints = [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"]
    backend = EtcdBackend(endpoints, session=requests.Session() if given_session else None)
    try:
        with pytest.raises(BackendUnavailableError) as caught:
            backend.acquire(key, token(), 30, OWNER)
        # The driver's error: requests' through a session, http.client's (an OSError) without.
        assert isinstance(caught.value.__cause__, requests.ConnectionError if given_session else ConnectionRefusedError)
        assert caught.value.backend == "etcd"
        with pytest.raises(BackendUnavailableError):
            backend.inspect(key)
    finally:
        backend.close()


# -- auth and TLS ------------------------------------------------------------------------------


def enable_auth(cluster: EtcdCluster, password: str) -> None:
    raw(cluster, "/v3/auth/user/add", {"name": "root", "password": password})
    raw(cluster, "/v3/auth/user/grant", {"user": "root", "role": "root"})
    raw(cluster, "/v3/auth/enable", {})


def test_auth_with_a_token_that_is_renewed(etcd_factory: EtcdFactory, key: str) -> None:
    cluster = etcd_factory.cluster(members=1, extra_args=("--auth-token", "simple", "--auth-token-ttl", "1"))
    try:
        enable_auth(cluster, "s3cret/!")
        anonymous = EtcdBackend(cluster.endpoints)
        with pytest.raises(EtcdError):
            anonymous.acquire(key, token(), 30, OWNER)
        anonymous.close()
        session = CountingSession()
        url = cluster.url.replace("etcd://", "etcd://root:s3cret%2F%21@")
        backend = EtcdBackend.from_url(url)
        backend.close()
        backend = EtcdBackend(cluster.endpoints, session=session, user="root", password="s3cret/!")  # noqa: S106 - a test cluster's
        mine = token()
        assert backend.acquire(key, mine, 30, OWNER)
        assert session.paths.count("/v3/auth/authenticate") == 1
        # etcd forgets a simple token after --auth-token-ttl of disuse; the backend gets a new one.
        # (Each check is a use, so the checks are further apart than that.)
        assert wait_until(
            lambda: backend.is_held(key, mine) and session.paths.count("/v3/auth/authenticate") > 1, 30, interval=3
        )
        assert backend.release(key, mine)
        backend.close()
        wrong = EtcdBackend(cluster.endpoints, user="root", password="wrong")  # noqa: S106 - a wrong one on purpose
        with pytest.raises(EtcdError, match="authentication failed"):
            wrong.acquire(key, token(), 30, OWNER)
        wrong.close()
    finally:
        cluster.close()


def test_tls_with_client_certificates(etcd_factory: EtcdFactory, key: str) -> None:
    cluster = etcd_factory.cluster(members=1, tls=True)
    try:
        tls = cluster.tls
        url = f"{cluster.url}?ca={tls['ca']}&cert={tls['cert']}&key={tls['key']}"
        with lease_lock.connect(url, ttl=5) as locker, locker.lock(key):
            assert locker.get(key).held
        without_certificate = EtcdBackend.from_url(f"{cluster.url}?ca={tls['ca']}")
        with pytest.raises(BackendUnavailableError):
            without_certificate.inspect(key)
        without_certificate.close()
    finally:
        cluster.close()


# -- hand-off ------------------------------------------------------------------------------------


def test_a_waiter_is_woken_through_its_one_watch_stream(
    etcd_server: EtcdCluster, key: str
) -> None:
    holder = lease_lock.connect(etcd_server.url, ttl=30)
    session = CountingSession()
    woken: list[str] = []
    backend = EtcdBackend(etcd_server.endpoints, session=session)
    note_taken_wakes(backend, woken.append)
    # The retry delay bounds every wait; one this long leaves the waiter only the release's wake
    # and the core's own look once a second.
    waiter = lease_lock.Locker(backend, ttl=30, retry=lease_lock.Retry(delay=600))
    try:
        lock = holder.acquire(key)
        got = threading.Event()
        others = [f"{key}:{index}" for index in range(3)]
        # Kept: a lock dropped while held is given back by the heartbeat thread when it gets
        # to it, a real release that wakes that key's waiter, before or after ``key``'s.
        kept = [holder.acquire(other) for other in others]

        def wait(name: str) -> None:
            with waiter.lock(name, timeout=1200):
                if name == key:
                    got.set()

        # ``key``'s waiter last, so that the release comes as soon after its queueing as can be:
        # a waiter also looks once a second on its own, and that look must not come first.
        threads = [threading.Thread(target=wait, args=(name,)) for name in [*others, key]]
        for thread in threads:
            thread.start()
        # Every waiter queued (each queue has its entry). Counting transactions instead is
        # met too early: the watch stream's own reads count as well, and a release before
        # ``key``'s waiter queued is one it takes on its own, without a wake.
        assert wait_until(lambda: all(queue_entries(etcd_server, name) for name in [key, *others]), 30)
        lock.release()
        assert got.wait(60)
        # The release of ``key`` woke its waiter here, and nothing else woke anyone.
        assert woken == [key]
        for other in kept:
            other.release()
        for thread in threads:
            thread.join(60)
        # Four keys waited for, one watch stream (it never dropped here).
        assert session.paths.count("/v3/watch") == 1
    finally:
        holder.close()
        waiter.close()
        waiter.backend.close()


def test_a_release_during_a_dropped_watch_stream_is_still_delivered(etcd_server: EtcdCluster, key: str) -> None:
    member = etcd_server.members[0]
    proxy = TcpProxy("127.0.0.1", member.client_port)
    watching = EtcdBackend([f"http://127.0.0.1:{proxy.port}"])
    writer = EtcdBackend(etcd_server.endpoints)
    heard: list[str] = []
    mine = token()
    try:
        assert writer.acquire(key, mine, 30, OWNER)
        watcher = watching.watch_releases(heard.append)
        assert wait_until(lambda: watcher.active, 30)
        proxy.stall()
        assert writer.release(key, mine)  # its event is held by the proxy, then dropped
        assert proxy.cut() > 0
        proxy.resume()
        # The new stream starts from the revision after the last one the old stream showed.
        assert wait_until(lambda: key in heard, 30)
        watcher.close()
    finally:
        watching.close()
        writer.close()
        proxy.close()


# -- fork ----------------------------------------------------------------------------------------


def test_a_forked_child_never_attaches_a_key_to_the_parents_kept_lease(etcd_server: EtcdCluster, key: str) -> None:
    backend = EtcdBackend.from_url(etcd_server.url)
    holder = EtcdBackend(etcd_server.endpoints)
    try:
        kept = kept_lease(etcd_server, backend, holder, key, 30)

        def child(index: int) -> int:
            name = f"{key}:child{index}"
            theirs = token()
            if not backend.acquire(name, theirs, 30, OWNER):
                return 2
            # Both processes attaching keys to one lease would let each one's revoke or
            # keep-alive decide the other's key.
            shared = key_lease(etcd_server, name) == kept
            backend.release(name, theirs)
            return 1 if shared else 0

        assert exit_codes(fork_children(2, child)) == [0, 0]
        mine = token()
        assert backend.acquire(key, mine, 30, OWNER)
        assert key_lease(etcd_server, key) == kept  # the parent still has it
        assert backend.release(key, mine)
    finally:
        backend.close()
        holder.close()


def test_forked_children_use_a_session_of_their_own(etcd_server: EtcdCluster, key: str) -> None:
    backend = EtcdBackend.from_url(etcd_server.url)
    # What a child must not reuse: the parent's pooled connections live in its session.
    parent_session = backend._client.session

    def child_cycles(index: int) -> int:
        if backend._client.session is parent_session:
            return 1
        wrong = 0
        for cycle in range(20):
            mine = token()
            name = f"{key}:child{index}:{cycle}"
            wrong += not backend.acquire(name, mine, 30, OWNER)
            wrong += not backend.release(name, mine)
        return wrong

    try:
        check_forked_children_beside_the_parent(backend, child_cycles, token())
    finally:
        backend.close()


def test_a_call_that_failed_over_leaves_nothing_for_the_cyclic_collector(etcd_server: EtcdCluster, key: str) -> None:
    # The member that could not serve gave an error the failover loop kept: it must not stay in
    # a reference cycle with the loop's frame (see tests/support/cycles.py). urllib3 keeps its
    # own connection error in a cycle of its own frames (a local of ``urlopen``, urllib3 2.x):
    # that one is upstream's, and only the cyclic collector frees it.
    dead = f"http://127.0.0.1:{free_port()}"
    backend = EtcdBackend([dead, *etcd_server.endpoints], timeout=5)
    mine = token()
    try:
        backend._client._current = 0  # the member nobody answers on is tried first
        left = errors_left_in_cycles(lambda: backend.acquire(key, mine, 30, OWNER))
        assert [error for error in left if isinstance(error, requests.RequestException)] == []
        assert backend._client.order()[0] != dead  # the call did fail over
        assert backend.release(key, mine)
    finally:
        backend.close()
