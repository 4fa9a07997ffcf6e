"""A MongoDB-compatible server for the tests: a private mongoeco wire server, or a given one.

Fixtures (loaded for every test through ``tests/conftest.py``):

- ``mongo_server`` (session): the server the MongoDB tests share. With ``LEASE_LOCK_MONGO_URL``
  set (``mongodb://host:27017``, a real ``mongod`` say) it is that server; otherwise a private
  mongoeco wire server (memory engine) on a free loopback port, stopped at the session's end.
  Tests keep apart by database or collection names of their own.
- ``mongo_database``: a database name no other test uses.

mongoeco needs Python 3.13 or later, so it runs from a virtual environment of its own, never
the suite's: the interpreter ``LEASE_LOCK_MONGOECO_PYTHON`` names (``.ci/run`` builds one), else
one this module builds once and keeps in ``~/.cache/lease-lock-tests/mongoeco-4.11.0`` from
pyenv's or PATH's ``python3.13``. When no server can be had, tests fail under ``CI`` and are
skipped elsewhere, saying why. A failing test that used the private server gets its log tail.
"""

from __future__ import annotations

import fcntl
import os
import select
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import pytest

from tests.support.processes import log_tail, start_or_give_up, stop_process

__all__ = ["MONGOECO", "MongoServer", "mongo_database", "mongo_server", "mongoeco_python"]

ENV_URL = "LEASE_LOCK_MONGO_URL"
ENV_PYTHON = "LEASE_LOCK_MONGOECO_PYTHON"
#: The server package, pinned: its behaviour is what the tests were written against.
MONGOECO = "mongoeco[wire]==4.11.0"
_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lease-lock-tests" / "mongoeco-4.11.0"
_SCRIPT = Path(__file__).with_name("mongoeco_serve.py")
_START_TIMEOUT = 60.0


def _python_313() -> Optional[str]:
    """A Python 3.13 interpreter: pyenv's, else ``python3.13`` on PATH."""
    root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    candidates = [str(path) for path in sorted(root.glob("versions/3.13.*/bin/python"), reverse=True)]
    candidates.append(shutil.which("python3.13") or "")
    for candidate in filter(None, candidates):
        check = subprocess.run(
            [candidate, "-c", "import sys; assert sys.version_info[:2] == (3, 13)"], capture_output=True
        )
        if check.returncode == 0:
            return candidate
    return None


def mongoeco_python() -> str:
    """The interpreter of a virtual environment with :data:`MONGOECO`, built on first need.

    Several test processes may ask at once: one builds under a file lock while the others wait.
    """
    given = os.environ.get(ENV_PYTHON)
    if given:
        return given
    python = _CACHE / "bin" / "python"
    done = _CACHE / "installed"
    _CACHE.parent.mkdir(parents=True, exist_ok=True)
    with open(_CACHE.parent / "mongoeco.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():
            return str(python)
        base = _python_313()
        if base is None:
            raise RuntimeError("mongoeco needs Python 3.13: none in pyenv's versions or as python3.13 on PATH")
        shutil.rmtree(_CACHE, ignore_errors=True)
        subprocess.run([base, "-m", "venv", str(_CACHE)], check=True, capture_output=True, timeout=300)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", MONGOECO], check=True, capture_output=True, timeout=900
        )
        done.write_text(MONGOECO + "\n")
    return str(python)


class MongoServer:
    """A MongoDB server on loopback: the private mongoeco one (``process`` set) or a given one."""

    def __init__(self, url: str, process: Optional[subprocess.Popen[bytes]] = None, log: Optional[Path] = None) -> None:
        self.base = url
        self.process = process
        self.logfile = log

    def url(self, database: str, **query: str) -> str:
        """A ``mongodb://`` URL of this server naming ``database``, with ``query`` added to the
        server URL's own options."""
        parts = urllib.parse.urlsplit(self.base)
        pairs = urllib.parse.parse_qsl(parts.query) + list(query.items())
        return urllib.parse.urlunsplit((parts.scheme, parts.netloc, "/" + database, urllib.parse.urlencode(pairs), ""))

    def client(self) -> Any:
        """A new pymongo client of this server (close it)."""
        import pymongo

        return pymongo.MongoClient(self.base, serverSelectionTimeoutMS=10000)

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the private server's log (empty for a given server)."""
        return log_tail(self.logfile, lines) if self.logfile is not None else ""

    def stop(self) -> None:
        """Stop the private server (SIGTERM, then SIGKILL)."""
        stop_process(self.process)
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()


def _answers_ping(url: str) -> bool:
    import pymongo
    import pymongo.errors

    client: Any = pymongo.MongoClient(url, serverSelectionTimeoutMS=1000)
    try:
        client.admin.command("ping")
        return True
    except pymongo.errors.PyMongoError:
        return False
    finally:
        client.close()


def start_private_mongo(workdir: Path) -> MongoServer:
    """Start a mongoeco wire server on a free loopback port; return once it answers ``ping``."""
    python = mongoeco_python()
    log = workdir / "mongoeco.log"
    with open(log, "ab") as errors:
        process = subprocess.Popen([python, str(_SCRIPT), "0"], stdout=subprocess.PIPE, stderr=errors)
    assert process.stdout is not None
    # The script prints its port once it listens (importing mongoeco takes seconds).
    ready, _, _ = select.select([process.stdout], [], [], _START_TIMEOUT)
    line = process.stdout.readline().decode().strip() if ready else ""
    if not line.isdigit():
        stop_process(process)
        raise RuntimeError(f"mongoeco did not start: {log_tail(log, 40)}")
    server = MongoServer(f"mongodb://127.0.0.1:{line}/?directConnection=true", process, log)
    deadline = time.monotonic() + _START_TIMEOUT
    while not _answers_ping(server.base):
        if process.poll() is not None or time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(f"mongoeco does not answer ping: {server.log_tail()}")
    return server


@pytest.fixture(scope="session")
def mongo_server() -> Iterator[MongoServer]:
    """The shared MongoDB server: ``$LEASE_LOCK_MONGO_URL`` or a private mongoeco server."""
    url = os.environ.get(ENV_URL)
    if url:
        yield MongoServer(url)
        return
    workdir = Path(tempfile.mkdtemp(prefix="lease-lock-mongo-"))
    server = start_or_give_up("a MongoDB server", lambda: start_private_mongo(workdir))
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def mongo_database(mongo_server: MongoServer) -> Iterator[str]:
    """A database name of this test's own, dropped afterwards."""
    name = f"ll_{uuid.uuid4().hex[:12]}"
    yield name
    client = mongo_server.client()
    try:
        client.drop_database(name)
    finally:
        client.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Attach the private server's log tail to the report of a failing test that used it."""
    outcome = yield
    report = outcome.get_result()
    server = getattr(item, "funcargs", {}).get("mongo_server")
    if report.failed and isinstance(server, MongoServer) and server.logfile is not None:
        report.sections.append(("mongoeco log", server.log_tail()))

