"""Turning a framework's lease_lock settings into ``connect()`` options."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import ValidationError

__all__ = ["LOCKER_SETTINGS", "connect_options"]

#: The suffix of each framework setting (``TTL`` in ``LEASE_LOCK["TTL"]`` or
#: ``LEASE_LOCK_TTL``) and the ``connect()`` option it becomes.
LOCKER_SETTINGS: Mapping[str, str] = {
    "TTL": "ttl",
    "MAX_HOLD": "max_hold",
    "KEY_PREFIX": "key_prefix",
    "FENCING": "fencing",
}


def connect_options(
    config: Mapping[str, Any], options: object, *, prefix: str, options_name: str
) -> dict[str, Any]:
    """Backend ``options`` merged with the locker settings present in ``config``.

    ``config`` keys are ``prefix`` + a :data:`LOCKER_SETTINGS` name; a setting given both
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
    return merged
