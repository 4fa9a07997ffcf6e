"""The fenced resource the workers write to: an SQLite file or a PostgreSQL table.

Each key has one cell ``(key, fence, hold, seq)``. A write is accepted only when its fence is
at least the cell's (the ``fence <=`` guard of fencing), and every accepted write is appended to
a history table in the same transaction, so the history's id order is the order in which the
resource accepted writes. The checker reads that history; the guard itself is what it tests.

URLs: ``sqlite:////abs/path.db`` or ``postgresql://...`` (tables ``<table>_cells`` and
``<table>_history``, default table ``chaos``; pass ``?table=`` to name another).
"""

from __future__ import annotations

import abc
import sqlite3
import urllib.parse
from typing import Any, Optional

__all__ = ["FencedResource", "PostgresResource", "SqliteResource", "open_resource"]

_Row = tuple[int, str, int, str, int]


class FencedResource(abc.ABC):
    """A store that accepts a key's write only with a fence no smaller than the last one."""

    @abc.abstractmethod
    def setup(self, keys: list[str]) -> None:
        """Create empty cells for ``keys`` (dropping earlier contents)."""

    @abc.abstractmethod
    def write(self, key: str, fence: int, hold: str, seq: int) -> bool:
        """Write if ``fence`` passes the guard; ``True`` when accepted. Driver errors propagate."""

    @abc.abstractmethod
    def history(self) -> list[_Row]:
        """Accepted writes ``(id, key, fence, hold, seq)`` in acceptance order."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close the connection."""


class SqliteResource(FencedResource):
    """The resource in an SQLite file shared by the workers of this host."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._connection: Optional[sqlite3.Connection] = None

    def _connect(self) -> sqlite3.Connection:
        if self._connection is None:
            # isolation_level=None: we issue BEGIN IMMEDIATE ourselves, so the guard's read and
            # the write happen under the one write lock.
            self._connection = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            self._connection.execute("PRAGMA journal_mode=WAL")
        return self._connection

    def setup(self, keys: list[str]) -> None:
        """See :meth:`FencedResource.setup`."""
        db = self._connect()
        db.execute("DROP TABLE IF EXISTS cells")
        db.execute("DROP TABLE IF EXISTS history")
        db.execute("CREATE TABLE cells (key TEXT PRIMARY KEY, fence INTEGER NOT NULL, hold TEXT, seq INTEGER)")
        db.execute(
            "CREATE TABLE history (id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT, fence INTEGER,"
            " hold TEXT, seq INTEGER)"
        )
        db.executemany("INSERT INTO cells VALUES (?, 0, NULL, NULL)", [(key,) for key in keys])

    def write(self, key: str, fence: int, hold: str, seq: int) -> bool:
        """See :meth:`FencedResource.write`."""
        db = self._connect()
        db.execute("BEGIN IMMEDIATE")
        try:
            moved = db.execute(
                "UPDATE cells SET fence = ?, hold = ?, seq = ? WHERE key = ? AND fence <= ?",
                (fence, hold, seq, key, fence),
            ).rowcount
            if moved:
                db.execute("INSERT INTO history (key, fence, hold, seq) VALUES (?, ?, ?, ?)", (key, fence, hold, seq))
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        return bool(moved)

    def history(self) -> list[_Row]:
        """See :meth:`FencedResource.history`."""
        return list(self._connect().execute("SELECT id, key, fence, hold, seq FROM history ORDER BY id"))

    def close(self) -> None:
        """See :meth:`FencedResource.close`."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None


class PostgresResource(FencedResource):
    """The resource in PostgreSQL: the guard and the history row are one statement."""

    def __init__(self, dsn: str, table: str = "chaos") -> None:
        if not table.isidentifier():
            raise ValueError(f"table must be a plain identifier, got {table!r}")
        self.dsn = dsn
        self.table = table
        self._connection: Any = None

    def _connect(self) -> Any:
        if self._connection is None:
            import psycopg2

            self._connection = psycopg2.connect(self.dsn)
            self._connection.autocommit = True
        return self._connection

    def _execute(self, statement: str, parameters: tuple[Any, ...] = ()) -> Any:
        try:
            with self._connect().cursor() as cursor:
                cursor.execute(statement, parameters)
                return cursor.fetchall() if cursor.description else cursor.rowcount
        except Exception:
            # A broken connection (server restart, terminated backend) is replaced on next use.
            self.close()
            raise

    def setup(self, keys: list[str]) -> None:
        """See :meth:`FencedResource.setup`."""
        t = self.table
        self._execute(f"DROP TABLE IF EXISTS {t}_cells, {t}_history")
        self._execute(f"CREATE TABLE {t}_cells (key text PRIMARY KEY, fence bigint NOT NULL, hold text, seq int)")
        self._execute(
            f"CREATE TABLE {t}_history (id bigserial PRIMARY KEY, key text, fence bigint, hold text, seq int)"
        )
        for key in keys:
            self._execute(f"INSERT INTO {t}_cells VALUES (%s, 0, NULL, NULL)", (key,))

    def write(self, key: str, fence: int, hold: str, seq: int) -> bool:
        """See :meth:`FencedResource.write`.

        The UPDATE locks the cell's row, so the history id is drawn after every earlier write of
        the key committed: id order is acceptance order.
        """
        t = self.table
        inserted = self._execute(
            f"WITH moved AS (UPDATE {t}_cells SET fence = %s, hold = %s, seq = %s"
            f" WHERE key = %s AND fence <= %s RETURNING key)"
            f" INSERT INTO {t}_history (key, fence, hold, seq) SELECT key, %s, %s, %s FROM moved",
            (fence, hold, seq, key, fence, fence, hold, seq),
        )
        return bool(inserted)

    def history(self) -> list[_Row]:
        """See :meth:`FencedResource.history`."""
        rows = self._execute(f"SELECT id, key, fence, hold, seq FROM {self.table}_history ORDER BY id")
        return [tuple(row) for row in rows]

    def close(self) -> None:
        """See :meth:`FencedResource.close`."""
        if self._connection is not None:
            try:
                self._connection.close()
            finally:
                self._connection = None


def open_resource(url: str) -> FencedResource:
    """The resource a URL names: ``sqlite:////abs.db`` or ``postgresql://...?table=name``."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "sqlite":
        return SqliteResource(parts.path[1:] if parts.path.startswith("//") else parts.path.lstrip("/"))
    if parts.scheme in ("postgresql", "postgres"):
        query = dict(urllib.parse.parse_qsl(parts.query))
        table = query.pop("table", "chaos")
        dsn = urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))
        return PostgresResource(dsn, table)
    raise ValueError(f"unsupported resource URL {url!r}")
