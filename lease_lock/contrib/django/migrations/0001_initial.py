"""Create the PostgreSQL lock table, so a role without DDL rights can use ``create_table=False``."""

from typing import Any, ClassVar

from django.db import migrations

from lease_lock.contrib.django._migration import CreateLockTable

__all__ = ["Migration"]


class Migration(migrations.Migration):  # type: ignore[misc]  # Django ships no type hints
    """The app's only migration: the lock table, its fence sequence and its counters table."""

    initial = True
    dependencies: ClassVar[list[tuple[str, str]]] = []
    operations: ClassVar[list[Any]] = [CreateLockTable()]
