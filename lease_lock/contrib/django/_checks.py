"""The system check (``manage.py check``, and every ``runserver``/``migrate`` start) of the
lease_lock settings: a bad ``LEASE_LOCK`` fails at start-up instead of on the first request."""

from __future__ import annotations

from typing import Any

from django.core import checks

from ...errors import ValidationError
from .._config import check_backend_options, connect_options
from ._schemes import resolve_django_url
from ._settings import lock_settings, lock_url

__all__ = ["check_lease_lock_settings"]


def check_lease_lock_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Check ``settings.LEASE_LOCK`` against the backend its URL names, without connecting.

    Reported as ``lease_lock.E001``: unknown keys, a missing store (no ``URL``, no
    ``LEASE_LOCK_URL`` and a default database that cannot hold locks), a ``django://`` or
    ``django-cache://`` alias that does not qualify, and ``OPTIONS`` the backend does not take
    (a PostgreSQL-only option with a Redis URL, for example).
    """
    try:
        config = lock_settings()
        # Locker settings (TTL, ...) are merged in too, so a value given twice is reported.
        options = connect_options(config, config.get("OPTIONS", {}), prefix="", options_name="OPTIONS")
        url = resolve_django_url(lock_url(config))
        check_backend_options(url, options, options_name='settings.LEASE_LOCK["OPTIONS"]')
    except ValidationError as error:
        return [checks.Error(str(error), hint=_HINT, id="lease_lock.E001")]
    return []


_HINT = 'See the "Django" page of the lease_lock documentation for the LEASE_LOCK settings.'
