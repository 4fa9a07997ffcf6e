"""The HTTP client's hand-off through a real ``serve`` child: a refused acquisition is repeated
with ``Prefer: wait``, the server grants it in that request when the holder releases, and the
waiting acquisition takes the grant without another request. A grant nobody takes is given
back; a grant taken too late is renewed by a request of its own. And a waiting thread's own
line: its acquisition held by the server for its pause, to the millisecond."""

from __future__ import annotations

import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Union

import pytest
import requests
from lease_lock.backends.http import LINE_WAITERS, HttpBackend
from lease_lock.errors import BackendUnavailableError
from lease_lock.testing import wait_until

from tests.support.http_server import ServiceInfo


class RecordingSession(requests.Session):
    """A session noting method, path, ``Prefer`` and status of every answered request, and the
    ``Prefer`` of every request as it goes out (``asked``)."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[str, str, str, int]] = []
        self.asked: list[str] = []
        self._mutex = threading.Lock()

    def request(  # type: ignore[override]
        self, method: Union[str, bytes], url: Union[str, bytes], *args: Any, **kwargs: Any
    ) -> requests.Response:
        prefer = (kwargs.get("headers") or {}).get("Prefer", "")
        with self._mutex:
            self.asked.append(prefer)
        response = super().request(method, url, *args, **kwargs)
        path = urllib.parse.unquote(urllib.parse.urlsplit(str(url)).path)
        with self._mutex:
            self.sent.append((str(method), path, prefer, response.status_code))
        return response

    def snapshot(self) -> list[tuple[str, str, str, int]]:
        with self._mutex:
            return list(self.sent)


@dataclass
class Rig:
    holder: HttpBackend
    waiter: HttpBackend
    session: RecordingSession
    notified: list[str]


@pytest.fixture
def rig(lock_service: ServiceInfo) -> Iterator[Rig]:
    session = RecordingSession()
    holder = HttpBackend(lock_service.url, lock_service.keys["alpha"])
    waiter = HttpBackend(lock_service.url, lock_service.keys["alpha"], session=session)
    notified: list[str] = []
    # What a waiting Locker does once refused: watch for releases (here with a plain callback).
    waiter.watch_releases(notified.append)
    yield Rig(holder, waiter, session, notified)
    holder.close()
    waiter.close()
    session.close()


def _held_and_refused(rig: Rig, ttl: float = 5) -> tuple[str, str, str, int]:
    """A fresh key held by the holder and refused to the waiter; the holder's token and fence."""
    key, held_by, token = f"handoff:{uuid.uuid4().hex}", rig.holder.new_token(), rig.waiter.new_token()
    fence = rig.holder.acquire_fenced(key, held_by, 30, "holder")
    assert fence is not None
    assert rig.waiter.acquire_fenced(key, token, ttl, "waiter") is None
    return key, held_by, token, fence


def _waiting_posts(rig: Rig, key: str) -> list[int]:
    """The statuses of the waiter's answered ``POST``s of ``key`` that carried ``Prefer: wait``."""
    lease = f"/locks/{key}/lease"
    sent = rig.session.snapshot()
    return [status for method, path, prefer, status in sent if method == "POST" and path == lease and prefer]


def test_the_server_grants_the_waiting_acquisition_and_the_waiter_takes_it_without_a_request(rig: Rig) -> None:
    key, held_by, token, fence = _held_and_refused(rig)
    assert rig.holder.release(key, held_by)
    assert wait_until(lambda: key in rig.notified, 20)
    assert _waiting_posts(rig, key) == [201]
    before = len(rig.session.snapshot())
    granted = rig.waiter.acquire_fenced(key, token, 5, "waiter")
    assert granted is not None and granted > fence
    assert len(rig.session.snapshot()) == before  # taken without a request
    assert rig.waiter.is_held(key, token)
    state = rig.holder.inspect(key)
    assert state.held and state.fence == granted and state.owner == "waiter"
    assert rig.waiter.release(key, token)
    assert not rig.holder.inspect(key).held


def test_a_grant_nobody_takes_is_given_back(rig: Rig) -> None:
    key, held_by, _token, _fence = _held_and_refused(rig)
    assert rig.holder.release(key, held_by)
    assert wait_until(lambda: _waiting_posts(rig, key) == [201], 20)
    # The waiter never asks again (it gave up): the grant goes back, and others may take the key.
    assert wait_until(lambda: not rig.holder.inspect(key).held, 30)
    assert rig.holder.acquire_fenced(key, rig.holder.new_token(), 5, "holder") is not None


@pytest.mark.parametrize(
    ("ttl", "owner"),
    # A longer lease than the one granted (5 s): the caller would count more than the store
    # keeps. Another owner label: the grant was written under the waiter's.
    [(6, "waiter"), (5, "someone else")],
    ids=["longer-lease", "another-owner"],
)
def test_a_grant_that_does_not_fit_the_call_is_renewed_by_a_request(rig: Rig, ttl: int, owner: str) -> None:
    key, held_by, token, _fence = _held_and_refused(rig)
    assert rig.holder.release(key, held_by)
    assert wait_until(lambda: key in rig.notified, 20)
    # So the acquisition is sent, and renews the lease from its own sending.
    before = len(rig.session.snapshot())
    assert rig.waiter.acquire_fenced(key, token, ttl, owner) is not None
    sent = rig.session.snapshot()[before:]
    assert [(method, status) for method, _path, prefer, status in sent if not prefer] == [("POST", 201)]
    assert {method for method, _path, _prefer, _status in sent} == {"POST"}
    assert rig.holder.inspect(key).owner == owner
    assert rig.waiter.release(key, token)


