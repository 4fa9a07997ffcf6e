"""Wake-one hand-off on etcd: a release wakes the process first in the key's queue, not the herd.

Each watcher (or Locker) here has a backend of its own, so it stands for one process: its own
session, lease, watch stream and threads. The SIGKILL test runs a real child process.
"""

from __future__ import annotations

import base64
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import requests
from benchmarks.chaos_harness.proxy import TcpProxy
from lease_lock import Locker, Retry
from lease_lock.backends.etcd import READY_MARGIN, EtcdBackend
from lease_lock.backends.handoff import HandoffSource, HandoffWatcher
from lease_lock.testing import wait_until

from tests.support.etcd_server import EtcdCluster, EtcdFactory, queue_entries
from tests.support.handoff import WakeCounter, hand_key_round, note_taken_wakes

TOKEN = "t" * 32
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def key() -> str:
    return f"etcd-handoff:{uuid.uuid4().hex}"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@contextmanager
def queued(cluster: EtcdCluster, key: str, callbacks: list[Any]) -> Iterator[list[HandoffWatcher]]:
    """One backend and watcher per callback, queued for ``key`` in that order (each ``want``
    returns once its entry is in etcd); all closed at the end."""
    backends = [EtcdBackend.from_url(cluster.url) for _ in callbacks]
    watchers = [backend.watch_handoffs(callback) for backend, callback in zip(backends, callbacks)]
    try:
        assert wait_until(lambda: all(watcher.active for watcher in watchers), 30)
        for watcher in watchers:
            watcher.want(key)
        yield watchers
    finally:
        for watcher in watchers:
            watcher.close()
        for backend in backends:
            backend.close()


@pytest.fixture
def holder(etcd_backend: EtcdBackend) -> EtcdBackend:
    return etcd_backend


def test_etcd_backend_offers_wake_one_hand_off(holder: EtcdBackend) -> None:
    assert isinstance(holder, HandoffSource) and holder.handoff_ready


def test_want_reads_the_lease_left(etcd_server: EtcdCluster, holder: EtcdBackend, key: str) -> None:
    with queued(etcd_server, key, [WakeCounter()]) as (watcher,):
        watcher.unwant(key)
        assert watcher.want(key) == 0.0  # free: a release before queueing is not missed
        assert watcher.want(key) is None  # queued already: nothing asked
        other = f"{key}:held"
        assert holder.acquire(other, TOKEN, 30, "holder")
        left = watcher.want(other)
        assert left is not None and 0 < left <= 30


def test_each_release_wakes_only_the_process_first_in_line(
    etcd_server: EtcdCluster, holder: EtcdBackend, key: str
) -> None:
    assert holder.acquire(key, TOKEN, 30, "holder")
    counters = [WakeCounter() for _ in range(4)]
    with queued(etcd_server, key, counters) as watchers:
        assert len(queue_entries(etcd_server, key)) == 4
        assert holder.release(key, TOKEN)
        assert wait_until(lambda: counters[0].calls == [key], 30)
        # Its process still waits (its waiter lost, say): it stays first, and the next release
        # wakes it again, nobody else.
        assert holder.acquire(key, TOKEN, 30, "holder")
        assert holder.release(key, TOKEN)
        assert wait_until(lambda: len(counters[0].calls) == 2, 30)
        # Each process that leaves while the key is free passes the turn on, in queue order.
        for index in range(3):
            watchers[index].unwant(key)
            assert wait_until(lambda index=index: counters[index + 1].calls == [key], 30)
        # Each watcher was woken only after it had read every event before its turn, so a wake
        # out of turn would be counted here.
        assert [len(counter.calls) for counter in counters] == [2, 1, 1, 1]


def test_a_wake_nobody_here_wants_moves_the_process_to_the_back(
    etcd_server: EtcdCluster, holder: EtcdBackend, key: str
) -> None:
    refusing, taking = WakeCounter(answer=False), WakeCounter()
    assert holder.acquire(key, TOKEN, 30, "holder")
    with queued(etcd_server, key, [refusing, taking]):
        first = queue_entries(etcd_server, key)[0]["key"]
        assert holder.release(key, TOKEN)
        assert wait_until(lambda: taking.calls == [key], 30)
        assert refusing.calls == [key]
        entries = queue_entries(etcd_server, key)
        assert len(entries) == 2 and first not in [entry["key"] for entry in entries]


