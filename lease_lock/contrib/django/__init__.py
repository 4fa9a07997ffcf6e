"""Django integration (extra ``django``).

Configure with a ``LEASE_LOCK`` dict in the settings::

    LEASE_LOCK = {
        "URL": "django://default",     # a DATABASES alias (PostgreSQL or SQLite), or any URL
        "TTL": 30, "MAX_HOLD": 3600, "KEY_PREFIX": "shop:", "FENCING": False,
        "OPTIONS": {"create_table": False},   # backend options
        "METRICS": "prometheus",              # or "opentelemetry": record lock metrics
    }

then ``from lease_lock.contrib.django import locker`` and ``with locker.lock("key"):``. The
``locker`` is a stand-in for one process-wide :class:`~lease_lock.Locker`, built on first use,
closed at interpreter exit and built afresh in a forked child; it is rebuilt when the test
framework changes ``LEASE_LOCK`` (``override_settings``). Add ``"lease_lock.contrib.django"`` to
``INSTALLED_APPS`` for the migration that creates the PostgreSQL table. Subclass
:class:`SingletonCommand` for management commands that must not run twice at once.
"""

from __future__ import annotations

from typing import Any, cast

from django.core.signals import setting_changed

from ...locker import Locker
from .._lazy import LazyLocker, LockerProxy
from ._command import BUSY_RETURNCODE, LOST_RETURNCODE, SingletonCommand
from ._settings import database_url, locker_from_settings

__all__ = [
    "BUSY_RETURNCODE",
    "LOST_RETURNCODE",
    "SingletonCommand",
    "database_url",
    "get_locker",
    "locker",
    "locker_from_settings",
    "reset_locker",
]

_holder = LazyLocker(locker_from_settings)

#: The process-wide locker of ``settings.LEASE_LOCK`` (a proxy: built on first use).
locker: Locker = cast(Locker, LockerProxy(_holder))


def get_locker() -> Locker:
    """The process-wide ``Locker`` itself (built now if needed)."""
    return _holder.get()


def reset_locker() -> None:
    """Close the process-wide locker (its held locks read lost, reason ``"closed"``); the next
    use builds a new one from the settings as they are then."""
    _holder.reset()


def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting in ("LEASE_LOCK", "DATABASES", "CACHES"):
        reset_locker()


setting_changed.connect(_on_setting_changed, dispatch_uid="lease_lock.contrib.django")
