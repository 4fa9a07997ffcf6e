"""Real lock-service servers for the tests: in a thread (waitress) or a ``serve`` subprocess.

``lock_service`` (session scope) is a ``python -m lease_lock.server serve`` child on a free
loopback port over ``memory://``, with keys for two projects and every scope; tests that need
their own limits or backend start a :class:`ThreadedServer` instead. Server logs are printed
when a test using them fails, since pytest shows captured output then.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, TypeVar

import pytest
from lease_lock.server import create_key

__all__ = [
    "RequestRecorder", "ServiceInfo", "ThreadedServer", "lock_service", "make_keys", "waiting_acquisition_then_leave",
]

class RequestRecorder:
    """WSGI middleware remembering what reached the app, in ``seen``: each request's method,
    path, query, headers (lower-case names), the service's own headers by name, and body."""

    def __init__(self, app: Callable[..., Any]) -> None:
        self.app = app
        self.seen: list[dict[str, Any]] = []

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        environ["wsgi.input"] = io.BytesIO(body)
        headers = {
            name[5:].replace("_", "-").lower(): value for name, value in environ.items() if name.startswith("HTTP_")
        }
        if environ.get("CONTENT_TYPE"):
            headers["content-type"] = environ["CONTENT_TYPE"]
        self.seen.append(
            {
                "method": environ["REQUEST_METHOD"],
                "path": environ["PATH_INFO"],
                "query": environ.get("QUERY_STRING", ""),
                "headers": headers,
                "token": environ.get("HTTP_X_VOLCANO_LOCK_TOKEN"),
                "request_id": environ.get("HTTP_X_VOLCANO_REQUEST_ID"),
                "authorization": environ.get("HTTP_AUTHORIZATION"),
                "body": body,
            }
        )
        return self.app(environ, start_response)


_READY = re.compile(r"serving on (http://\S+)")


@dataclass
class ServiceInfo:
    """Where a test server listens and the keys it accepts (name -> key)."""

    url: str
    keys_file: Path
    keys: dict[str, str] = field(default_factory=dict)
    log: Optional[Path] = None


def make_keys(keys_file: Path) -> dict[str, str]:
    """Keys for projects ``alpha`` (every scope) and ``beta`` (manage), by name."""
    wanted = {
        "alpha": ("alpha", "locks.manage"),
        "alpha_full": ("alpha", "full"),
        "alpha_read": ("alpha", "locks.read"),
        "beta": ("beta", "locks.manage"),
    }
    return {name: create_key(keys_file, *spec)[1] for name, spec in wanted.items()}