def test_the_grant_to_a_queued_process_takes_its_entry_out_in_the_same_transaction(
    etcd_server: EtcdCluster, key: str
) -> None:
    backend = EtcdBackend.from_url(etcd_server.url)
    watcher = backend.watch_handoffs(WakeCounter())
    try:
        assert watcher.want(key) == 0.0
        assert len(queue_entries(etcd_server, key)) == 1
        assert backend.acquire(key, TOKEN, 30, "queued waiter")
        # Gone as the key was taken: the next entry was first at once, no write of its own.
        assert queue_entries(etcd_server, key) == []
        # Still waited for here (another thread, say): queued again, at the back.
        assert wait_until(lambda: len(queue_entries(etcd_server, key)) == 1, 30)
        watcher.unwant(key)
        assert wait_until(lambda: queue_entries(etcd_server, key) == [], 30)
        assert backend.release(key, TOKEN)
    finally:
        watcher.close()
        backend.close()


def test_a_process_whose_queue_lease_ran_out_queues_again(
    etcd_server: EtcdCluster, holder: EtcdBackend, key: str
) -> None:
    # As after a pause longer than the queue lease: etcd drops the lease and the entries on it.
    # The next keep-alive finds it gone, and the process queues again, at the back.
    assert holder.acquire(key, TOKEN, 30, "holder")
    counter = WakeCounter()
    with queued(etcd_server, key, [counter]):
        (entry,) = queue_entries(etcd_server, key)
        revoked = requests.post(
            etcd_server.endpoints[0] + "/v3/lease/revoke", json={"ID": entry["lease"]}, timeout=10
        )
        assert revoked.status_code == 200 and queue_entries(etcd_server, key) == []
        assert wait_until(lambda: len(queue_entries(etcd_server, key)) == 1, 30)
        (again,) = queue_entries(etcd_server, key)
        assert again["key"] != entry["key"] and again["lease"] != entry["lease"]
        # And it is woken as the first in line again.
        assert holder.release(key, TOKEN)
        assert wait_until(lambda: counter.calls == [key], 30)


def test_queue_entries_are_no_locks_and_go_with_their_watcher(
    etcd_server: EtcdCluster, holder: EtcdBackend, key: str
) -> None:
    assert holder.acquire(key, TOKEN, 30, "holder")
    with queued(etcd_server, key, [WakeCounter(), WakeCounter()]):
        assert len(queue_entries(etcd_server, key)) == 2
        assert [state.key for state in holder.scan(key)] == [key]
        assert all("\x00" not in state.key for state in holder.scan(""))
    # Closing a watcher revokes its lease, and its entries go with it.
    assert queue_entries(etcd_server, key) == []
    assert holder.release(key, TOKEN)


def test_lockers_hand_a_key_round_without_losing_a_release(etcd_server: EtcdCluster, key: str) -> None:
    lockers = [Locker(EtcdBackend.from_url(etcd_server.url), ttl=30, owns_backend=True) for _ in range(4)]
    hand_key_round(lockers, key, rounds=10)


def test_one_release_wakes_one_waiting_locker_and_every_one_gets_the_key(
    etcd_server: EtcdCluster, holder: EtcdBackend, key: str
) -> None:
    # Four lockers wait for the key, each taking it once; every release wakes one of them (the
    # holder's and the first three waiters'), never every waiting one (no broadcast is heard).
    wakes: list[str] = []
    broadcasts: list[object] = []
    backends = [EtcdBackend.from_url(etcd_server.url) for _ in range(4)]
    for backend in backends:
        note_taken_wakes(backend, wakes.append)
        backend.watch_releases = broadcasts.append  # type: ignore[method-assign,assignment]
    # A retry delay this long leaves a waiter only the wake and the holder's lease end.
    lockers = [Locker(backend, ttl=30, retry=Retry(delay=600)) for backend in backends]
    order: list[int] = []
    errors: list[BaseException] = []

    def wait(index: int) -> None:
        try:
            with lockers[index].lock(key, timeout=120):
                order.append(index)
        except BaseException as error:  # noqa: BLE001 - handed to the test thread
            errors.append(error)

    assert holder.acquire(key, TOKEN, 30, "holder")
    threads = [threading.Thread(target=wait, args=(index,)) for index in range(4)]
    try:
        for thread in threads:
            thread.start()
        assert wait_until(lambda: len(queue_entries(etcd_server, key)) == 4, 60)
        assert holder.release(key, TOKEN)
        for thread in threads:
            thread.join(120)
        assert errors == [] and sorted(order) == [0, 1, 2, 3]
        assert wakes == [key] * 4
        assert broadcasts == []
    finally:
        for locker in lockers:
            locker.close()
            locker.backend.close()


