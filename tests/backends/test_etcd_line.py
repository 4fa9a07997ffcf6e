"""Direct hand-off on etcd (``direct_handoff``): a release puts the key on the oldest waiter's
claim lease in the same transaction, and the waiter holds it without a request of its own.

Each Locker or backend here stands for one process (its own session, watch stream and leases);
the SIGKILL and SIGSTOP tests run real child processes.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Optional

import lease_lock
import pytest
import requests
from benchmarks.chaos_harness.proxy import TcpProxy
from lease_lock import BackendUnavailableError, Lock, Locker, Retry, ValidationError
from lease_lock.backends import backend_from_url
from lease_lock.backends.base import CALL_MARGIN, LineGrant, WaitingLine
from lease_lock.backends.etcd import EtcdBackend
from lease_lock.testing import BackendContract, wait_until

from tests.support.answer_proxy import AnswerDroppingProxy
from tests.support.etcd_server import CountingSession, EtcdCluster, line_places

ROOT = Path(__file__).resolve().parents[2]
HOLDER = "h" * 32


@pytest.fixture
def key() -> str:
    return f"etcd-line:{uuid.uuid4().hex}"


def direct(cluster: EtcdCluster) -> EtcdBackend:
    return EtcdBackend.from_url(cluster.url + "?direct_handoff=true")


@pytest.fixture
def holder(etcd_server: EtcdCluster) -> Iterator[EtcdBackend]:
    backend = direct(etcd_server)
    yield backend
    backend.close()


def _range(cluster: EtcdCluster, start: bytes, end: Optional[bytes] = None) -> list[dict[str, Any]]:
    body = {"key": base64.b64encode(start).decode()}
    if end is not None:
        body["range_end"] = base64.b64encode(end).decode()
    answer = requests.post(cluster.endpoints[0] + "/v3/kv/range", json=body, timeout=10).json()
    return sorted(answer.get("kvs", []), key=lambda kv: int(kv["create_revision"]))


def stored_value(cluster: EtcdCluster, key: str) -> Optional[bytes]:
    kvs = _range(cluster, b"lease_lock/" + key.encode())
    return base64.b64decode(kvs[0]["value"]) if kvs else None


def _take_in_thread(locker: Locker, key: str, timeout: float) -> tuple[threading.Thread, list[Any]]:
    """Acquire ``key`` on a thread; the list gets the Lock (or the error) when it returns."""
    return _take_in_thread_with(locker, key, timeout=timeout)


def _take_in_thread_with(locker: Locker, key: str, **options: Any) -> tuple[threading.Thread, list[Any]]:
    """Acquire ``key`` with ``options`` on a thread; the list gets the Lock (or the error)."""
    outcome: list[Any] = []

    def take() -> None:
        try:
            outcome.append(locker.acquire(key, **options))
        except BaseException as error:  # noqa: BLE001 - handed to the test thread
            outcome.append(error)

    thread = threading.Thread(target=take, daemon=True)
    thread.start()
    return thread, outcome


def test_direct_handoff_is_off_unless_asked_for_and_checked(etcd_server: EtcdCluster, plain: EtcdBackend) -> None:
    assert plain.direct_handoff is False
    assert not _direct(plain.join_line("k", "t" * 32, 5.0, "o", True, time.monotonic))
    with pytest.raises(ValidationError, match="direct_handoff"):
        backend_from_url(etcd_server.url + "?direct_handoff=maybe")
    with pytest.raises(ValidationError, match="direct_handoff"):
        EtcdBackend(etcd_server.endpoints, direct_handoff="yes")  # type: ignore[arg-type]


def test_a_release_hands_the_key_to_the_waiter_in_line_with_the_next_fence(
    etcd_server: EtcdCluster, holder: EtcdBackend, key: str
) -> None:
    fence = holder.acquire_fenced(key, HOLDER, 30, "holder")
    assert fence is not None
    with Locker(direct(etcd_server), ttl=5, fencing=True, owner="waiter", owns_backend=True) as waiter:
        thread, outcome = _take_in_thread(waiter, key, 60)
        assert wait_until(lambda: len(line_places(etcd_server, key)) == 1, 30)
        assert holder.release(key, HOLDER)
        thread.join(60)
        lock = outcome[0]
        assert isinstance(lock, Lock), outcome
        # Handed over, not taken: a key created again would have a far larger revision.
        assert lock.fence == fence + 1
        assert line_places(etcd_server, key) == []
        state = holder.inspect(key)
        assert state.held and state.owner == "waiter" and state.fence == fence + 1
        value = stored_value(etcd_server, key)
        assert value is not None and value.endswith(b"\x00waiter\x00%d" % (fence + 1))
        # The heartbeat turns the claim into a full lease; the key stays the waiter's.
        assert wait_until(lambda: (holder.inspect(key).expires_in or 0) >= 4, 30)
        assert lock.is_held() and lock.fence == holder.inspect(key).fence
        lock.release()
    # A grant that creates the key again gets a larger fence still.
    later = holder.acquire_fenced(key, "n" * 32, 30, "later")
    assert later is not None and later > fence + 1
    assert holder.release(key, "n" * 32)


def test_a_re_acquire_of_a_handed_key_keeps_its_fence(etcd_server: EtcdCluster, holder: EtcdBackend, key: str) -> None:
    fence = holder.acquire_fenced(key, HOLDER, 30, "holder")
    assert fence is not None
    backend = direct(etcd_server)
    try:
        line = backend.join_line(key, "w" * 32, 5.0, "waiter", True, time.monotonic)
        assert line is not None
        assert line.ask() is None
        assert holder.release(key, HOLDER)
        grant = line.wait(30)
        assert grant is not None and grant.claimed and grant.fence == fence + 1
        line.leave(True)
        assert backend.acquire_fenced(key, "w" * 32, 5, "waiter") == fence + 1
        assert backend.extend(key, "w" * 32, 8)
        assert backend.inspect(key).fence == fence + 1
        assert backend.release(key, "w" * 32)
    finally:
        backend.close()


@pytest.fixture
def in_line(etcd_server: EtcdCluster) -> Iterator[Callable[[str, int], list[WaitingLine]]]:
    """``in_line(key, count)``: ``count`` waiters with a place in ``key``'s line, in that order,
    each with a backend of its own (closed at the end); waiter ``i``'s token is 32 times ``i``."""
    backends: list[EtcdBackend] = []

    def join(key: str, count: int) -> list[WaitingLine]:
        lines = []
        for index in range(count):
            backends.append(direct(etcd_server))
            line = backends[-1].join_line(key, f"{index}" * 32, 5.0, f"waiter-{index}", True, time.monotonic)
            assert line is not None and line.ask() is None
            lines.append(line)
        assert len(line_places(etcd_server, key)) == count
        return lines

    yield join
    for backend in backends:
        backend.close()


