"""The migration operation that creates the PostgreSQL lock table, sequence and counters."""

from __future__ import annotations

from typing import Any

from django.db import migrations, router

from ._settings import DJANGO_SCHEME, lock_settings, lock_table

__all__ = ["CreateLockTable"]


def _quoted(name: str) -> str:
    return '"' + name + '"'


def _drop_statements(table: str, schema: Any) -> list[str]:
    if "." in table:
        schema, _, table = table.partition(".")
    prefix = "" if schema is None else _quoted(schema) + "."
    return [
        f"DROP TABLE IF EXISTS {prefix}{_quoted(table + '_count')}",
        f"DROP SEQUENCE IF EXISTS {prefix}{_quoted(table + '_fence')}",
        f"DROP TABLE IF EXISTS {prefix}{_quoted(table)}",
    ]


class CreateLockTable(migrations.RunSQL):  # type: ignore[misc]  # Django ships no type hints
    """``RunSQL`` of the PostgreSQL backend's ``ddl()`` for the table the settings name.

    It runs on PostgreSQL databases only (SQLite creates its tables itself; other engines have
    no backend), and when ``LEASE_LOCK["URL"]`` is ``django://<alias>`` only on that alias, so
    ``OPTIONS={"create_table": False}`` works for a role without DDL rights. The statements are
    computed when the migration runs, from ``LEASE_LOCK["OPTIONS"]`` ``table`` and ``schema``.
    """

    def __init__(self) -> None:
        super().__init__(sql=[], reverse_sql=[], elidable=False)

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        """Rebuilt from nothing: the statements depend on the settings, not on arguments."""
        return (f"{__name__}.{type(self).__name__}", [], {})

    def describe(self) -> str:
        """What ``migrate`` prints."""
        return "Create the lease_lock table, fence sequence and counters table (PostgreSQL only)"

    @staticmethod
    def _applies(connection: Any, app_label: str) -> bool:
        if connection.vendor != "postgresql":
            return False
        url = lock_settings().get("URL") or ""
        if url.startswith(DJANGO_SCHEME) and url[len(DJANGO_SCHEME):] != connection.alias:
            return False
        return bool(router.allow_migrate(connection.alias, app_label))

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        """Create the objects (idempotent: ``IF NOT EXISTS``)."""
        if self._applies(schema_editor.connection, app_label):
            # Imported here: only a PostgreSQL database needs the backend (and its driver).
            from ...backends.postgres import ddl

            table, schema = lock_table()
            self._run_sql(schema_editor, ddl(table, schema=schema))

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        """Drop the objects (every lease in the table goes with them)."""
        if self._applies(schema_editor.connection, app_label):
            from ...backends.postgres import ddl

            table, schema = lock_table()
            ddl(table, schema=schema)  # validates both names before they are pasted into SQL
            self._run_sql(schema_editor, _drop_statements(table, schema))
