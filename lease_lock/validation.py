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
from collections.abc import Iterable
from datetime import timedelta
from typing import Any, Optional

from .errors import ValidationError

__all__ = [
    "MAX_DURATION",
    "MAX_KEY_BYTES",
    "MAX_LIMIT",
    "check_bool",
    "check_cancel",
    "check_duration",
    "check_key",
    "check_limit",
    "check_optional_duration",
    "check_owner",
    "check_token",
    "check_ttl",
    "describe_token",
    "escape_text",
    "install_hint",
    "is_secret_option",
    "parse_duration",
    "redact_url",
    "unknown_option_error",
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


#: The most leases one counting key admits at once (see ``limit``).
MAX_LIMIT = 1_000_000


def check_limit(value: object, name: str = "limit") -> int:
    """How many leases a key admits at once: an ``int`` from 1 (an exclusive lock) to
    :data:`MAX_LIMIT`."""
    if type(value) is not int or not 1 <= value <= MAX_LIMIT:
        shown = repr(value) if type(value) in (int, float, bool) else _type_name(value)
        raise ValidationError(
            f"{name} must be an int from 1 to {MAX_LIMIT:,} (how many leases the key admits at once), not {shown}"
        )
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


#: ``name=value`` in a query string or a libpq-style connection string (a value may be quoted).
#: A scheme missing its "://" in part: ``redis//``, ``redis:/``.
_MISTYPED_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:?/+")
_TEXT_PAIR = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?P<equals>\s*=\s*)(?P<value>'(?:[^'\\]|\\.)*'|[^\s&;]*)")


def _redact_text(text: str) -> str:
    """Text that is not a ``scheme://`` URL with what looks like credentials masked."""
    head, at, tail = text.rpartition("@")
    if at:
        # "redis//user:pass/word@host": after a mistyped scheme, everything from the first ":"
        # to the last "@" may be the password (which may hold "/" and "@" itself).
        scheme = _MISTYPED_SCHEME.match(head)
        before = scheme.group(0) if scheme else ""
        user, colon, _password = head[len(before) :].partition(":")
        text = f"{before}{user}{':' + _REDACTED if colon else ''}@{tail}"
    return _TEXT_PAIR.sub(
        lambda match: (
            f"{match['name']}{match['equals']}{_REDACTED}" if is_secret_option(match["name"]) else match.group(0)
        ),
        text,
    )


def redact_url(url: str) -> str:
    """``url`` with its password and every credential-bearing query value replaced by ``***``.

    Used wherever a URL reaches a message, a ``repr`` or a log line. Text without a scheme (a
    mistyped ``redis//host``, a connection string) is shown with the same parts masked: the
    password before an ``@`` and the value of every credential-bearing ``name=value`` pair.
    """
    if "://" not in url:
        # Without a scheme, urlsplit would read "user:password@host" as scheme and path.
        return _redact_text(url)
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


def unknown_option_error(
    what: str, names: Iterable[str], known: Iterable[str], *, listing: Optional[str] = None
) -> ValidationError:
    """The error for options nobody accepts: each name, the known one it most resembles (a typo
    such as ``tll`` or ``ttl_seconds`` for ``ttl``) and the known names.

    ``what`` says whose options they are (``"redis"``, ``"redis URL"``; empty for the options
    of a lock); ``listing`` replaces the plain list of known names when they come in groups.
    """
    import difflib  # only on this error path: ``import lease_lock`` stays light

    choices = sorted(set(known))
    parts = []
    for name in sorted(set(names)):
        close = difflib.get_close_matches(name, choices, n=1, cutoff=0.6) or [
            # A name with a unit or a qualifier added or dropped: ttl_seconds, timeout_s.
            choice for choice in choices if name.startswith(f"{choice}_") or choice.startswith(f"{name}_")
        ][:1]
        parts.append(f"{name!r} (did you mean {close[0]!r}?)" if close else repr(name))
    noun = f"{what} option" if what else "option"
    if len(parts) > 1:
        noun += "s"
    # ``unknown`` and ``known`` let a caller that passed the options on say more (connect()).
    return ValidationError(
        f"unknown {noun} {', '.join(parts)}; known: {listing or ', '.join(choices) or 'none'}",
        unknown=tuple(sorted(set(names))),
        known=tuple(choices),
    )


def install_hint(extra: str) -> str:
    """How to install the ``extra`` of lease_lock, said the way this copy was installed.

    From a checkout (an editable or local install, as the README does it): ``pip install -e
    '/path/to/checkout[extra]'``, which works from any directory; otherwise the package's
    name with the extra. Both are named when it is unknown how the package got here.
    """
    import json
    from importlib import metadata  # only on this error path: ``import lease_lock`` stays light

    # The installed copy's metadata says where it came from. A checkout's own build metadata
    # (lease_lock.egg-info, found first when the checkout is the current directory) does not.
    found = [item.read_text("direct_url.json") for item in metadata.distributions(name="lease_lock")]
    text = next((item for item in found if item), None)
    origin: dict[str, Any] = {}
    if text:
        try:
            origin = json.loads(text)
        except ValueError:
            origin = {}
    url = origin.get("url", "") if isinstance(origin, dict) else ""
    if isinstance(url, str) and url.startswith("file://"):
        path = urllib.parse.unquote(urllib.parse.urlsplit(url).path)
        editable = bool((origin.get("dir_info") or {}).get("editable"))
        return f"pip install {'-e ' if editable else ''}'{path}[{extra}]'"
    if text is None:
        return f"pip install -e '.[{extra}]' in the lease_lock checkout (or pip install 'lease_lock[{extra}]')"
    return f"pip install 'lease_lock[{extra}]'"


#: What ``escape_text`` writes for the controls that have a short form.
_SHORT_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escape_text(text: str) -> str:
    """``text`` for a terminal or a log line: one line, and no control sequence.

    Every character that is not printable (newlines, carriage returns, tabs, ESC, other
    control and format characters) is written as Python writes it in a ``repr``: ``\\n``,
    ``\\r``, ``\\t``, ``\\x1b``, ``\\u202e``; a backslash is doubled, so an escaped text
    can never pass for another. Printable text (non-ASCII letters included) is unchanged.
    """
    if text.isprintable() and "\\" not in text:
        return text
    return "".join(
        _SHORT_ESCAPES.get(char) or (char if char.isprintable() else repr(char)[1:-1]) for char in text
    )
