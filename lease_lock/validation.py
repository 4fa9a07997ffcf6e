"""Argument checks shared by the core, the backends, the CLI and the server.

Each function returns the normalised value or raises :class:`~lease_lock.errors.ValidationError`
naming the argument and the rule it broke. Nothing here touches a backend, so a call that fails
validation has written nothing.
"""

from __future__ import annotations

import math
import re
import threading
import urllib.parse
from datetime import timedelta
from typing import Any, Optional

from .errors import ValidationError

__all__ = [
    "MAX_DURATION",
    "MAX_KEY_BYTES",
    "check_bool",
    "check_cancel",
    "check_duration",
    "check_key",
    "check_optional_duration",
    "check_owner",
    "check_token",
    "check_ttl",
    "describe_token",
    "is_secret_option",
    "parse_duration",
    "redact_url",
]

#: The longest key (prefix included) in UTF-8 bytes.
MAX_KEY_BYTES = 1024
#: The longest finite duration accepted anywhere (ttl, max_hold, timeout, delays), in seconds:
#: 365 days. Every store keeps such a lease exactly (Redis milliseconds, PostgreSQL intervals,
#: SQLite reals) and every reader can turn it into a date; a longer one would be granted and
#: then break ``get()``, ``list()`` and ``status`` for everyone. ``math.inf`` stays allowed
#: where it means "no limit" (``max_hold``, ``timeout``).
MAX_DURATION = 365 * 86400.0
_TOKEN_PATTERN = re.compile(r"[A-Za-z0-9._:-]{16,128}")
_DURATION_PATTERN = re.compile(r"(?P<number>\d+(?:\.\d+)?|\.\d+)\s*(?P<unit>ms|s|m|h|d)?")
_UNIT_SECONDS = {None: 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def _type_name(value: object) -> str:
    return type(value).__name__


def check_key(key: object, name: str = "key") -> str:
    """Return ``key`` if it is a usable lock key, else raise ``ValidationError``."""
    if not isinstance(key, str):
        raise ValidationError(f"{name} must be a str, not {_type_name(key)}")
    if not key:
        raise ValidationError(f"{name} must not be empty")
    if "\x00" in key:
        raise ValidationError(f"{name} must not contain a NUL character")
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise ValidationError(f"{name} must be valid Unicode text (lone surrogate found)") from exc
    if size > MAX_KEY_BYTES:
        raise ValidationError(
            f"{name} is {size} UTF-8 bytes with the key prefix; at most {MAX_KEY_BYTES} allowed"
        )
    return key


def check_duration(value: object, name: str, *, allow_zero: bool = False, allow_inf: bool = False) -> float:
    """Return a duration in seconds from a number or ``timedelta``.

    Booleans are refused even though they are ints: ``ttl=True`` is always a mistake. A finite
    duration must be at most :data:`MAX_DURATION` (365 days).
    """
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            seconds = float(value)
        except OverflowError:
            raise ValidationError(f"{name} is too large to be a number of seconds") from None
    else:
        raise ValidationError(
            f"{name} must be seconds as int, float or timedelta, not {_type_name(value)}"
        )
    if math.isnan(seconds):
        raise ValidationError(f"{name} must be a number, not NaN")
    if math.isinf(seconds):
        if allow_inf and seconds > 0:
            return seconds
        raise ValidationError(f"{name} must be finite")
    if seconds < 0 or (seconds == 0 and not allow_zero):
        rule = ">= 0" if allow_zero else "> 0"
        raise ValidationError(f"{name} must be {rule} seconds, got {seconds!r}")
    if seconds > MAX_DURATION:
        unlimited = " (math.inf means no limit)" if allow_inf else ""
        raise ValidationError(
            f"{name} must be at most {MAX_DURATION:.0f} seconds (365 days){unlimited}, got {seconds!r}"
        )
    return seconds


def check_optional_duration(
    value: object, name: str, *, allow_zero: bool = False, allow_inf: bool = False
) -> Optional[float]:
    """Like :func:`check_duration` but ``None`` passes through."""
    if value is None:
        return None
    return check_duration(value, name, allow_zero=allow_zero, allow_inf=allow_inf)


def check_ttl(value: object, name: str = "ttl") -> float:
    """A lease length: finite and > 0 seconds."""
    return check_duration(value, name)


def check_token(token: object, name: str = "token") -> str:
    """A caller's ownership token: 16 to 128 characters of ``[A-Za-z0-9._:-]``."""
    if not isinstance(token, str):
        raise ValidationError(f"{name} must be a str, not {_type_name(token)}")
    if not _TOKEN_PATTERN.fullmatch(token):
        raise ValidationError(
            f"{name} must be 16 to 128 characters of letters, digits, '.', '_', ':' or '-'"
        )
    return token


def check_owner(owner: object, name: str = "owner") -> str:
    """An owner label: a short printable string (at most 256 characters)."""
    if not isinstance(owner, str):
        raise ValidationError(f"{name} must be a str, not {_type_name(owner)}")
    if len(owner) > 256 or not owner.isprintable():
        raise ValidationError(f"{name} must be at most 256 printable characters")
    return owner


def check_bool(value: object, name: str) -> bool:
    """A flag: exactly ``True`` or ``False``."""
    if not isinstance(value, bool):
        raise ValidationError(f"{name} must be True or False, not {_type_name(value)}")
    return value


def check_cancel(value: object, name: str = "cancel") -> Optional[threading.Event]:
    """A cancellation event: ``None`` or a ``threading.Event``."""
    if value is not None and not isinstance(value, threading.Event):
        raise ValidationError(f"{name} must be a threading.Event, not {_type_name(value)}")
    return value


def describe_token(token: Any) -> str:
    """The part of a token that may appear in reprs, errors and logs: its first 4 characters."""
    text = str(token)
    return f"{text[:4]}…" if text else "''"


_DURATION_UNITS = ("d", "h", "m", "s", "ms")


def parse_duration(text: str, name: str = "duration") -> float:
    """Parse ``30``, ``30s``, ``1.5m``, ``5m``, ``1h``, ``2d``, ``250ms`` or a compound of
    units from the largest down, such as ``1h30m`` or ``2m30s``, into seconds."""
    stripped = text.strip() if isinstance(text, str) else ""
    parts = list(_DURATION_PATTERN.finditer(stripped))
    units = [part["unit"] for part in parts]
    valid = (
        bool(parts)
        and "".join(part.group(0) for part in parts) == stripped
        # A compound names every unit once, from the largest down (1h30m, not 30m1h or 1h30).
        and (len(parts) == 1 or (
            None not in units
            and [_DURATION_UNITS.index(unit) for unit in units]
            == sorted({_DURATION_UNITS.index(unit) for unit in units})
        ))
    )
    if not valid:
        raise ValidationError(
            f"{name} must look like 30, 30s, 5m, 1h, 2d or 1h30m, got {text!r}"
        )
    seconds = sum(float(part["number"]) * _UNIT_SECONDS[part["unit"]] for part in parts)
    return check_duration(seconds, name)


#: Query options whose values are credentials, masked by :func:`redact_url`.
_SECRET_QUERY_OPTIONS = frozenset({"password", "sentinel_password", "api_key", "apikey", "key", "token"})
_REDACTED = "***"


def is_secret_option(name: str) -> bool:
    """Whether a URL query option carries a credential, so its value must never be shown."""
    return name.lower() in _SECRET_QUERY_OPTIONS


def redact_url(url: str) -> str:
    """``url`` with its password and every credential-bearing query value replaced by ``***``.

    Used wherever a URL reaches a message, a ``repr`` or a log line. Text that does not parse as
    a URL is not echoed at all: it may be a connection string with a secret in an unknown place.
    """
    if "://" not in url:
        # Without a scheme, urlsplit would read "user:password@host" as scheme and path.
        return "<URL without a scheme>"
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    netloc = parts.netloc
    userinfo, at, hostport = netloc.rpartition("@")
    if at:
        user, colon, _password = userinfo.partition(":")
        netloc = f"{user}:{_REDACTED}@{hostport}" if colon else f"{user}@{hostport}"
    query = parts.query
    if query:
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
        query = "&".join(
            f"{name}={_REDACTED if is_secret_option(name) else value}" for name, value in pairs
        )
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
