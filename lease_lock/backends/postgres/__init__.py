"""The PostgreSQL backend (extra ``postgres``, driver psycopg2).

Usage: ``lease_lock.connect("postgresql://user@host/db")`` or
``Locker(PostgresBackend(pool_or_connection))``. ``ddl(table)`` returns the statements that
create the lock table, for a migration when the application's role may not run DDL. See
``docs/backends/postgres.md``.
"""

from __future__ import annotations

from ._backend import PostgresBackend
from ._sql import ddl
from ._watch import PostgresReleaseWatcher

__all__ = ["PostgresBackend", "PostgresReleaseWatcher", "ddl"]
