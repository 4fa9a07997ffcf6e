"""A silent network (connections open, nothing answered) under a waiting acquire on the HTTP
lock service.

A private ``lease-lock serve`` process without the wait extension (``--max-waits 0``: the
waiter asks again and again rather than being held by the service) is paused with SIGSTOP while
a thread waits for a held key: the wait ends as ``BackendUnavailableError`` with the transport's error as its cause, at
its timeout rather than after the request timeout (ten seconds) and its one retry. The same
holds for one request inside ``call_budget``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from lease_lock import BackendUnavailableError
from lease_lock.backends.http import HttpBackend

from tests.support.http_server import make_keys, start_serve, stop_serve
from tests.support.silent_wait import check_a_silent_store_ends_a_wait_as_an_outage

TOKEN = str(uuid.uuid4())


class Service:
    """A ``serve`` child over ``memory://``, and the key that may use it."""

    def __init__(self, tmp: Path) -> None:
        keys_file = tmp / "keys.toml"
        self.key = make_keys(keys_file)["alpha"]
        self.process: subprocess.Popen[bytes]
        self.process, self.url, _log = start_serve(
            tmp, "memory://", keys_file, "--rate-limit", "100000", "--max-waits", "0"
        )

    def pause(self) -> None:
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.process.pid, signal.SIGCONT)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    running = Service(tmp_path)
    yield running
    running.resume()
    stop_serve(running.process)


def test_a_wait_on_a_silent_service_ends_as_unavailable(service: Service) -> None:
    holder, waiter = HttpBackend(service.url, service.key), HttpBackend(service.url, service.key)
    try:
        check_a_silent_store_ends_a_wait_as_an_outage(
            holder, waiter, f"silent-{uuid.uuid4().hex}", service.pause, service.resume, requests.RequestException
        )
    finally:
        holder.close()
        waiter.close()


def test_a_request_within_its_budget_on_a_silent_service_ends_as_unavailable(service: Service) -> None:
    backend = HttpBackend(service.url, service.key)  # the default request timeout: 10 s
    try:
        assert backend.acquire("budget-warm", TOKEN, 60, "o")
        service.pause()
        try:
            started = time.monotonic()
            with pytest.raises(BackendUnavailableError) as raised, backend.call_budget(1.0):
                backend.acquire("budget-silent", TOKEN, 60, "o")
            # A liveness bound only: near the budget, not after the request timeout and a retry.
            assert time.monotonic() - started < 1 + 3
        finally:
            service.resume()
        assert isinstance(raised.value.__cause__, requests.RequestException), repr(raised.value.__cause__)
        # Outside a block the same backend answers as before, on its own request timeout.
        assert backend.acquire("budget-after", TOKEN, 60, "o")
    finally:
        backend.close()