@pytest.fixture
def plain(etcd_backend: EtcdBackend) -> EtcdBackend:
    """A backend without ``direct_handoff`` (a process of an older release)."""
    return etcd_backend


def _caught_up(cluster: EtcdCluster, backend: EtcdBackend) -> None:
    """Return once ``backend``'s line watcher has read every event of etcd up to now (starting
    it if need be): a thread of ``backend`` waits in line for a fresh key that another process
    holds, and that key's release, a later event than any before this call, reaches it."""
    other = EtcdBackend.from_url(cluster.url)
    barrier = f"barrier:{uuid.uuid4().hex}"
    try:
        assert other.acquire(barrier, "b" * 32, 30, "barrier")
        line = backend.join_line(barrier, "w" * 32, 5.0, "barrier", True, time.monotonic)
        assert line is not None and line.ask() is None
        assert other.release(barrier, "b" * 32)
        assert line.wait(30) is not None
        line.leave(True)
        assert backend.release(barrier, "w" * 32)
    finally:
        other.close()


def test_a_release_of_a_key_whose_line_this_backend_follows_hands_over_without_a_read(
    etcd_server: EtcdCluster, in_line: Callable[[str, int], list[WaitingLine]], key: str
) -> None:
    session = CountingSession()
    holder = EtcdBackend(etcd_server.endpoints, session=session, direct_handoff=True)
    try:
        _caught_up(etcd_server, holder)
        fence = holder.acquire_fenced(key, HOLDER, 30, "holder")
        assert fence is not None
        lines = in_line(key, 1)
        _caught_up(etcd_server, holder)
        del session.paths[:]
        assert holder.release(key, HOLDER)
        # One transaction that hands the key over, then the revoke of the old lease: no read.
        assert session.paths == ["/v3/kv/txn", "/v3/lease/revoke"]
        grant = lines[0].wait(30)
        assert grant is not None and grant.claimed and grant.fence == fence + 1
        lines[0].leave(True)
        # The uncontended release: the watcher knows the line is empty, and one guarded delete
        # ends it.
        assert holder.acquire(key + ":alone", HOLDER, 30, "holder")
        del session.paths[:]
        assert holder.release(key + ":alone", HOLDER)
        assert session.paths == ["/v3/kv/txn"]
    finally:
        holder.close()