def test_closing_gives_back_a_grant_nobody_took(rig: Rig) -> None:
    key, held_by, _token, _fence = _held_and_refused(rig)
    assert rig.holder.release(key, held_by)
    assert wait_until(lambda: key in rig.notified, 20)
    rig.waiter.close()
    assert not rig.holder.inspect(key).held


def _prefers(rig: Rig, key: str) -> list[tuple[str, int]]:
    """``Prefer`` and status of the waiter's answered ``POST``s of ``key``."""
    lease = f"/locks/{key}/lease"
    sent = rig.session.snapshot()
    return [(prefer, status) for method, path, prefer, status in sent if (method, path) == ("POST", lease)]


def _held(rig: Rig) -> tuple[str, str, str, int]:
    """A fresh key held by the holder, which the waiter only read (so no watching request of
    the waiter's repeats an acquisition of it, and the waiter knows what waits the server
    offers); the holder's token, a token for the waiter and the holder's fence."""
    key, held_by, token = f"line:{uuid.uuid4().hex}", rig.holder.new_token(), rig.waiter.new_token()
    fence = rig.holder.acquire_fenced(key, held_by, 30, "holder")
    assert fence is not None
    assert rig.waiter.inspect(key).held
    return key, held_by, token, fence


def test_a_held_acquisition_is_granted_by_the_release(rig: Rig) -> None:
    key, held_by, token, fence = _held(rig)
    line = rig.waiter.join_line(key, token, 5, "waiter", True, time.monotonic)
    assert line is not None
    granted: list[Any] = []
    started = time.monotonic()
    asked = len(rig.session.asked)
    thread = threading.Thread(target=lambda: granted.append(line.wait(10)))
    thread.start()
    # The waiting request has gone out: the server holds it, or grants it at once if the
    # release reaches it first.
    assert wait_until(lambda: any(prefer.startswith("wait=") for prefer in rig.session.asked[asked:]), 30)
    assert rig.holder.release(key, held_by)
    thread.join(30)
    [grant] = granted
    assert grant is not None and grant.fence > fence and grant.lease == 5 and not grant.claimed
    # The lease is judged from no earlier than the request's sending.
    assert started <= grant.sent <= time.monotonic()
    prefer, status = _prefers(rig, key)[-1]
    # Ten seconds, or the server's longest wait when that is shorter.
    assert status == 201 and prefer.startswith("wait=")
    assert rig.waiter.is_held(key, token)
    line.leave(True)
    assert rig.waiter.release(key, token)


def test_a_held_acquisition_ends_after_its_pause_without_a_grant(rig: Rig) -> None:
    key, held_by, token, _fence = _held(rig)
    line = rig.waiter.join_line(key, token, 5, "waiter", False, time.monotonic)
    assert line is not None
    assert line.wait(0.3) is None
    # The server, not the client, ended the pause: it answered the waiting request unserved.
    assert _prefers(rig, key)[-1] == ("wait=0.3", 409)
    assert line.ask() is None
    line.leave(False)
    assert rig.holder.inspect(key).held and rig.holder.release(key, held_by)


def test_at_most_a_few_threads_of_a_backend_hold_acquisitions_of_their_own(rig: Rig) -> None:
    key, held_by, _token, _fence = _held(rig)

    def join() -> Any:
        return rig.waiter.join_line(key, rig.waiter.new_token(), 5, "w", False, time.monotonic)

    lines = [line for line in (join() for _ in range(LINE_WAITERS)) if line is not None and line.direct]
    assert len(lines) == LINE_WAITERS
    # Beyond them, a thread is woken by the backend's shared watcher.
    beyond = join()
    assert beyond is not None and not beyond.direct
    beyond.leave(False)
    lines[0].leave(False)
    again = join()
    assert again is not None and again.direct
    for line in [again, *lines[1:]]:
        line.leave(False)
    assert rig.holder.release(key, held_by)


def test_leaving_after_a_lost_answer_gives_back_what_it_may_have_won(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The key is free, so the server grants the held acquisition at once, but its answer never
    # arrives (twice: an acquisition is sent once more after a transport failure).
    key, held_by, token, _fence = _held(rig)
    assert rig.holder.release(key, held_by)
    line = rig.waiter.join_line(key, token, 5, "waiter", False, time.monotonic)
    assert line is not None
    send = rig.waiter._send

    def answer_lost(method: str, url: str, **options: Any) -> requests.Response:
        waiting = "Prefer" in (options.get("headers") or {})
        response = send(method, url, **options)
        if waiting:
            raise requests.ConnectionError("the answer was lost")
        return response

    monkeypatch.setattr(rig.waiter, "_send", answer_lost)
    with pytest.raises(BackendUnavailableError):
        line.wait(1)
    assert rig.holder.inspect(key).held  # by the waiter's token, which never heard of it
    line.leave(False)
    # The grant the thread never heard of is given back: the key is free for anyone.
    assert not rig.holder.inspect(key).held
    assert rig.holder.acquire_fenced(key, rig.holder.new_token(), 5, "holder") is not None