@contextlib.contextmanager
def waiting_acquisition_then_leave(url: str, api_key: str, key: str) -> Iterator[None]:
    """Send an acquisition of ``key`` with ``Prefer: wait=30`` on a raw connection, and close
    that connection (the client leaves without reading an answer) when the block ends."""
    host, port = urllib.parse.urlsplit(url).netloc.split(":")
    body = json.dumps({"ttl_seconds": 30}).encode()
    request = (
        f"POST /locks/{key}/lease HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {api_key}\r\n"
        f"X-Volcano-Lock-Token: {uuid.uuid4()}\r\nPrefer: wait=30\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    with socket.create_connection((host, int(port)), timeout=10) as leaving:
        leaving.sendall(request)
        yield


class ThreadedServer:
    """A WSGI app served like ``lease-lock serve`` on a free loopback port, in a daemon thread."""

    def __init__(self, app: Any, threads: int = 8, **settings: Any) -> None:
        from lease_lock.server.serving import make_server

        # The settings of ``lease-lock serve``, so tests see what its users see.
        self.server = make_server(app, "127.0.0.1", 0, threads=threads, asyncore_loop_timeout=0.1, **settings)
        self.url = f"http://127.0.0.1:{self.server.effective_port}"
        self._thread = threading.Thread(target=self._run, name="test-waitress", daemon=True)

    def _run(self) -> None:
        self.server.run()

    def __enter__(self) -> ThreadedServer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Close the listening socket and the worker threads."""
        # The loop runs while its socket map has channels; closing them all, on the loop's own
        # thread (through its trigger), ends it without racing its select().
        # Workers go first: one finishing a request pulls the trigger, which must still be open.
        self.server.task_dispatcher.shutdown()
        try:
            self.server.trigger.pull_trigger(self._close_channels)
        except OSError:
            # The trigger's descriptor is already closed, so the loop has ended on its own (its
            # map emptied): what is left to close can be closed from here without a race.
            self._close_channels()
        self._thread.join(10)

    def _close_channels(self) -> None:
        for channel in list(self.server._map.values()):
            channel.close()


def start_serve(
    tmp: Path, backend_url: str, keys_file: Path, *extra: str, module: str = "lease_lock.server"
) -> tuple[subprocess.Popen[bytes], str, Path]:
    """Start ``python -m <module> serve`` and wait until it says where it listens.

    ``module="lease_lock"`` runs the ``lease-lock`` command itself.
    """
    log = tmp / f"serve-{time.monotonic_ns()}.log"
    handle = log.open("wb")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            module,
            "serve",
            "--url",
            backend_url,
            "--bind",
            "127.0.0.1:0",
            "--keys",
            str(keys_file),
            *extra,
        ],
        stdout=handle,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    handle.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        match = _READY.search(log.read_text(errors="replace"))
        if match:
            return process, match.group(1), log
        if process.poll() is not None:
            break
        time.sleep(0.05)
    process.kill()
    raise RuntimeError(f"lease-lock serve did not start:\n{log.read_text(errors='replace')}")


def stop_serve(process: subprocess.Popen[bytes]) -> None:
    """Stop a server child by its PID, killing it if it lingers."""
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


@pytest.fixture(scope="session")
def lock_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceInfo]:
    """A ``serve`` child over ``memory://`` with a budget no test run can spend."""
    tmp = tmp_path_factory.mktemp("lock-service")
    keys_file = tmp / "keys.toml"
    keys = make_keys(keys_file)
    process, url, log = start_serve(tmp, "memory://", keys_file, "--rate-limit", "1000000")
    try:
        yield ServiceInfo(url=url, keys_file=keys_file, keys=keys, log=log)
    finally:
        stop_serve(process)


class ServiceClient:
    """Raw HTTP against the service, with one key (``None``: no ``Authorization``)."""

    def __init__(self, base: str, key: Optional[str]) -> None:
        import requests

        self.base = base
        self.session = requests.Session()
        if key is not None:
            self.session.headers["Authorization"] = f"Bearer {key}"

    def call(self, method: str, path: str, token: Optional[str] = None, **kwargs: Any) -> Any:
        """``method`` on ``path``, with the lock token header when ``token`` is given."""
        headers = kwargs.pop("headers", {})
        if token is not None:
            headers["X-Volcano-Lock-Token"] = token
        return self.session.request(method, self.base + path, headers=headers, timeout=30, **kwargs)

    def acquire(self, key: str, token: str, ttl: Any = 30, **kwargs: Any) -> Any:
        """An acquisition of ``key`` for ``token`` (``kwargs`` such as ``json`` replace the body)."""
        kwargs.setdefault("json", {"ttl_seconds": ttl})
        return self.call("POST", f"/locks/{key}/lease", token, **kwargs)


_Client = TypeVar("_Client", bound=ServiceClient)


@contextlib.contextmanager
def client_of(service: ServiceInfo, name: str, kind: type[_Client]) -> Iterator[_Client]:
    """A ``kind`` of client of ``service`` with the key of ``name``, closed afterwards."""
    client = kind(service.url, service.keys[name])
    try:
        yield client
    finally:
        client.session.close()


#: The wall clock's reading at the fake monotonic clock's zero (:class:`ServiceClock`).
EPOCH = 1_800_000_000.0


class ServiceClock:
    """Injected time for a ``LockService`` and its store: ``now`` seconds on the monotonic
    clock, ``EPOCH + now`` on the wall clock; a test moves ``now`` itself."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        """The store's clock."""
        return self.now

    def wall(self) -> float:
        """The service's wall clock."""
        return EPOCH + self.now