def test_a_token_that_takes_a_key_again_after_losing_it_hands_on_its_new_fence(
    etcd_server: EtcdCluster, holder: EtcdBackend, in_line: Callable[[str, int], list[WaitingLine]], key: str
) -> None:
    _caught_up(etcd_server, holder)
    first = holder.acquire_fenced(key, HOLDER, 30, "holder")
    assert first is not None
    # Lost (force-released), then taken again by the same token: the key is created again.
    assert holder.force_release(key)
    again = holder.acquire_fenced(key, HOLDER, 30, "holder")
    assert again is not None and again > first
    lines = in_line(key, 1)
    _caught_up(etcd_server, holder)
    assert holder.release(key, HOLDER)
    grant = lines[0].wait(30)
    assert grant is not None and grant.fence == again + 1
    lines[0].leave(True)


def test_a_waiter_that_leaves_after_the_grant_passes_the_key_to_the_next_place(
    etcd_server: EtcdCluster, holder: EtcdBackend, in_line: Callable[[str, int], list[WaitingLine]], key: str
) -> None:
    fence = holder.acquire_fenced(key, HOLDER, 30, "holder")
    assert fence is not None
    lines = in_line(key, 2)
    assert holder.release(key, HOLDER)
    assert holder.inspect(key).owner == "waiter-0"
    # The first waiter gave up (timed out, cancelled) before it saw the grant.
    lines[0].leave(False)
    grant = lines[1].wait(30)
    assert isinstance(grant, LineGrant) and grant.claimed and grant.fence == fence + 2
    lines[1].leave(True)
    assert holder.inspect(key).owner == "waiter-1"
    assert line_places(etcd_server, key) == []
    assert holder.release(key, "1" * 32)  # any process may release by the token
    assert not holder.inspect(key).held


def test_a_waiter_asks_at_once_when_the_key_goes_free_without_a_hand_off(
    plain: EtcdBackend, in_line: Callable[[str, int], list[WaitingLine]], key: str
) -> None:
    # A holder without direct_handoff (an older process) deletes the key: the waiter in line
    # hears the delete and takes the key itself, long before its next refresh.
    assert plain.acquire(key, HOLDER, 30, "old")
    lines = in_line(key, 1)
    assert plain.release(key, HOLDER)
    grant = lines[0].wait(30)
    assert grant is not None and not grant.claimed
    lines[0].leave(True)
    assert plain.inspect(key).owner == "waiter-0"


def test_a_release_racing_a_waiters_timeout_never_leaves_the_key_held_by_nobody(
    etcd_server: EtcdCluster, holder: EtcdBackend, key: str
) -> None:
    with Locker(direct(etcd_server), ttl=5, owns_backend=True) as waiter:
        for round_ in range(12):
            token = f"{round_:02d}" * 16
            assert holder.acquire(key, token, 30, "holder")
            thread, outcome = _take_in_thread(waiter, key, 0.4)
            # Release at about the moment the waiter gives up.
            time.sleep(0.3 + 0.02 * round_)
            assert holder.release(key, token)
            thread.join(30)
            if isinstance(outcome[0], Lock):
                outcome[0].release()
            # Either way nobody keeps the key: free at once, or as soon as the waiter lets go.
            assert wait_until(lambda: not holder.inspect(key).held, 10)


_CHILD = """
import sys
from lease_lock import Locker
from lease_lock.backends.etcd import EtcdBackend
locker = Locker(EtcdBackend.from_url(sys.argv[1] + "?direct_handoff=true"), ttl=2, owner="child")
print("waiting", flush=True)
with locker.lock(sys.argv[2], timeout=120):
    print("held", flush=True)
    sys.stdin.readline()
"""


