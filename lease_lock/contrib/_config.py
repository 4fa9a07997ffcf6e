"""Turning a framework's lease_lock settings into ``connect()`` options."""

from __future__ import annotations

import logging
import os
import threading
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any, Callable, Optional

from ..backends import backend_class
from ..connect import LOCKER_OPTIONS, check_locker_options
from ..errors import ValidationError
from ..events import EventHook, combine
from ..validation import install_hint

__all__ = [
    "ENV_URL",
    "LOCKER_SETTINGS",
    "METRICS_SETTING",
    "check_backend_options",
    "check_setting_names",
    "connect_options",
    "metrics_hook",
    "one_host_warning",
    "resolve_url",
    "setting_errors",
    "warn_if_one_host",
]

logger = logging.getLogger("lease_lock")

#: The suffix of each framework setting (``TTL`` in ``LEASE_LOCK["TTL"]`` or
#: ``LEASE_LOCK_TTL``) and the ``connect()`` option it becomes.
LOCKER_SETTINGS: Mapping[str, str] = {
    "TTL": "ttl",
    "MAX_HOLD": "max_hold",
    "KEY_PREFIX": "key_prefix",
    "FENCING": "fencing",
}

#: The suffix of the setting that switches metrics on (``LEASE_LOCK["METRICS"]`` or
#: ``LEASE_LOCK_METRICS``): ``"prometheus"`` or ``"opentelemetry"``.
METRICS_SETTING = "METRICS"

# One exporter per kind and process: the lockers a framework rebuilds (settings changed in
# tests, a new app) share it, since a Prometheus registry takes each metric only once.
_exporters: dict[str, EventHook] = {}
_exporters_lock = threading.Lock()


def metrics_hook(kind: object) -> EventHook:
    """The process-wide metrics exporter named by a framework's metrics setting."""
    with _exporters_lock:
        if kind not in _exporters:
            try:
                if kind == "prometheus":
                    from .prometheus import PrometheusMetrics

                    _exporters[kind] = PrometheusMetrics()
                elif kind == "opentelemetry":
                    from .opentelemetry import OpenTelemetryMetrics

                    _exporters[kind] = OpenTelemetryMetrics()
                else:
                    raise ValidationError(
                        f"the {METRICS_SETTING} setting must be 'prometheus' or 'opentelemetry', not {kind!r}"
                    )
            except ImportError as error:
                # A missing exporter library is a setup error naming its extra, not a traceback.
                package = {"prometheus": "prometheus_client", "opentelemetry": "opentelemetry"}[str(kind)]
                if (error.name or "").partition(".")[0] != package:
                    raise
                raise ValidationError(
                    f"the {METRICS_SETTING} setting {kind!r} needs the {package!r} package, which is not "
                    f"installed: {install_hint(str(kind))}"
                ) from error
        return _exporters[kind]


def check_setting_names(names: Iterable[str], *, prefix: str, where: str) -> None:
    """Refuse a setting name under ``prefix`` that no integration reads (``LEASE_LOCK_TTLL``):
    ignored, the typo would leave the default in force without a word. ``where`` names the
    settings holder in the message."""
    known = {*LOCKER_SETTINGS, METRICS_SETTING, "URL", "OPTIONS"}
    unknown = sorted(
        str(name) for name in names
        if not isinstance(name, str) or (name.startswith(prefix) and name[len(prefix):] not in known)
    )
    if unknown:
        listed = ", ".join(sorted(prefix + name for name in known))
        raise ValidationError(f"{where} has unknown key(s) {', '.join(unknown)}; known: {listed}")


def setting_errors(config: Mapping[str, Any], options: Mapping[str, Any], *, prefix: str, shown: str) -> list[str]:
    """The locker's own checks of each locker setting in ``config`` (keys ``prefix`` + a
    :data:`LOCKER_SETTINGS` name) and in the backend ``options``: one message per value they
    refuse, starting with the setting as the user wrote it (``shown`` formatted with the
    name, e.g. ``'settings.LEASE_LOCK["{}"]'``), not with the ``connect()`` option."""
    values = {
        shown.format(prefix + name): (option, config[prefix + name])
        for name, option in LOCKER_SETTINGS.items()
        if config.get(prefix + name) is not None
    }
    values.update(
        {f'{shown.format(prefix + "OPTIONS")}["{name}"]': (name, value) for name, value in options.items()
         if name in LOCKER_OPTIONS}
    )
    found = []
    for setting, (option, value) in values.items():
        try:
            check_locker_options(**{option: value})
        except ValidationError as error:
            found.append(f"{setting}: {error}")
    return found


