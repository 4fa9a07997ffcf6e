"""Waiting without polling: the ``Prefer: wait=N`` extension on real servers, and the client."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest
import requests
from lease_lock import Locker, LockHeldError, Retry
from lease_lock.backends.http import LINE_WAITERS, HttpBackend
from lease_lock.backends.memory import MemoryBackend
from lease_lock.server import LockServiceApp, create_app
from lease_lock.testing import wait_until

from tests.support.http_server import (
    ThreadedServer,
    make_keys,
    start_serve,
    stop_serve,
    waiting_acquisition_then_leave,
)


class Recorder:
    """WSGI middleware noting method, path and ``Prefer`` of every request, and the status of
    every answer (in ``answered``, in the order the answers were made)."""

    def __init__(self, app: Callable[..., Any]) -> None:
        self.app = app
        self.seen: list[tuple[str, str, str]] = []
        self.answered: list[tuple[str, str, str, str]] = []

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        request = (environ["REQUEST_METHOD"], environ["PATH_INFO"], environ.get("HTTP_PREFER", ""))
        self.seen.append(request)

        def note(status: str, headers: Any, *args: Any) -> Any:
            self.answered.append((*request, status))
            return start_response(status, headers, *args)

        return self.app(environ, note)


def _session(key: str) -> requests.Session:
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {key}"
    return session


def _acquire(session: requests.Session, url: str, key: str, token: str, **headers: str) -> requests.Response:
    return session.post(
        f"{url}/locks/{key}/lease",
        json={"ttl_seconds": 30},
        headers={"X-Volcano-Lock-Token": token, **headers},
        timeout=60,
    )


def _answer_after_release(
    app: LockServiceApp, url: str, holder: requests.Session, key: str, token: str, ask: Callable[[], requests.Response]
) -> requests.Response:
    """Send ``ask()`` on a thread, wait until the server holds it, release ``key`` (held by
    ``holder`` with ``token``) and return the held request's answer."""
    answers: list[requests.Response] = []
    thread = threading.Thread(target=lambda: answers.append(ask()))
    thread.start()
    assert wait_until(lambda: app.waits is not None and app.waits.waiting == 1, 20)
    released = holder.delete(f"{url}/locks/{key}/lease", headers={"X-Volcano-Lock-Token": token}, timeout=10)
    assert released.status_code == 204
    thread.join(30)
    [answer] = answers
    return answer


@contextlib.contextmanager
def _budgeted(
    tmp_path: Path, rate_limit: int
) -> Iterator[tuple[LockServiceApp, str, requests.Session, requests.Session]]:
    """A service with ``rate_limit`` requests per budget for the whole test, and two sessions of
    project alpha: the holder's and the waiter's."""
    keys_file = tmp_path / "keys.toml"
    keys = make_keys(keys_file)
    app = create_app(MemoryBackend(), keys_file, rate_limit=rate_limit, rate_window=3600, max_waits=2)
    with ThreadedServer(app) as server, _session(keys["alpha"]) as holder, _session(keys["alpha"]) as waiter:
        yield app, server.url, holder, waiter
    app.close()


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[tuple[LockServiceApp, Recorder, str, dict[str, str]]]:
    keys_file = tmp_path / "keys.toml"
    keys = make_keys(keys_file)
    app = create_app(MemoryBackend(), keys_file, rate_limit=1000, max_waits=4)
    recorder = Recorder(app)
    with ThreadedServer(recorder) as server:
        yield app, recorder, server.url, keys
    app.close()


def test_a_held_read_waits_for_the_release_and_counts_once(tmp_path: Path) -> None:
    with _budgeted(tmp_path, rate_limit=2) as (app, url, holder, reader):
        token = str(uuid.uuid4())
        assert _acquire(holder, url, "k", token).headers["X-Lease-Lock-Wait"] == "30"
        read = f"{url}/locks/k"
        answer = _answer_after_release(
            app, url, holder, "k", token, lambda: reader.get(read, headers={"Prefer": "wait=20"}, timeout=60)
        )
        assert answer.status_code == 200 and answer.json() == {"held": False}
        assert answer.headers["Preference-Applied"] == "wait=20"
        # One request for the read budget (2 per window), however often the store was read.
        assert reader.get(read, timeout=10).status_code == 200
        assert reader.get(read, timeout=10).status_code == 429


def test_an_acquisition_may_wait_for_the_key(rig: Any) -> None:
    app, _recorder, url, keys = rig
    with _session(keys["alpha"]) as first, _session(keys["alpha"]) as second:
        token = str(uuid.uuid4())
        assert _acquire(first, url, "job", token).status_code == 201
        answer = _answer_after_release(
            app, url, first, "job", token, lambda: _acquire(second, url, "job", str(uuid.uuid4()), Prefer="wait=20")
        )
        assert answer.status_code == 201 and answer.headers["Preference-Applied"] == "wait=20"


