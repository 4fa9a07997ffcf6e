"""Turning a framework's lease_lock settings into ``connect()`` options."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from ..errors import ValidationError
from ..events import EventHook, combine

__all__ = ["LOCKER_SETTINGS", "METRICS_SETTING", "connect_options", "metrics_hook"]

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
        return _exporters[kind]


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