class _ThreadRecordingSession(requests.Session):
    """A session that notes which thread sent each request, and its path."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[int, str]] = []

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        self.sent.append((threading.get_ident(), str(request.path_url)))
        return super().send(request, **kwargs)


def test_leaving_the_line_of_a_silent_store_holds_the_waiter_up_no_further(
    etcd_server: EtcdCluster, holder: EtcdBackend, key: str
) -> None:
    # Once a request of the waiter's went unanswered, leaving the line sends nothing more from
    # the waiter's thread (each request would hold it a request timeout past its wait); its
    # place and claim go in the background, or lapse with the claim lease.
    assert holder.acquire(key, HOLDER, 30, "holder")
    proxy = TcpProxy("127.0.0.1", etcd_server.members[0].client_port)
    session = _ThreadRecordingSession()
    backend = EtcdBackend([f"http://127.0.0.1:{proxy.port}"], session=session, direct_handoff=True, timeout=1)
    try:
        line = backend.join_line(key, "w" * 32, 5.0, "waiter", True, time.monotonic)
        assert line is not None and line.ask() is None
        assert len(line_places(etcd_server, key)) == 1
        proxy.stall()
        with pytest.raises(BackendUnavailableError):
            line.ask()
        before = len(session.sent)
        line.leave(False)
        me = threading.get_ident()
        assert [path for thread, path in session.sent[before:] if thread == me] == []
        proxy.resume()
        assert wait_until(lambda: line_places(etcd_server, key) == [], 30)
    finally:
        proxy.resume()
        backend.close()
        proxy.close()
        holder.release(key, HOLDER)


class _TimeoutRecordingSession(requests.Session):
    """A session that notes the path and the timeout of each request."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[str, Any]] = []

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        self.sent.append((str(request.path_url), kwargs.get("timeout")))
        return super().send(request, **kwargs)


def test_a_refresh_inside_a_wait_ends_with_the_wait(etcd_server: EtcdCluster, holder: EtcdBackend, key: str) -> None:
    # A wait refreshes its place (a 2 s claim: every half second); each of those requests must
    # end by the wait's end, not after a request timeout per member of a silent cluster.
    assert holder.acquire(key, HOLDER, 30, "holder")
    session = _TimeoutRecordingSession()
    backend = EtcdBackend(etcd_server.endpoints, session=session, direct_handoff=True, timeout=10)
    try:
        line = backend.join_line(key, "w" * 32, 2.0, "waiter", True, time.monotonic)
        assert line is not None and line.ask() is None
        before = len(session.sent)
        assert line.wait(1.5) is None
        refreshes = session.sent[before:]
        assert {path for path, _timeout in refreshes} >= {"/v3/lease/keepalive", "/v3/kv/txn"}
        # The wait's time left, or the least a request is given (a busy host's margin).
        assert all(
            isinstance(timeout, float) and timeout <= max(1.5, CALL_MARGIN) for _path, timeout in refreshes
        ), refreshes
        line.leave(False)
    finally:
        backend.close()
        holder.release(key, HOLDER)


def _key_lease(cluster: EtcdCluster, key: str) -> Optional[str]:
    kvs = _range(cluster, b"lease_lock/" + key.encode())
    return str(kvs[0]["lease"]) if kvs else None


def test_a_waiter_that_quits_after_a_lost_answer_leaves_its_key_on_no_spare_lease(
    etcd_server: EtcdCluster, holder: EtcdBackend, key: str
) -> None:
    # The waiter's take of the freed key commits, its answer is lost and the store is out of
    # reach until the waiter gave up: the key it took unknowingly must lapse within one ttl,
    # never ride on the lease of the process's next lock.
    proxy = AnswerDroppingProxy("127.0.0.1", etcd_server.members[0].client_port)
    waiting = lease_lock.connect(f"etcd://127.0.0.1:{proxy.port}?direct_handoff=true", ttl=6)
    try:
        assert holder.acquire(key, HOLDER, 30, "holder")
        thread, outcome = _take_in_thread_with(waiting, key, timeout=4, retry=Retry(delay=60))
        assert wait_until(lambda: len(line_places(etcd_server, key)) == 1, 30)
        # The take's answer: a refresh of the place before the release answers "not succeeded".
        proxy.drop_next_answer(b"POST /v3/kv/txn", b'"succeeded":true')
        plain_release = EtcdBackend(etcd_server.endpoints)  # no hand-over: the key goes free
        try:
            assert plain_release.release(key, HOLDER)
        finally:
            plain_release.close()
        assert proxy.dropped.wait(30)
        # Read at once: the take committed before its answer was dropped, and its lease may run
        # out while the waiter, on a loaded machine, takes its time to give up.
        value = stored_value(etcd_server, key)
        assert value is not None and not value.startswith(HOLDER.encode()), value  # the lost take committed
        thread.join(60)
        assert outcome and not isinstance(outcome[0], Lock), outcome
        proxy.up()
        with waiting.lock(f"{key}:next"):
            taken = _key_lease(etcd_server, key)
            assert taken is None or taken != _key_lease(etcd_server, f"{key}:next")
            # Nothing renews the lost take's lease: it lapses within one ttl.
            assert wait_until(lambda: _key_lease(etcd_server, key) is None, 6 + 10)
    finally:
        waiting.close()
        proxy.close()


