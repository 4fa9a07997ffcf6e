"""The ``django://<alias>`` and ``django-cache://<alias>`` URL schemes.

Both name a store that Django's settings already describe: ``django://`` a ``DATABASES`` alias
(PostgreSQL or a SQLite file), ``django-cache://`` the Redis server of a ``CACHES`` alias. They
are registered in the one scheme registry, so ``connect()`` and ``settings.LEASE_LOCK["URL"]``
take them like any URL; the backend built is the PostgreSQL, SQLite or Redis one.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from ...backends import Backend, backend_from_url
from ...errors import ValidationError
from .._config import warn_if_one_host
from ._settings import cache_url, database_url, one_host_silenced

__all__ = ["DjangoCache", "DjangoDatabase", "resolve_django_url"]


def _alias(url: str, scheme: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.path.strip("/") or parts.query:
        raise ValidationError(f"{url!r}: a {scheme}:// URL is {scheme}://<alias> and nothing more")
    return parts.netloc


def resolve_django_url(url: str) -> str:
    """``url`` with a ``django://`` or ``django-cache://`` alias turned into the store's own URL
    (any other URL is returned as it is)."""
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if scheme == "django":
        return database_url(_alias(url, scheme))
    if scheme == "django-cache":
        return cache_url(_alias(url, scheme))
    return url


class DjangoDatabase(Backend):
    """``django://<alias>``: the PostgreSQL or SQLite backend on that ``DATABASES`` alias.

    Only :meth:`from_url` is used: it returns the real backend, never an instance of this class.
    """

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Backend:
        """The backend of the database alias the URL names."""
        resolved = resolve_django_url(url)
        if not one_host_silenced():
            warn_if_one_host(resolved)
        return backend_from_url(resolved, **options)


class DjangoCache(DjangoDatabase):
    """``django-cache://<alias>``: the Redis backend on the server of that ``CACHES`` alias
    (Django's ``RedisCache`` or django-redis)."""
