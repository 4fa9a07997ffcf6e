"""PostgreSQL servers for tests: a private throwaway cluster per session, or a given one.

Fixtures (loaded for every test through ``tests/conftest.py``):

- ``postgres_server`` (session): the server most tests share. With the environment variable
  ``LEASE_LOCK_TEST_POSTGRES_URL`` set it is that server (``restart()``/``stop()`` then raise,
  since we do not own it); otherwise a private cluster started with ``initdb`` + ``pg_ctl`` in
  a temp dir on a free loopback port, trust auth, superuser ``postgres``, database
  ``postgres``.
- ``postgres_private_server`` (session): always a private cluster, for tests that restart,
  stop or reconfigure the server, so they never break the connections of other tests.

A :class:`PostgresServer` has ``url`` (``postgresql://...``), ``dsn`` (libpq key=value),
``host``, ``port``, ``restart()``, ``stop()``, ``start()`` and ``log_tail()``.

The throwaway cluster trades durability for start-up speed (``initdb --no-sync``,
``fsync=off``, ``synchronous_commit=off``, ``full_page_writes=off``); a clean stop or restart
still keeps every committed row. Anything measuring durability (``benchmarks/``) must use a
server with the real settings instead.

When no server can be had, tests fail under the ``CI`` environment variable and are skipped
(with the reason) elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import urllib.parse
import uuid
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

from tests.support.ports import free_port
from tests.support.processes import start_or_give_up

__all__ = [
    "PostgresServer",
    "postgres_private_server",
    "postgres_server",
    "start_private_postgres",
]

ENV_URL = "LEASE_LOCK_TEST_POSTGRES_URL"
_START_ATTEMPTS = 3
_FAST_SETTINGS = ("fsync=off", "synchronous_commit=off", "full_page_writes=off")


def _find_binary(name: str) -> Optional[str]:
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), reverse=True)
    return str(versions[0]) if versions else None


class PostgresServer:
    """A PostgreSQL server reachable on loopback, private (ours to restart) or external."""

    def __init__(self, url: str, datadir: Optional[Path] = None) -> None:
        self.url = url
        parts = urllib.parse.urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 5432
        self.datadir = datadir
        self.dsn = " ".join(
            f"{name}={value}"
            for name, value in (
                ("host", self.host),
                ("port", self.port),
                ("user", urllib.parse.unquote(parts.username or "postgres")),
                ("dbname", parts.path.lstrip("/") or "postgres"),
                ("password", urllib.parse.unquote(parts.password or "")),
            )
            if value
        )

    @property
    def private(self) -> bool:
        """``True`` when this session started the server (and may restart or stop it)."""
        return self.datadir is not None

    def _pg_ctl(self, *arguments: str) -> None:
        if self.datadir is None:
            raise RuntimeError(f"{self.url} is an external server; it cannot be controlled")
        pg_ctl = _find_binary("pg_ctl")
        assert pg_ctl is not None
        command = [pg_ctl, "-D", str(self.datadir / "data"), *arguments]
        subprocess.run(_as_postgres(command), check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        """Start the stopped private server on the same port and data directory."""
        assert self.datadir is not None, "an external server cannot be started"
        options = " ".join(
            [f"-p {self.port}", "-h 127.0.0.1", f"-k {self.datadir}"]
            + [f"-c {setting}" for setting in _FAST_SETTINGS]
        )
        self._pg_ctl("-l", str(self.datadir / "server.log"), "-o", options, "-w", "-t", "60", "start")

    def stop(self) -> None:
        """Stop the private server (fast shutdown: sessions are cut, committed data is kept)."""
        self._pg_ctl("-m", "fast", "-w", "-t", "60", "stop")

    def restart(self) -> None:
        """Stop and start the private server again on the same port."""
        self.stop()
        self.start()

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the private server's log (empty for an external server)."""
        if self.datadir is None or not (self.datadir / "server.log").exists():
            return ""
        return "\n".join((self.datadir / "server.log").read_text().splitlines()[-lines:])

    def __repr__(self) -> str:
        kind = "private" if self.private else "external"
        return f"<PostgresServer {kind} {self.host}:{self.port}>"


def _as_postgres(command: list[str]) -> list[str]:
    # initdb, pg_ctl and postgres refuse to run as root.
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *command]
    return command


def start_private_postgres() -> PostgresServer:
    """initdb a throwaway cluster in a temp dir and start it on a free loopback port."""
    initdb = _find_binary("initdb")
    if initdb is None or _find_binary("pg_ctl") is None:
        raise RuntimeError("initdb/pg_ctl not found (install the postgresql server package)")
    # A short path: the Unix socket lives there too and socket paths are limited to ~100 bytes.
    root = Path(tempfile.mkdtemp(prefix="llpg-", dir="/tmp"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    subprocess.run(
        _as_postgres(
            [initdb, "-D", str(root / "data"), "--no-sync", "-A", "trust", "-U", "postgres",
             "-E", "UTF8", "--locale=C"]
        ),
        check=True,
        capture_output=True,
        timeout=120,
    )
    attempt = 0
    while True:
        attempt += 1
        server = PostgresServer(f"postgresql://postgres@127.0.0.1:{free_port()}/postgres", root)
        try:
            server.start()
            return server
        except subprocess.CalledProcessError:
            # Another process bound the probed port first ("could not bind"): try another one.
            if attempt == _START_ATTEMPTS or "could not bind" not in server.log_tail():
                raise


def _remove(server: PostgresServer) -> None:
    # Best effort: a server that already stopped (or never started) has nothing to stop.
    with contextlib.suppress(OSError, RuntimeError, subprocess.SubprocessError):
        server.stop()
    if server.datadir is not None:
        shutil.rmtree(server.datadir, ignore_errors=True)


def _private_or_fail() -> Iterator[PostgresServer]:
    server = start_or_give_up("PostgreSQL", start_private_postgres)
    try:
        yield server
    finally:
        _remove(server)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """The shared PostgreSQL server: ``$LEASE_LOCK_TEST_POSTGRES_URL`` or a private one."""
    url = os.environ.get(ENV_URL)
    if url:
        yield PostgresServer(url)
        return
    yield from _private_or_fail()


@pytest.fixture(scope="session")
def postgres_private_server() -> Iterator[PostgresServer]:
    """A private PostgreSQL server that tests may restart, stop or reconfigure."""
    yield from _private_or_fail()


def sql(conn: Any, statement: str, *parameters: Any) -> list[Any]:
    """Run ``statement`` on ``conn``; its rows (none for a statement that returns none)."""
    with conn.cursor() as cursor:
        cursor.execute(statement, parameters)
        return cursor.fetchall() if cursor.description else []


@pytest.fixture
def admin(postgres_server: PostgresServer) -> Iterator[Any]:
    """An autocommit connection to the shared server, for a test's own look at its tables."""
    import psycopg2

    conn = psycopg2.connect(postgres_server.dsn)
    conn.autocommit = True
    yield conn
    conn.close()


@pytest.fixture
def table(admin: Any) -> Iterator[str]:
    """A lock table name of this test's own; every object derived from it is dropped afterwards."""
    name = f"ll_{uuid.uuid4().hex[:12]}"
    yield name
    sql(admin, f'DROP TABLE IF EXISTS "{name}", "{name}_count", "{name}_queue", "{name}_place"')
    sql(admin, f'DROP SEQUENCE IF EXISTS "{name}_fence"')
