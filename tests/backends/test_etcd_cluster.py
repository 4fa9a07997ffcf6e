"""The etcd backend on three-member clusters through failures: exclusion, leader kills, lost
quorum, full restarts, a killed holder and a stalled member."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import lease_lock
import pytest
import requests
from lease_lock import BackendUnavailableError, LockEvent
from lease_lock.backends.etcd import EtcdBackend
from lease_lock.testing import wait_until

from tests.support.children import exit_codes, fork_children
from tests.support.etcd_server import EtcdCluster


@pytest.fixture
def key() -> str:
    return f"etcd-cluster:{uuid.uuid4().hex}"


def critical_section(counter: Path, fences: Path, fence: int) -> None:
    """A read-modify-write of a file that loses an update whenever two holders overlap."""
    value = int(counter.read_text() or "0")
    time.sleep(0.002)
    counter.write_text(str(value + 1))
    with open(fences, "a") as log:
        log.write(f"{fence}\n")


def check_exclusion(counter: Path, fences: Path, cycles: int) -> None:
    assert int(counter.read_text()) == cycles
    seen = [int(line) for line in fences.read_text().split()]
    assert len(seen) == cycles
    assert all(earlier < later for earlier, later in zip(seen, seen[1:]))


def test_threads_take_turns_with_rising_fences(etcd_cluster: EtcdCluster, key: str, tmp_path: Path) -> None:
    counter, fences = tmp_path / "counter", tmp_path / "fences"
    counter.write_text("0")
    fences.write_text("")
    lockers = [lease_lock.connect(etcd_cluster.url, fencing=True, ttl=10) for _ in range(3)]
    errors: list[BaseException] = []

    def work(locker: lease_lock.Locker) -> None:
        try:
            for _ in range(6):
                with locker.lock(key, timeout=60) as lock:
                    assert lock.fence is not None
                    critical_section(counter, fences, lock.fence)
        except BaseException as error:  # noqa: BLE001 - handed to the test thread
            errors.append(error)

    threads = [threading.Thread(target=work, args=(locker,)) for locker in lockers for _ in range(2)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    finally:
        for locker in lockers:
            locker.close()
    assert not errors
    check_exclusion(counter, fences, 36)


def test_processes_take_turns_with_rising_fences(etcd_cluster: EtcdCluster, key: str, tmp_path: Path) -> None:
    counter, fences = tmp_path / "counter", tmp_path / "fences"
    counter.write_text("0")
    fences.write_text("")

    def take_turns(_index: int) -> int:
        with lease_lock.connect(etcd_cluster.url, fencing=True, ttl=10) as locker:
            for _ in range(8):
                with locker.lock(key, timeout=60) as lock:
                    assert lock.fence is not None
                    critical_section(counter, fences, lock.fence)
        return 0

    children = fork_children(3, take_turns, failed=1)
    assert exit_codes(children, timeout=120) == [0, 0, 0]
    check_exclusion(counter, fences, 24)


def test_a_held_lock_rides_out_a_leader_kill(private_etcd_cluster: EtcdCluster, key: str) -> None:
    cluster = private_etcd_cluster
    lost: list[LockEvent] = []
    def on_event(event: LockEvent) -> None:
        if event.type == "lost":
            lost.append(event)

    with lease_lock.connect(cluster.url, fencing=True, ttl=5, on_event=on_event) as locker:
        lock = locker.acquire(key)
        before = lock.fence
        assert before is not None
        leader = cluster.leader()
        leader.kill()
        survivors = [member for member in cluster.members if member is not leader]
        new_leader = cluster.leader()
        assert new_leader in survivors
        # Hold on well past a whole ttl after the election: the heartbeat must keep the lease.
        assert not lock.lost.wait(8)
        assert not lost and lock.is_held()
        assert locker.backend.is_held(key, lock.token)
        lock.release()
        with locker.lock(key) as again:
            assert again.fence is not None and again.fence > before


def test_lost_quorum_grants_nothing_and_the_holder_reads_lost(private_etcd_cluster: EtcdCluster, key: str) -> None:
    cluster = private_etcd_cluster
    url = cluster.url + "?timeout=0.5"
    holder = lease_lock.connect(url, ttl=4)
    other = lease_lock.connect(url, ttl=4)
    try:
        lock = holder.acquire(key)
        paused = cluster.members[:2]
        for member in paused:
            member.pause()
        try:
            # The lock's own clock says it is lost once its ttl from the last extension has gone
            # by (the member left alone may be the leader, which renews leases without its quorum
            # until it steps down): no grant from a minority keeps it.
            assert lock.lost.wait(30)
            for name in (key, f"{key}:free"):
                with pytest.raises(BackendUnavailableError):
                    other.acquire(name, blocking=False)
        finally:
            for member in paused:
                member.resume()
        cluster.wait_serving()

        def serves() -> bool:
            try:
                return other.acquire(f"{key}:after", blocking=False).release()
            except BackendUnavailableError:
                return False

        assert wait_until(serves, 60, interval=0.2)
    finally:
        holder.close()
        other.close()


def test_fences_keep_growing_across_a_full_restart(private_etcd_cluster: EtcdCluster, key: str) -> None:
    cluster = private_etcd_cluster
    backend = EtcdBackend.from_url(cluster.url)
    try:
        token = uuid.uuid4().hex
        first = backend.acquire_fenced(key, token, 30, "test")
        assert first is not None and backend.release(key, token)
        cluster.restart()
        second = wait_until(lambda: _try_fence(backend, key), 60)
        assert second
        assert backend.inspect(key).fence is not None
        fence = backend.inspect(key).fence
        assert fence is not None and fence > first
    finally:
        backend.close()


def _try_fence(backend: EtcdBackend, key: str) -> bool:
    try:
        return backend.acquire_fenced(key, uuid.uuid4().hex, 30, "test") is not None
    except BackendUnavailableError:
        return False


HOLDER = """
import sys, time
import lease_lock

