"""A waiting acquire rides out a lock service that stops and starts again.

A real ``lease-lock serve`` process on a fixed loopback port is stopped while a thread waits in
``acquire(timeout=30)``, and started again on the same port once the waiter has reported failed
attempts: the waiter acquires. Kept down past the timeout, the acquire raises
``BackendUnavailableError`` (its last attempt could not reach the service) with the transport
error as ``__cause__``.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.http_server import make_keys, start_serve, stop_serve
from tests.support.outage import check_an_outage_past_the_timeout, check_rides_out_a_restart
from tests.support.ports import free_port


class Service:
    """A ``serve`` child over ``memory://`` that can be stopped and started on one port."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.keys_file = tmp / "keys.toml"
        self.key = make_keys(self.keys_file)["alpha"]
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process, url, _log = start_serve(
            self.tmp, "memory://", self.keys_file, "--bind", f"127.0.0.1:{self.port}", "--rate-limit", "100000"
        )
        assert url.rstrip("/") == self.url

    def stop(self) -> None:
        if self.process is not None:
            stop_serve(self.process)
            self.process = None


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    running = Service(tmp_path)
    running.start()
    yield running
    running.stop()


def test_a_waiting_acquire_rides_out_a_service_restart(service: Service) -> None:
    check_rides_out_a_restart(service.url, service.stop, service.start, api_key=service.key)


def test_a_service_down_past_the_timeout_raises_the_outage(service: Service) -> None:
    check_an_outage_past_the_timeout(service.url, service.stop, api_key=service.key)
