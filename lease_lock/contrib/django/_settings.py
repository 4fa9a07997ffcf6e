"""Reading ``settings.LEASE_LOCK`` and turning ``django://<alias>`` into a backend URL."""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Mapping
from typing import Any, Optional

from django.db import DEFAULT_DB_ALIAS

from ...connect import connect
from ...errors import ValidationError
from ...locker import Locker
from .._config import check_setting_names, connect_options, resolve_url

__all__ = [
    "DJANGO_SCHEME",
    "REDIS_CACHE_BACKENDS",
    "cache_url",
    "database_url",
    "lock_settings",
    "lock_table",
    "lock_url",
    "locker_from_settings",
    "one_host_silenced",
]

DJANGO_SCHEME = "django://"
# Keys of a PostgreSQL DATABASES entry's OPTIONS that Django consumes itself; the rest are
# libpq connection parameters.
_LIBPQ_SETTINGS = (
    ("dbname", "NAME"), ("user", "USER"), ("password", "PASSWORD"), ("host", "HOST"), ("port", "PORT")
)
_DJANGO_ONLY_OPTIONS = frozenset({"isolation_level", "server_side_binding", "pool", "assume_role", "cursor_factory"})
#: The ``CACHES`` backends whose server ``django-cache://<alias>`` can hold locks in.
REDIS_CACHE_BACKENDS = frozenset({"django.core.cache.backends.redis.RedisCache", "django_redis.cache.RedisCache"})
_SETTINGS_TO_ADD = 'settings.LEASE_LOCK["URL"] (e.g. "django://default" or "django-cache://default")'


def lock_settings() -> dict[str, Any]:
    """``settings.LEASE_LOCK`` checked: a dict of known keys (``{}`` when unset)."""
    from django.conf import settings

    config = getattr(settings, "LEASE_LOCK", None)
    if config is None:
        return {}
    if not isinstance(config, Mapping):
        raise ValidationError(f"settings.LEASE_LOCK must be a dict, not {type(config).__name__}")
    check_setting_names(config, prefix="", where="settings.LEASE_LOCK")
    if not isinstance(config.get("OPTIONS", {}), Mapping):
        raise ValidationError("settings.LEASE_LOCK['OPTIONS'] must be a dict")
    url = config.get("URL")
    if url is not None and not isinstance(url, str):
        raise ValidationError(f"settings.LEASE_LOCK['URL'] must be a str, not {type(url).__name__}")
    return dict(config)


def lock_url(config: Optional[Mapping[str, Any]] = None) -> str:
    """The store URL as configured: ``LEASE_LOCK["URL"]``, else ``LEASE_LOCK_URL``, else
    ``django://default`` when that database is PostgreSQL or a SQLite file.

    Nothing usable is a ``ValidationError`` naming the setting to add; a SQLite store is logged
    once at WARNING (it coordinates one host only) unless the site silenced that check (see
    :func:`one_host_silenced`). ``django://`` and ``django-cache://`` URLs are returned as they
    are (``connect()`` resolves them).
    """
    config = lock_settings() if config is None else config
    return resolve_url(
        config.get("URL"), 'settings.LEASE_LOCK["URL"]', _default_database, add=_SETTINGS_TO_ADD,
        warn=not one_host_silenced(),
    )


def one_host_silenced() -> bool:
    """Whether the site silenced the one-host check (``lease_lock.W001`` in
    ``SILENCED_SYSTEM_CHECKS``): it runs on one host, so the log need not say it either."""
    from django.conf import settings

    return "lease_lock.W001" in getattr(settings, "SILENCED_SYSTEM_CHECKS", ())


def _default_database() -> Optional[str]:
    from django.db import connections

    if DEFAULT_DB_ALIAS not in connections.settings:
        return None
    try:
        database_url(DEFAULT_DB_ALIAS)
    except ValidationError:
        return None  # another engine, or SQLite in memory: not a store processes can share
    return DJANGO_SCHEME + str(DEFAULT_DB_ALIAS)


def locker_from_settings() -> Locker:
    """A new ``Locker`` as ``settings.LEASE_LOCK`` describes it (the caller owns it).

    ``URL`` may be any ``connect()`` URL, ``django://<alias>`` (a ``DATABASES`` alias) or
    ``django-cache://<alias>`` (the Redis server of a ``CACHES`` alias); see :func:`lock_url`
    for what applies without one. ``OPTIONS`` holds the backend's keyword options
    (``table=``, ``create_table=``, ...).
    """
    config = lock_settings()
    options = connect_options(config, config.get("OPTIONS", {}), prefix="", options_name="OPTIONS")
    return connect(lock_url(config), **options)


def cache_url(alias: str) -> str:
    """The ``redis://`` URL of the server behind the ``CACHES`` alias ``alias``.

    The alias must use Django's ``RedisCache`` or django-redis; with several servers in
    ``LOCATION`` the first (the one written to) is used. A ``db`` or ``PASSWORD`` in the
    alias's ``OPTIONS`` is carried over when the location itself has none.
    """
    from django.conf import settings

    caches = getattr(settings, "CACHES", {}) or {}
    name = f"django-cache://{alias}"
    if not alias or alias not in caches:
        raise ValidationError(f"LEASE_LOCK URL {name}: CACHES has no alias {alias!r}")
    entry = caches[alias]
    if entry.get("BACKEND") not in REDIS_CACHE_BACKENDS:
        raise ValidationError(
            f"LEASE_LOCK URL {name}: the alias uses {entry.get('BACKEND')!r}; it must use one of "
            f"{', '.join(sorted(REDIS_CACHE_BACKENDS))}"
        )
    location = entry.get("LOCATION")
    if isinstance(location, str):
        location = location.replace(";", ",").split(",")
    servers = [str(server).strip() for server in location or () if str(server).strip()]
    if not servers:
        raise ValidationError(f"LEASE_LOCK URL {name}: the alias has no LOCATION")
    parts = urllib.parse.urlsplit(servers[0])
    if parts.scheme not in ("redis", "rediss"):
        raise ValidationError(
            f"LEASE_LOCK URL {name}: its LOCATION {servers[0]!r} is not a redis:// or rediss:// URL"
        )
    options = {str(key).lower(): value for key, value in (entry.get("OPTIONS") or {}).items()}
    netloc, path = parts.netloc, parts.path
    if not path.strip("/") and options.get("db") is not None:
        path = f"/{int(options['db'])}"
    if options.get("password") and "@" not in netloc:
        netloc = ":" + urllib.parse.quote(str(options["password"]), safe="") + "@" + netloc
    return urllib.parse.urlunsplit((parts.scheme, netloc, path, parts.query, ""))


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
