"""Reading ``settings.LEASE_LOCK`` and turning ``django://<alias>`` into a backend URL."""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Mapping
from typing import Any, Optional

from ...connect import connect
from ...errors import ValidationError
from ...locker import Locker
from .._config import LOCKER_SETTINGS, METRICS_SETTING, connect_options

__all__ = ["DJANGO_SCHEME", "database_url", "lock_settings", "lock_table", "locker_from_settings"]

DJANGO_SCHEME = "django://"
_OTHER_KEYS = frozenset({"URL", "OPTIONS", METRICS_SETTING})
# Keys of a PostgreSQL DATABASES entry's OPTIONS that Django consumes itself; the rest are
# libpq connection parameters.
_LIBPQ_SETTINGS = (
    ("dbname", "NAME"), ("user", "USER"), ("password", "PASSWORD"), ("host", "HOST"), ("port", "PORT")
)
_DJANGO_ONLY_OPTIONS = frozenset({"isolation_level", "server_side_binding", "pool", "assume_role", "cursor_factory"})


def lock_settings() -> dict[str, Any]:
    """``settings.LEASE_LOCK`` checked: a dict of known keys (``{}`` when unset)."""
    from django.conf import settings

    config = getattr(settings, "LEASE_LOCK", None)
    if config is None:
        return {}
    if not isinstance(config, Mapping):
        raise ValidationError(f"settings.LEASE_LOCK must be a dict, not {type(config).__name__}")
    unknown = set(config) - set(LOCKER_SETTINGS) - _OTHER_KEYS
    if unknown:
        known = ", ".join(sorted({*LOCKER_SETTINGS, *_OTHER_KEYS}))
        raise ValidationError(f"settings.LEASE_LOCK has unknown key(s) {', '.join(sorted(unknown))}; known: {known}")
    if not isinstance(config.get("OPTIONS", {}), Mapping):
        raise ValidationError("settings.LEASE_LOCK['OPTIONS'] must be a dict")
    url = config.get("URL")
    if url is not None and not isinstance(url, str):
        raise ValidationError(f"settings.LEASE_LOCK['URL'] must be a str, not {type(url).__name__}")
    return dict(config)


def locker_from_settings() -> Locker:
    """A new ``Locker`` as ``settings.LEASE_LOCK`` describes it (the caller owns it).

    ``URL`` may be any ``connect()`` URL or ``django://<alias>``; without one, ``connect()``'s
    default applies (``LEASE_LOCK_URL``, else the embedded SQLite file). ``OPTIONS`` holds the
    backend's keyword options (``table=``, ``create_table=``, ...).
    """
    config = lock_settings()
    options = connect_options(config, config.get("OPTIONS", {}), prefix="", options_name="OPTIONS")
    url: Optional[str] = config.get("URL")
    if url is not None and url.startswith(DJANGO_SCHEME):
        url = database_url(url[len(DJANGO_SCHEME):])
    return connect(url, **options)


def database_url(alias: str) -> str:
    """The lease_lock URL for the database ``alias`` of ``DATABASES``.

    PostgreSQL maps to the PostgreSQL backend on a connection pool of its own (never Django's
    connection: a lease must not live or die with the request's transaction); SQLite maps to
    the SQLite backend on the same file. The live settings of the alias are used, so under the
    test runner this is the test database.
    """
    from django.db import connections

    if not alias or alias not in connections.settings:
        raise ValidationError(f"LEASE_LOCK URL django://{alias}: DATABASES has no alias {alias!r}")
    connection = connections[alias]
    database = connection.settings_dict
    if connection.vendor == "postgresql":
        return _postgres_url(database)
    if connection.vendor == "sqlite":
        return _sqlite_url(alias, database)
    raise ValidationError(
        f"LEASE_LOCK URL django://{alias}: the {connection.vendor} database engine has no lease_lock "
        "backend; use a PostgreSQL or SQLite alias, or a redis:// URL"
    )


def _postgres_url(database: Mapping[str, Any]) -> str:
    parameters: dict[str, str] = {}
    for name, setting in _LIBPQ_SETTINGS:
        if database.get(setting):
            parameters[name] = str(database[setting])
    for name, value in database.get("OPTIONS", {}).items():
        if name not in _DJANGO_ONLY_OPTIONS and isinstance(value, (str, int)) and not isinstance(value, bool):
            parameters[name] = str(value)
    # The host goes percent-encoded into the authority, so a socket directory needs no special
    # spelling; an empty HOST becomes localhost over TCP, since a URL cannot leave it out.
    host = urllib.parse.quote(parameters.pop("host", "localhost"), safe="")
    return f"postgresql://{host}/?" + urllib.parse.urlencode(parameters)


def _sqlite_url(alias: str, database: Mapping[str, Any]) -> str:
    name = database.get("NAME")
    text = "" if name is None else os.fspath(name)
    if not text or text == ":memory:" or "mode=memory" in text:
        raise ValidationError(
            f"LEASE_LOCK URL django://{alias}: an in-memory SQLite database cannot be shared by "
            "processes; give the alias a file (or its TEST a NAME), or use another URL"
        )
    return "sqlite:///" + urllib.parse.quote(os.path.abspath(text))


def lock_table() -> tuple[str, Optional[str]]:
    """The PostgreSQL table and schema the settings ask for (the backend's defaults if unset)."""
    options = lock_settings().get("OPTIONS", {})
    return options.get("table", "lease_lock"), options.get("schema")