def connect_options(
    config: Mapping[str, Any], options: object, *, prefix: str, options_name: str
) -> dict[str, Any]:
    """Backend ``options`` merged with the locker settings present in ``config``.

    ``config`` keys are ``prefix`` + a :data:`LOCKER_SETTINGS` name, or + :data:`METRICS_SETTING`
    (its exporter joins any ``on_event`` of ``options``); a setting given both
    there and in ``options`` is a ``ValidationError`` (which one should win is not obvious).
    """
    if not isinstance(options, Mapping):
        raise ValidationError(f"{options_name} must be a dict, not {type(options).__name__}")
    merged = dict(options)
    for name, option in LOCKER_SETTINGS.items():
        key = prefix + name
        if config.get(key) is not None:
            if option in merged:
                raise ValidationError(f"{option} is given twice: as {key} and in {options_name}")
            merged[option] = config[key]
    if config.get(prefix + METRICS_SETTING) is not None:
        merged["on_event"] = combine(merged.get("on_event"), metrics_hook(config[prefix + METRICS_SETTING]))
    return merged


#: The environment variable every integration reads after its own setting.
ENV_URL = "LEASE_LOCK_URL"

_warned: set[str] = set()
_warned_mutex = threading.Lock()


def resolve_url(
    own: object, own_name: str, framework: Callable[[], Optional[str]], *, add: str, warn: bool = True
) -> str:
    """The lock store URL of an integration, in the one order they all follow.

    ``own`` is the integration's own setting (named ``own_name`` in messages); then the
    ``LEASE_LOCK_URL`` environment variable; then ``framework()``, the URL of the framework's
    own store or ``None``. When none gives a URL this raises ``ValidationError`` naming the
    settings to add (``add``), so a deployment never falls back to a store private to one host.
    A SQLite URL is logged once at WARNING (unless ``warn`` is false): it coordinates the
    processes of one host only.
    """
    if own is not None and not isinstance(own, str):
        raise ValidationError(f"{own_name} must be a str, not {type(own).__name__}")
    url = own or os.environ.get(ENV_URL) or framework()
    if not url:
        raise ValidationError(
            f"no lock store configured: set {add}, or the {ENV_URL} environment variable "
            "(for example redis://host:6379/0 or postgresql://host/db)"
        )
    if warn:
        warn_if_one_host(url)
    return url


def one_host_warning(url: str) -> Optional[str]:
    """What to tell about a store that coordinates the processes of one host only (a SQLite
    file), or ``None`` for a store that several hosts can share."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme.lower() != "sqlite":
        return None
    return (
        # sqlite:///relative.db, sqlite:////absolute.db: the path follows the third "/".
        f"lease_lock uses the SQLite file {urllib.parse.unquote(parts.path[1:]) or url}: its locks coordinate "
        "the processes of this host only; give every host one shared store (Redis or PostgreSQL) "
        "before running on several"
    )


def warn_if_one_host(url: str) -> None:
    """Log once per URL that a SQLite store only coordinates the processes of one host."""
    message = one_host_warning(url)
    if message is None:
        return
    with _warned_mutex:
        if url in _warned:
            return
        _warned.add(url)
    logger.warning("%s", message)


def check_backend_options(url: str, options: Mapping[str, Any], *, options_name: str) -> None:
    """Refuse backend ``options`` that the backend ``url`` names does not take, without
    connecting (``url_options`` of the backend class lists what it takes)."""
    known = backend_class(url).url_options
    unknown = sorted(set(options) - set(known) - set(LOCKER_OPTIONS))
    if unknown:
        scheme = urllib.parse.urlsplit(url).scheme
        raise ValidationError(
            f"{options_name} has option(s) {', '.join(unknown)} that the {scheme}:// backend "
            f"does not take; it takes: {', '.join(sorted(known)) or 'none'}"
        )