def test_a_waiting_acquisition_is_granted_when_the_key_is_released_and_counts_once(tmp_path: Path) -> None:
    # Three acquisitions per window for the project: the holder's, the waiter's, one more.
    with _budgeted(tmp_path, rate_limit=3) as (app, url, holder, waiter):
        token = str(uuid.uuid4())
        assert _acquire(holder, url, "k", token).status_code == 201
        answer = _answer_after_release(
            app, url, holder, "k", token,
            lambda: _acquire(waiter, url, "k", str(uuid.uuid4()), Prefer="wait=20"),
        )
        assert answer.status_code == 201 and answer.headers["Preference-Applied"] == "wait=20"
        # How long the server held it before the grant: never more than the whole request took.
        assert 0 <= float(answer.headers["X-Lease-Lock-Waited"]) <= answer.elapsed.total_seconds()
        # One request for the acquire budget, however often the grant was tried.
        assert _acquire(holder, url, "other", str(uuid.uuid4())).status_code == 201
        assert _acquire(holder, url, "third", str(uuid.uuid4())).status_code == 429


def test_waits_are_capped_per_process_and_the_server_keeps_answering(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.toml"
    keys = make_keys(keys_file)
    # 8 threads: at most 4 requests wait at once.
    process, url, _log = start_serve(
        tmp_path, "memory://", keys_file, "--threads", "8", "--rate-limit", "100000", module="lease_lock"
    )
    try:
        with _session(keys["alpha"]) as holder:
            token = str(uuid.uuid4())
            assert _acquire(holder, url, "capped", token).status_code == 201
            answers: list[requests.Response] = []
            lock = threading.Lock()

            def wait_for_it() -> None:
                with _session(keys["alpha"]) as session:
                    answer = session.get(f"{url}/locks/capped", headers={"Prefer": "wait=30"}, timeout=90)
                with lock:
                    answers.append(answer)

            waiters = [threading.Thread(target=wait_for_it) for _ in range(20)]
            for thread in waiters:
                thread.start()
            # 16 are answered at once (held, without the preference); 4 wait.
            assert wait_until(lambda: len(answers) == 16, 60)
            assert all(a.json()["held"] and "Preference-Applied" not in a.headers for a in answers)
            # The waiters hold 4 of the 8 threads: plain requests are still answered.
            for _ in range(10):
                assert holder.get(f"{url}/locks/other", timeout=10).status_code == 200
            holder.delete(f"{url}/locks/capped/lease", headers={"X-Volcano-Lock-Token": token}, timeout=10)
            for thread in waiters:
                thread.join(60)
            waited = answers[16:]
            assert len(waited) == 4
            assert all(a.json() == {"held": False} and a.headers["Preference-Applied"] == "wait=30" for a in waited)
    finally:
        stop_serve(process)


def _locker(url: str, key: str, **options: Any) -> Locker:
    return Locker(HttpBackend(url, key), ttl=5, **options)


def _watching_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "lease-lock-http-watch"]


def _held_acquisitions(recorder: Recorder, path: str) -> list[str]:
    """The waits of acquisitions a waiting thread sent itself: its pause, under a second."""
    sent = [(method, seen, prefer) for method, seen, prefer in recorder.seen if method == "POST" and seen == path]
    return [prefer for _method, _path, prefer in sent if prefer.startswith("wait=0.")]


def test_a_waiting_locker_is_granted_by_its_own_waiting_acquisition(rig: Any) -> None:
    # Alone, the waiting thread sends its acquisition with Prefer: wait for the pause it would
    # sleep (to the millisecond), and the release is that request's grant: no watching thread
    # and no wake-up from another thread in between.
    _app, recorder, url, keys = rig
    holder, waiter = _locker(url, keys["alpha"]), _locker(url, keys["alpha"], retry=Retry(delay=0.5, timeout=60))
    lease = "/locks/handoff/lease"
    try:
        held = holder.acquire("handoff", ttl=30)
        got: list[Any] = []
        thread = threading.Thread(target=lambda: got.append(waiter.acquire("handoff")))
        thread.start()
        assert wait_until(lambda: _held_acquisitions(recorder, lease), 20)
        assert not _watching_threads()
        posts_before = sum(1 for method, path, _p in recorder.seen if method == "POST" and path == lease)
        held.release()
        thread.join(30)
        assert len(got) == 1 and got[0].state == "held"
        # The server granted the key in the waiting acquisition itself.
        [(_m, _p, prefer, _s)] = [answer for answer in recorder.answered if answer[3] == "201 Created"][1:]
        assert prefer.startswith("wait=0.")
        assert not any(prefer for _m, path, prefer in recorder.seen if path == "/locks/handoff")
        assert not _watching_threads()
        got[0].release()
        assert posts_before < 20
    finally:
        holder.close()
        waiter.close()


