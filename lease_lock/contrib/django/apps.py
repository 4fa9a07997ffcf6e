"""The Django app of lease_lock: add ``"lease_lock.contrib.django"`` to ``INSTALLED_APPS``."""

from __future__ import annotations

from django.apps import AppConfig

__all__ = ["LeaseLockConfig"]


class LeaseLockConfig(AppConfig):  # type: ignore[misc]  # Django ships no type hints
    """Installs the migration that creates the PostgreSQL lock table.

    The label is ``lease_lock`` (``migrate lease_lock``), not the package's last component,
    which would read as Django itself.
    """

    name = "lease_lock.contrib.django"
    label = "lease_lock"
    verbose_name = "Lease locks"

    def ready(self) -> None:
        """Register the system check of the lease_lock settings."""
        from django.core import checks

        from ._checks import check_lease_lock_settings

        checks.register(check_lease_lock_settings)