def test_a_waiter_killed_while_first_in_line_holds_the_others_back_only_until_its_lease_ends(
    etcd_server: EtcdCluster, holder: EtcdBackend, key: str
) -> None:
    assert holder.acquire(key, TOKEN, 30, "holder")
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.support.etcd_waiter", etcd_server.url, key],
        stdout=subprocess.PIPE, text=True, cwd=str(ROOT),
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "queued"
        second = WakeCounter()
        with queued(etcd_server, key, [second]):
            assert len(queue_entries(etcd_server, key)) == 2
            assert holder.release(key, TOKEN)
            # The child is first: the release wakes it, and it takes the wake but never acts.
            assert child.stdout.readline().split() == ["woken", key]
            child.kill()
            child.wait(30)
            # Its keep-alives stopped: once its lease runs out its entry goes, and the turn with it.
            assert wait_until(lambda: second.calls == [key], 60)
            assert len(queue_entries(etcd_server, key)) == 1
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(30)
        if child.stdout is not None:
            child.stdout.close()


def test_a_stream_that_cannot_resume_reads_the_queue_again(etcd_factory: EtcdFactory, key: str) -> None:
    # The watcher's stream stalls through a release, and etcd compacts the revisions it would
    # resume from: the new stream starts from now, after reading the queue and the key again,
    # and the release it missed is due at once.
    cluster = etcd_factory.cluster(members=1)
    proxy = TcpProxy("127.0.0.1", cluster.members[0].client_port)
    watching = EtcdBackend([f"http://127.0.0.1:{proxy.port}"])
    writer = EtcdBackend(cluster.endpoints)
    counter = WakeCounter()
    try:
        assert writer.acquire(key, TOKEN, 30, "holder")
        watcher = watching.watch_handoffs(counter)
        assert wait_until(lambda: watcher.active, 30)
        watcher.want(key)
        proxy.stall()
        assert writer.release(key, TOKEN)
        # A later write, so that the compaction takes the release's revision too (etcd keeps
        # the revision it compacts at).
        assert writer.acquire(f"{key}:later", TOKEN, 30, "holder")
        revision = requests.post(cluster.endpoints[0] + "/v3/kv/range", json={"key": _b64(b"x")}, timeout=10).json()
        compacted = requests.post(
            cluster.endpoints[0] + "/v3/kv/compaction", json={"revision": revision["header"]["revision"]}, timeout=10
        )
        assert compacted.status_code == 200
        assert proxy.cut() > 0
        proxy.resume()
        assert wait_until(lambda: counter.calls == [key], 30)
        watcher.close()
    finally:
        watching.close()
        writer.close()
        proxy.close()