def test_a_thread_waiting_on_its_own_acquisition_sends_one_request_per_pause(rig: Any) -> None:
    # Each held acquisition is an attempt (the server tries the grant as the wait ends), so no
    # plain attempt follows it: one request per retry delay, as when the thread slept instead.
    _app, recorder, url, keys = rig
    holder, waiter = _locker(url, keys["alpha"]), _locker(url, keys["alpha"], retry=Retry(delay=0.25))
    lease = "/locks/paced/lease"
    try:
        held = holder.acquire("paced", ttl=30)
        with pytest.raises(LockHeldError) as refused:
            waiter.acquire("paced", timeout=1.0)
        sent = [prefer for method, path, prefer in recorder.seen if (method, path) == ("POST", lease)]
        # The holder's grant, the waiter's first attempt, then one held acquisition per pause.
        assert sent[:2] == ["", ""] and all(prefer.startswith("wait=0.") for prefer in sent[2:])
        # Every held acquisition answers the attempt after it, but the last: the timeout ends the
        # wait with no attempt after it (and the wait cut by the timeout may be too short to send).
        attempts = refused.value.attempts
        assert attempts <= len(sent) - 1 <= attempts + 1 and attempts <= 5
        held.release()
    finally:
        holder.close()
        waiter.close()


class OlderServer(Recorder):
    """A :class:`Recorder` in front of a server that announces waits in whole seconds only (no
    ``X-Lease-Lock-Wait-Step``): one from before fractional waits."""

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        def whole_seconds(status: str, headers: Any, *args: Any) -> Any:
            kept = [(name, value) for name, value in headers if name.lower() != "x-lease-lock-wait-step"]
            return start_response(status, kept, *args)

        return super().__call__(environ, whole_seconds)


