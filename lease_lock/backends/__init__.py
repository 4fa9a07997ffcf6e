"""Backends and the one registry that turns a URL scheme into a backend.

Built-in schemes are listed in :data:`SCHEMES` as ``"module:Class"`` strings so that no driver
is imported until a URL of that scheme is used. Third parties add theirs with
:func:`register_scheme`.
"""

from __future__ import annotations

import importlib
import urllib.parse
from typing import Any, Union

from ..errors import ValidationError
from ..validation import install_hint, redact_url
from .base import Backend, Capabilities, ExtendRequest, LockState, ReleaseWatcher
from .memory import MemoryBackend

__all__ = [
    "SCHEMES",
    "Backend",
    "Capabilities",
    "ExtendRequest",
    "LockState",
    "MemoryBackend",
    "ReleaseWatcher",
    "backend_class",
    "backend_from_url",
    "register_scheme",
]

#: URL scheme -> ``"module:Class"`` (imported on first use) or a backend class.
SCHEMES: dict[str, Union[str, type[Backend]]] = {
    "memory": "lease_lock.backends.memory:MemoryBackend",
    "sqlite": "lease_lock.backends.sqlite:SqliteBackend",
    "redis": "lease_lock.backends.redis:RedisBackend",
    "rediss": "lease_lock.backends.redis:RedisBackend",
    "redis+sentinel": "lease_lock.backends.redis:RedisBackend",
    "postgresql": "lease_lock.backends.postgres:PostgresBackend",
    "postgres": "lease_lock.backends.postgres:PostgresBackend",
    "http": "lease_lock.backends.http:HttpBackend",
    "https": "lease_lock.backends.http:HttpBackend",
    "etcd": "lease_lock.backends.etcd:EtcdBackend",
    "etcds": "lease_lock.backends.etcd:EtcdBackend",
    "mongodb": "lease_lock.backends.mongo:MongoBackend",
    "mongodb+srv": "lease_lock.backends.mongo:MongoBackend",
    # Stand-ins that read Django's settings and build the backend of the store they name.
    "django": "lease_lock.contrib.django._schemes:DjangoDatabase",
    "django-cache": "lease_lock.contrib.django._schemes:DjangoCache",
}


#: Built-in backend module -> (the driver it imports, the extra that installs it). A missing
#: driver is a setup error (``ValidationError`` naming the extra), not an outage.
_DRIVERS: dict[str, tuple[tuple[str, ...], str]] = {
    "lease_lock.backends.redis": (("redis",), "redis"),
    "lease_lock.backends.postgres": (("psycopg2",), "postgres"),
    "lease_lock.backends.http": (("requests", "urllib3"), "http"),
    "lease_lock.backends.etcd": (("requests", "urllib3"), "etcd"),
    "lease_lock.backends.mongo": (("pymongo", "bson"), "mongodb"),
}


def _import_backend_module(module_name: str, scheme: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ImportError as error:
        missing = (error.name or "").partition(".")[0]
        drivers, extra = _DRIVERS.get(module_name, ((), ""))
        if missing in drivers:
            raise ValidationError(
                f"{scheme}:// URLs need the {missing!r} package, which is not installed: "
                f"{install_hint(extra)}"
            ) from error
        raise


def register_scheme(scheme: str, backend: Union[str, type[Backend]]) -> None:
    """Make ``connect("<scheme>://...")`` build ``backend`` (a class or ``"module:Class"``)."""
    if not isinstance(scheme, str) or not scheme or not scheme.replace("+", "").isalnum():
        raise ValidationError("scheme must be a non-empty str of letters, digits and '+'")
    SCHEMES[scheme.lower()] = backend


def _resolve(scheme: str) -> type[Backend]:
    entry = SCHEMES.get(scheme)
    if entry is None:
        raise ValidationError(
            f"unknown URL scheme {scheme!r}; known: {', '.join(sorted(SCHEMES))}"
        )
    if isinstance(entry, str):
        module_name, _, class_name = entry.partition(":")
        module = _import_backend_module(module_name, scheme)
        resolved = getattr(module, class_name)
        if not (isinstance(resolved, type) and issubclass(resolved, Backend)):
            raise ValidationError(f"{entry} is not a Backend subclass")
        return resolved
    return entry


def backend_class(url: str) -> type[Backend]:
    """The backend class a URL's scheme names, imported but not built (nothing connects)."""
    if not isinstance(url, str) or not url:
        raise ValidationError("url must be a non-empty str such as 'redis://localhost:6379/0'")
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if not scheme:
        raise ValidationError(f"url {redact_url(url)!r} has no scheme (expected e.g. redis://, sqlite:///)")
    return _resolve(scheme)


def backend_from_url(url: str, **options: Any) -> Backend:
    """Build the backend a URL names; ``options`` are that backend's keyword options."""
    return backend_class(url).from_url(url, **options)