class ThreadSession(requests.Session):
    """A session that remembers which thread sent each request, and to which path."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[str, str]] = []

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        # Noted once answered, so that a grant seen here has its lease ID back already.
        response = super().send(request, **kwargs)
        self.sent.append((threading.current_thread().name, str(request.path_url)))
        return response

    def paths(self, thread: str) -> list[str]:
        return [path for name, path in self.sent if name == thread]


def lease_ids(cluster: EtcdCluster) -> set[str]:
    """Every lease etcd has now, read by hand."""
    answer = requests.post(cluster.endpoints[0] + "/v3/lease/leases", json={}, timeout=10).json()
    return {str(item["ID"]) for item in answer.get("leases", [])}


def key_lease_ttl(cluster: EtcdCluster, key: str) -> int:
    """The seconds etcd has left of the lease ``key`` is on."""
    kvs = requests.post(
        cluster.endpoints[0] + "/v3/kv/range", json={"key": _b64(b"lease_lock/" + key.encode())}, timeout=10
    ).json()["kvs"]
    answer = requests.post(cluster.endpoints[0] + "/v3/lease/timetolive", json={"ID": kvs[0]["lease"]}, timeout=10)
    return int(answer.json()["TTL"])


def test_a_woken_attempt_takes_a_lease_kept_ready_instead_of_granting_one(
    etcd_server: EtcdCluster, holder: EtcdBackend, key: str
) -> None:
    session = ThreadSession()
    waiter = Locker(EtcdBackend(etcd_server.endpoints, session=session), ttl=30, retry=Retry(delay=600), fencing=True)
    assert holder.acquire(key, TOKEN, 30, "holder")
    first = holder.inspect(key).fence
    assert first is not None
    got: list[Any] = []

    def wait() -> None:
        got.append(waiter.acquire(key, timeout=120))

    thread = threading.Thread(target=wait, name="the-waiter")
    try:
        thread.start()
        # Queued (its queueing ends with reading the holder's lease), and the watcher's helper
        # granted a lease for the woken attempt.
        assert wait_until(lambda: "/v3/lease/timetolive" in session.paths("the-waiter"), 30)
        assert wait_until(lambda: "/v3/lease/grant" in session.paths("lease-lock-etcd-queue"), 30)
        released = len(session.sent)
        assert holder.release(key, TOKEN)
        thread.join(60)
        assert len(got) == 1 and got[0].fence > first
        # The woken attempt sent its transaction alone: no lease grant before it.
        after = [path for name, path in session.sent[released:] if name == "the-waiter"]
        assert after and set(after) == {"/v3/kv/txn"}
        # etcd runs the key's lease at least the TTL the waiter judges its own from.
        assert 30 <= key_lease_ttl(etcd_server, key) <= 32
        got[0].release()
    finally:
        thread.join(60)
        waiter.close()
        waiter.backend.close()


def test_a_lost_attempt_keeps_its_ready_lease_and_close_revokes_it(
    etcd_server: EtcdCluster, holder: EtcdBackend, key: str
) -> None:
    session = ThreadSession()
    backend = EtcdBackend(etcd_server.endpoints, session=session)
    watcher = backend.watch_handoffs(WakeCounter())
    me = threading.current_thread().name
    try:
        assert holder.acquire(key, TOKEN, 30, "holder")
        before = lease_ids(etcd_server)
        # Not queued yet: a grant and the transaction; the lease, attached to nothing, is kept
        # by the backend for a later attempt (no revoke).
        assert not backend.acquire(key, "w" * 32, 30, "waiter")
        assert session.paths(me) == ["/v3/lease/grant", "/v3/kv/txn"]
        watcher.want(key)

        def attempt() -> list[str]:
            del session.sent[:]
            assert not backend.acquire(key, "w" * 32, 30, "waiter")
            return session.paths(me)

        # Queued, and once the helper made a lease ready, each attempt is its transaction
        # alone, and a lost one revokes nothing: the lease stays ready for the next.
        assert wait_until(lambda: attempt() == ["/v3/kv/txn"], 30)
        ready = lease_ids(etcd_server) - before
        assert len(ready) == 3  # the queue's lease, the one kept ready, the backend's spare
        assert attempt() == ["/v3/kv/txn"]
        assert attempt() == ["/v3/kv/txn"]
        assert lease_ids(etcd_server) >= ready
        watcher.close()
        assert len(ready & lease_ids(etcd_server)) == 1  # the spare, until the backend closes
        backend.close()
        assert not ready & lease_ids(etcd_server)
    finally:
        watcher.close()
        backend.close()
        holder.release(key, TOKEN)


def test_a_ready_lease_past_its_margin_is_not_handed_out(
    etcd_server: EtcdCluster, holder: EtcdBackend, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = ThreadSession()
    backend = EtcdBackend(etcd_server.endpoints, session=session)
    watcher = backend.watch_handoffs(WakeCounter())
    me = threading.current_thread()
    try:
        assert holder.acquire(key, TOKEN, 30, "holder")
        watcher.want(key)
        assert not backend.acquire(key, "w" * 32, 30, "waiter")
        assert wait_until(lambda: "/v3/lease/grant" in session.paths("lease-lock-etcd-queue"), 30)
        assert holder.release(key, TOKEN)
        real = time.monotonic
        # This thread's clock only runs past the margin: the lease was last found alive longer
        # ago than etcd's extra seconds cover, so the attempt brings a lease of its own (the
        # one its refused attempt left unattached, renewed by a keep-alive).
        late = READY_MARGIN + 0.5
        monkeypatch.setattr(time, "monotonic", lambda: real() + (late if threading.current_thread() is me else 0))
        del session.sent[:]
        assert backend.acquire(key, "w" * 32, 30, "waiter")
        monkeypatch.undo()
        assert session.paths(me.name) == ["/v3/lease/keepalive", "/v3/kv/txn"]
        assert 29 <= key_lease_ttl(etcd_server, key) <= 30
        assert backend.release(key, "w" * 32)
    finally:
        monkeypatch.undo()
        watcher.close()
        backend.close()