def test_with_an_older_server_a_watching_request_grants_the_waiting_locker(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.toml"
    keys = make_keys(keys_file)
    app = create_app(MemoryBackend(), keys_file, rate_limit=1000, max_waits=4)
    recorder = OlderServer(app)
    lease = "/locks/handoff/lease"
    with ThreadedServer(recorder) as server:
        holder = _locker(server.url, keys["alpha"])
        waiter = _locker(server.url, keys["alpha"], retry=Retry(delay=0.02, timeout=60))
        try:
            held = holder.acquire("handoff", ttl=30)
            got: list[Any] = []
            thread = threading.Thread(target=lambda: got.append(waiter.acquire("handoff")))
            thread.start()
            # The waiter's refused acquisition is repeated as a waiting one (never as a waiting read).
            assert wait_until(lambda: ("POST", lease, "wait=5") in recorder.seen, 20)
            posts_before = sum(1 for method, path, _p in recorder.seen if method == "POST" and path == lease)
            held.release()
            thread.join(30)
            assert len(got) == 1 and got[0].state == "held"
            # The server granted the key in the watching request, and the waiter took that grant.
            assert ("POST", lease, "wait=5", "201 Created") in recorder.answered
            assert all(prefer in ("", "wait=5") for _m, _p, prefer in recorder.seen)
            got[0].release()
            # Polling every 20 ms for the whole wait would have sent hundreds of attempts.
            assert posts_before < 20
        finally:
            holder.close()
            waiter.close()
    app.close()


def test_waiters_beyond_the_bound_of_held_acquisitions_are_woken_by_the_watcher(rig: Any) -> None:
    _app, recorder, url, keys = rig
    holder = _locker(url, keys["alpha"])
    # The bound is the backend's: threads of Lockers of their own on it (the threads of one
    # Locker would queue in that Locker behind a single place).
    backend = HttpBackend(url, keys["alpha"])
    waiters = [Locker(backend, ttl=5, retry=Retry(delay=0.5, timeout=60)) for _ in range(LINE_WAITERS + 1)]
    lease = "/locks/crowd/lease"
    done: list[int] = []
    try:
        held = holder.acquire("crowd", ttl=30)

        def take_turn(index: int) -> None:
            with waiters[index].lock("crowd"):
                done.append(index)

        threads = [threading.Thread(target=take_turn, args=(index,)) for index in range(LINE_WAITERS + 1)]
        for thread in threads:
            thread.start()
        # Two threads hold acquisitions of their own at the server; the third one's refusal is
        # watched by the backend's watching thread.
        assert wait_until(lambda: _watching_threads() and _held_acquisitions(recorder, lease), 20)
        held.release()
        for thread in threads:
            thread.join(60)
        assert sorted(done) == list(range(LINE_WAITERS + 1))
    finally:
        holder.close()
        for waiter in waiters:
            waiter.close()
        backend.close()


def test_twenty_waiting_lockers_all_get_the_key(rig: Any) -> None:
    _app, _recorder, url, keys = rig
    lockers = [_locker(url, keys["alpha"], retry=Retry(timeout=120)) for _ in range(21)]
    done: list[int] = []
    failed: list[BaseException] = []

    def take_turn(index: int) -> None:
        try:
            with lockers[index].lock("shared"):
                done.append(index)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            failed.append(exc)

    try:
        first = lockers[20].acquire("shared")
        threads = [threading.Thread(target=take_turn, args=(index,)) for index in range(20)]
        for thread in threads:
            thread.start()
        first.release()
        for thread in threads:
            thread.join(150)
        assert not failed and sorted(done) == list(range(20))
    finally:
        for locker in lockers:
            locker.close()


def test_the_client_falls_back_without_the_extension(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.toml"
    keys = make_keys(keys_file)
    recorder = Recorder(create_app(MemoryBackend(), keys_file, rate_limit=1000, max_waits=0))
    with ThreadedServer(recorder) as server:
        holder, waiter = _locker(server.url, keys["alpha"]), _locker(server.url, keys["alpha"])
        try:
            held = holder.acquire("plain", ttl=30)
            got: list[Any] = []
            thread = threading.Thread(target=lambda: got.append(waiter.acquire("plain")))
            thread.start()
            assert wait_until(lambda: sum(1 for m, p, _ in recorder.seen if m == "POST" and "plain" in p) >= 2, 20)
            held.release()
            thread.join(30)
            assert len(got) == 1 and got[0].state == "held"
            got[0].release()
            assert not any(prefer for _m, _p, prefer in recorder.seen)
        finally:
            holder.close()
            waiter.close()


def _free_after_release(url: str, api_key: str, key: str, release: Callable[[], None]) -> float:
    """Seconds from ``release()`` until another client's plain acquisition of ``key`` is granted
    (tried every 20 ms; at most 10 s)."""
    with _session(api_key) as other:
        released = time.monotonic()
        release()
        token = str(uuid.uuid4())
        while _acquire(other, url, key, token).status_code != 201:
            assert time.monotonic() - released < 10
            time.sleep(0.02)
        return time.monotonic() - released


def test_a_wait_the_locker_gave_up_gives_its_grant_back_at_once(rig: Any) -> None:
    # A waiting acquisition times out on the client while its waiting request is still held by
    # the server; the next release grants that request. Nobody will claim it, so the key must
    # be free again at once, not after the client's claim window (2 s).
    _app, recorder, url, keys = rig
    holder, waiter = _locker(url, keys["alpha"]), _locker(url, keys["alpha"])
    lease = "/locks/abandoned/lease"
    try:
        held = holder.acquire("abandoned", ttl=30)
        with pytest.raises(LockHeldError):
            waiter.acquire("abandoned", timeout=1.0)
        assert any(m == "POST" and p == lease and prefer for m, p, prefer in recorder.seen)
        free_after = _free_after_release(url, keys["alpha"], "abandoned", held.release)
        print(f"key free {free_after:.3f} s after the release that granted an abandoned wait")
        assert free_after < 1.0  # the claim window was 2 s
    finally:
        holder.close()
        waiter.close()


def test_a_waiting_request_whose_client_left_is_not_granted(rig: Any) -> None:
    # A client that closed its connection while the server held its waiting acquisition (a
    # killed process, a client-side timeout) can claim nothing: the server neither keeps its
    # waiting slot nor grants it the key at the next release.
    app, _recorder, url, keys = rig
    with _session(keys["alpha"]) as holder:
        token = str(uuid.uuid4())
        assert _acquire(holder, url, "left", token).status_code == 201
        with waiting_acquisition_then_leave(url, keys["alpha"], "left"):
            assert wait_until(lambda: app.waits is not None and app.waits.waiting == 1, 20)
        assert wait_until(lambda: app.waits.waiting == 0, 20)  # its slot is free again

        def release() -> None:
            answer = holder.delete(f"{url}/locks/left/lease", headers={"X-Volcano-Lock-Token": token}, timeout=10)
            assert answer.status_code == 204

        # The release grants nobody: the key is free as soon as the release is answered.
        release()
        assert _acquire(holder, url, "left", str(uuid.uuid4())).status_code == 201