url, key, beats = sys.argv[1:]


def record(event):
    # When the store last granted or renewed the lease, on this machine's monotonic clock.
    if event.type in ("acquired", "extended"):
        with open(beats, "a") as log:
            log.write(f"{time.monotonic()}\\n")


locker = lease_lock.connect(url, ttl=3, on_event=record)
lock = locker.acquire(key)  # kept: a dropped Lock lets its lease go
time.sleep(600)
"""


def test_a_killed_holders_key_is_taken_after_its_ttl_never_before(
    etcd_cluster: EtcdCluster, key: str, tmp_path: Path
) -> None:
    ttl = 3
    beats = tmp_path / "beats"
    beats.write_text("")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, etcd_cluster.url, key, str(beats)])
    try:
        # Held, and renewed at least once by the heartbeat before the crash.
        assert wait_until(lambda: len(beats.read_text().split()) >= 2, 60)
    finally:
        holder.kill()
        holder.wait(30)
    killed = time.monotonic()
    last_beat = max(float(line) for line in beats.read_text().split())
    taker = EtcdBackend.from_url(etcd_cluster.url)
    try:
        token = uuid.uuid4().hex
        assert wait_until(lambda: taker.acquire(key, token, 30, "taker"), 30, interval=0.05)
        taken = time.monotonic()
    finally:
        taker.close()
    # Never before the last renewal's lease ran out (less the time its answer took to arrive).
    assert taken - last_beat >= ttl - 0.5
    assert taken - killed <= ttl + 10


class RecordingSession(requests.Session):
    """Remembers which member each request went to."""

    def __init__(self) -> None:
        super().__init__()
        self.hosts: list[str] = []

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        self.hosts.append(str(request.url).split("/v3/")[0])
        return super().send(request, **kwargs)


def test_the_heartbeat_leaves_a_stalled_member_at_once(private_etcd_cluster: EtcdCluster, key: str) -> None:
    cluster = private_etcd_cluster
    leader = cluster.leader()
    followers = [member for member in cluster.members if member is not leader]
    session = RecordingSession()
    # A client starts on a member chosen at random: order the list so that it starts on a
    # follower (pausing the leader would stall every member through an election as well).
    backend = EtcdBackend(cluster.endpoints, session=session, timeout=0.5)
    backend.inspect(key)
    while session.hosts[-1] == leader.endpoint:
        backend.close()
        session = RecordingSession()
        backend = EtcdBackend(cluster.endpoints, session=session, timeout=0.5)
        backend.inspect(key)
    stalled = next(member for member in followers if member.endpoint == session.hosts[-1])
    locker = lease_lock.Locker(backend, ttl=3)
    try:
        lock = locker.acquire(key)
        stalled.pause()
        try:
            # Two whole ttls: a heartbeat stuck on the stalled member would lose the lease.
            assert not lock.lost.wait(6)
            assert lock.is_held()
            assert any(host != stalled.endpoint for host in session.hosts[-5:])
        finally:
            stalled.resume()
        lock.release()
    finally:
        locker.close()
        backend.close()


def test_the_watch_moves_to_another_member_when_its_member_dies(
    private_etcd_cluster: EtcdCluster, key: str
) -> None:
    cluster = private_etcd_cluster
    session = RecordingSession()
    watching = EtcdBackend(cluster.endpoints, session=session)
    writer = EtcdBackend(cluster.endpoints)
    heard: list[str] = []
    token = uuid.uuid4().hex
    assert writer.acquire(key, token, 30, "test")
    watcher = watching.watch_releases(heard.append)
    try:
        assert wait_until(lambda: watcher.active, 30)
        watched = next(member for member in cluster.members if member.endpoint == session.hosts[-1])
        watched.kill()
        assert wait_until(lambda: _released(writer, key, token), 60, interval=0.2)
        assert wait_until(lambda: key in heard, 60)
        assert wait_until(lambda: watcher.active, 30)
        assert session.hosts[-1] != watched.endpoint
    finally:
        watcher.close()
        watching.close()
        writer.close()


def _released(backend: EtcdBackend, key: str, token: str) -> bool:
    try:
        return backend.release(key, token)
    except BackendUnavailableError:
        return False