@contextmanager
def _child_in_line(cluster: EtcdCluster, key: str) -> Iterator[subprocess.Popen[str]]:
    """A child process whose Locker waits in ``key``'s line (its place is in etcd when this
    yields); killed at the end if it still runs."""
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, cluster.url, key],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=str(ROOT),
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "waiting"
        assert wait_until(lambda: len(line_places(cluster, key)) == 1, 30)
        yield child
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(30)
        for stream in (child.stdin, child.stdout):
            if stream is not None:
                stream.close()


def test_a_key_handed_to_a_killed_waiter_frees_when_its_claim_lease_ends(
    etcd_server: EtcdCluster, holder: EtcdBackend, key: str
) -> None:
    assert holder.acquire(key, HOLDER, 30, "holder")
    with _child_in_line(etcd_server, key) as child:
        child.kill()
        child.wait(30)
        # Its place is still fresh: the release hands the key to the dead waiter.
        assert holder.release(key, HOLDER)
        assert holder.inspect(key).owner == "child"
        # Nobody renews the claim lease (2 s): etcd frees the key, and another process takes it.
        assert wait_until(lambda: holder.acquire(key, "n" * 32, 30, "next"), 15)
        assert holder.release(key, "n" * 32)


def test_a_waiter_stopped_past_its_claim_window_does_not_keep_the_key(
    etcd_server: EtcdCluster, holder: EtcdBackend, key: str
) -> None:
    assert holder.acquire(key, HOLDER, 30, "holder")
    with _child_in_line(etcd_server, key) as child:
        os.kill(child.pid, signal.SIGSTOP)
        try:
            assert holder.release(key, HOLDER)
            # Handed to the stopped waiter; its claim lease ends, and the key goes to another.
            assert wait_until(lambda: holder.acquire(key, "n" * 32, 30, "next"), 15)
        finally:
            os.kill(child.pid, signal.SIGCONT)
        # The resumed waiter finds its grant came too late: it neither takes the key from the
        # new holder nor holds it until the key is released again, and then it does. The
        # hand-off used up its place in the line; back in the line, it has looked.
        assert wait_until(lambda: len(line_places(etcd_server, key)) == 1, 30)
        assert holder.inspect(key).owner == "next"
        assert holder.release(key, "n" * 32)
        assert child.stdout is not None and child.stdout.readline().strip() == "held"
        assert holder.inspect(key).owner == "child"
        assert child.stdin is not None
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.wait(30) == 0
        assert wait_until(lambda: not holder.inspect(key).held, 10)


def test_lockers_hand_a_key_round_by_direct_grants(etcd_server: EtcdCluster, key: str) -> None:
    lockers = [Locker(direct(etcd_server), ttl=5, fencing=True) for _ in range(4)]
    fences: list[int] = []
    fences_mutex = threading.Lock()
    errors: list[BaseException] = []

    def work(locker: Locker) -> None:
        try:
            for _ in range(8):
                with locker.lock(key, timeout=60) as lock, fences_mutex:
                    assert lock.fence is not None
                    fences.append(lock.fence)
        except BaseException as error:  # noqa: BLE001 - handed to the test thread
            errors.append(error)

    threads = [threading.Thread(target=work, args=(locker,)) for locker in lockers]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert errors == []
        assert len(fences) == 32 and fences == sorted(fences) and len(set(fences)) == 32
    finally:
        for locker in lockers:
            locker.close()
            locker.backend.close()


class TestEtcdDirectHandoff(BackendContract):
    @pytest.fixture
    def backend(self, etcd_server: EtcdCluster) -> Iterator[EtcdBackend]:
        backend = direct(etcd_server)
        yield backend
        backend.close()


def _direct(line: Optional[WaitingLine]) -> bool:
    """Whether ``line`` is a direct one (a release hands it the key in the store's step); an
    announced line offered instead is left at once."""
    if line is None:
        return False
    line.leave(False)
    return line.direct
