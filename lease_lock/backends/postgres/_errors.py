"""Telling an unreachable PostgreSQL server from a query or setup the server refused.

psycopg2 reports both with ``OperationalError``: a refused or cut connection, a server that is
shutting down, but also a wrong password or a missing database. Only the first kind becomes
:class:`~lease_lock.errors.BackendUnavailableError` (a blocking acquire waits it out, the CLI
exits 69); the second is a setup error that retrying cannot fix, so it passes through.
"""

from __future__ import annotations

import urllib.parse
from typing import Any, Optional

import psycopg2

from ...errors import BackendUnavailableError

__all__ = ["is_connect_failure", "is_connection_failure", "scrub", "unavailable"]

#: SQLSTATEs of a connection that ended or could not start: class 08 (connection exception),
#: admin / crash shutdown, "cannot connect now" (starting up, in recovery), too many clients.
_UNAVAILABLE_STATES = frozenset({"57P01", "57P02", "57P03", "53300"})

#: Words of libpq's connect errors that a retry cannot fix: credentials, unknown database or
#: role, pg_hba.conf, TLS setup. Everything else that fails a connect is an unreachable server.
_SETUP_WORDS = (
    "authentication failed",
    "does not exist",
    "pg_hba.conf",
    "permission denied",
    "no password supplied",
    "sslmode",
    "ssl is not enabled",
    "does not support ssl",
    "certificate",
    "invalid",
    "unsupported",
)


def is_connection_failure(exc: BaseException, conn: Any) -> bool:
    """``True`` if ``exc``, raised while ``conn`` ran a statement, means the link is gone.

    psycopg2 marks a connection whose socket failed as closed; the server's own goodbyes
    (administrator or crash shutdown) carry their SQLSTATE. A statement the server refused on a
    healthy connection (a deadlock, a cancelled query, a full disk) is not one.
    """
    if not isinstance(exc, (psycopg2.OperationalError, psycopg2.InterfaceError)):
        return False
    if conn is not None and bool(getattr(conn, "closed", False)):
        return True
    if isinstance(exc, psycopg2.InterfaceError):
        # "connection already closed": the only InterfaceError a valid statement can raise.
        return True
    code = getattr(exc, "pgcode", None) or ""
    return code.startswith("08") or code in _UNAVAILABLE_STATES


def is_connect_failure(exc: BaseException) -> bool:
    """``True`` if ``exc``, raised by ``psycopg2.connect``, means the server could not be reached."""
    if not isinstance(exc, psycopg2.OperationalError):
        return False
    code = getattr(exc, "pgcode", None) or ""
    if code:
        return code.startswith("08") or code in _UNAVAILABLE_STATES
    text = str(exc).lower()
    if "the database system is" in text or "too many" in text:
        # Starting up, shutting down, in recovery, out of connection slots: it will pass.
        return True
    return not any(word in text for word in _SETUP_WORDS)


def scrub(text: str, dsn: Optional[str]) -> str:
    """``text`` with the password of ``dsn`` (raw and decoded) replaced by ``***``."""
    if not dsn:
        return text
    secrets: set[str] = set()
    if "://" in dsn:
        userinfo = dsn.split("://", 1)[1].split("/", 1)[0].rpartition("@")[0]
        if ":" in userinfo:
            raw = userinfo.split(":", 1)[1]
            secrets.update({raw, urllib.parse.unquote(raw)})
        query = dsn.split("?", 1)[1] if "?" in dsn else ""
        for name, value in urllib.parse.parse_qsl(query, keep_blank_values=True):
            if name == "password":
                secrets.add(value)
    else:
        for item in dsn.split():
            name, _, value = item.partition("=")
            if name == "password":
                secrets.add(value.strip("'"))
    # Longest first, so a password that contains another secret is masked whole.
    for secret in sorted((item for item in secrets if item), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def unavailable(exc: BaseException, dsn: Optional[str], table: str) -> BackendUnavailableError:
    """The :class:`BackendUnavailableError` for driver error ``exc`` (raise it ``from exc``)."""
    detail = " ".join(str(exc).split()) or type(exc).__name__
    return BackendUnavailableError(
        f"PostgreSQL backend unavailable (lock table {table!r}): {scrub(detail, dsn)}",
        backend="postgresql",
    )
