"""The system check (``manage.py check``, and every ``runserver``/``migrate`` start) of the
lease_lock settings: a bad ``LEASE_LOCK`` fails at start-up instead of on the first request."""

from __future__ import annotations

from typing import Any

from django.core import checks

from ...errors import ValidationError
from .._config import (
    METRICS_SETTING,
    check_backend_options,
    connect_options,
    metrics_hook,
    one_host_warning,
    setting_errors,
)
from ._schemes import resolve_django_url
from ._settings import lock_settings, lock_url

__all__ = ["check_lease_lock_settings"]


def check_lease_lock_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Check ``settings.LEASE_LOCK`` against the backend its URL names, without connecting.

    - ``lease_lock.E001``: unknown keys, a missing store (no ``URL``, no ``LEASE_LOCK_URL``
      and a default database that cannot hold locks), a ``django://`` or ``django-cache://``
      alias that does not qualify, and ``OPTIONS`` the backend does not take (a
      PostgreSQL-only option with a Redis URL, for example).
    - ``lease_lock.E002``: a value the locker would refuse, named by its setting
      (``LEASE_LOCK["TTL"] = "30"``: a str, not seconds), in ``OPTIONS`` too.
    - ``lease_lock.E003``: a ``METRICS`` exporter that is unknown or whose library (extra) is
      not installed.
    - ``lease_lock.W001``: the store is a SQLite file, which coordinates the processes of one
      host only (``SILENCED_SYSTEM_CHECKS`` can silence it on a one-host site).
    """
    try:
        config = lock_settings()
    except ValidationError as error:
        return [_error(error, "E001")]
    found = _value_errors(config)
    metrics = config.get(METRICS_SETTING)
    if metrics is not None:
        try:
            metrics_hook(metrics)
        except ValidationError as error:
            found.append(_error(error, "E003", f'settings.LEASE_LOCK["{METRICS_SETTING}"]: '))
    try:
        # Locker settings (TTL, ...) are merged in too, so a value given twice is reported; the
        # exporter was checked above.
        without_metrics = {name: value for name, value in config.items() if name != METRICS_SETTING}
        options = connect_options(without_metrics, config.get("OPTIONS", {}), prefix="", options_name="OPTIONS")
        url = resolve_django_url(lock_url(config))
        check_backend_options(url, options, options_name='settings.LEASE_LOCK["OPTIONS"]')
    except ValidationError as error:
        return [*found, _error(error, "E001")]
    warning = one_host_warning(url)
    if warning is not None:
        found.append(checks.Warning(warning, hint=_SHARED_STORE_HINT, id="lease_lock.W001"))
    return found


def _value_errors(config: dict[str, Any]) -> list[checks.CheckMessage]:
    """The locker's own checks of each setting, one message per setting that fails them."""
    errors = setting_errors(config, config.get("OPTIONS", {}), prefix="", shown='settings.LEASE_LOCK["{}"]')
    return [checks.Error(message, hint=_HINT, id="lease_lock.E002") for message in errors]


def _error(error: ValidationError, code: str, prefix: str = "") -> checks.CheckMessage:
    return checks.Error(f"{prefix}{error}", hint=_HINT, id=f"lease_lock.{code}")


_HINT = 'See the "Django" page of the lease_lock documentation for the LEASE_LOCK settings.'
_SHARED_STORE_HINT = (
    'Set LEASE_LOCK["URL"] to a redis:// URL or a PostgreSQL database (django://<alias>), or '
    'add "lease_lock.W001" to SILENCED_SYSTEM_CHECKS on a site that runs on one host.'
)
