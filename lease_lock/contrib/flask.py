"""Flask integration: the ``LeaseLock`` extension and a ``locker`` proxy.

::

    app = Flask(__name__)
    app.config["LEASE_LOCK_URL"] = "redis://localhost:6379/0"
    LeaseLock(app)                      # or ext = LeaseLock(); ext.init_app(app)

    from lease_lock.contrib.flask import locker

    @app.post("/orders/<int:order_id>/settle")
    def settle(order_id):
        with locker.lock(f"order:{order_id}"):
            ...

Configuration keys: ``LEASE_LOCK_URL``, ``LEASE_LOCK_TTL``,
``LEASE_LOCK_MAX_HOLD``, ``LEASE_LOCK_KEY_PREFIX``, ``LEASE_LOCK_FENCING`` and
``LEASE_LOCK_OPTIONS`` (a dict of backend options such as ``table``). The store is, in this
order: ``LEASE_LOCK_URL`` in the config, the ``LEASE_LOCK_URL`` environment variable, and
``SQLALCHEMY_DATABASE_URI`` when it is PostgreSQL or a SQLite file; with none of them,
``init_app`` raises ``ValidationError``. ``init_app`` also refuses options the backend does not
take, so bad settings fail at start-up rather than on the first request.
``LEASE_LOCK_METRICS`` (``"prometheus"`` or ``"opentelemetry"``) records lock metrics.
"""

from __future__ import annotations

import atexit
import os
import urllib.parse
from collections.abc import Mapping
from typing import Any, Optional, cast

from flask import Flask, current_app
from werkzeug.local import LocalProxy

from ..connect import LOCKER_OPTIONS, connect
from ..errors import LockStateError, ValidationError
from ..locker import Locker
from ._config import check_backend_options, check_setting_names, connect_options, resolve_url, setting_errors

__all__ = ["CONFIG_PREFIX", "EXTENSION_NAME", "LeaseLock", "database_lock_url", "locker"]

#: The key of ``app.extensions`` that holds the app's locker.
EXTENSION_NAME = "lease_lock"
#: The prefix of every ``app.config`` key the extension reads.
CONFIG_PREFIX = "LEASE_LOCK_"


def database_lock_url(config: Mapping[str, Any], instance_path: str) -> Optional[str]:
    """The lease_lock URL of ``SQLALCHEMY_DATABASE_URI`` when it is PostgreSQL or a SQLite file,
    else ``None``.

    The SQLAlchemy driver (``postgresql+psycopg2://``) is dropped; a relative SQLite path is
    taken from the app's instance folder, as Flask-SQLAlchemy does.
    """
    uri = config.get("SQLALCHEMY_DATABASE_URI")
    if not isinstance(uri, str) or not uri:
        return None
    parts = urllib.parse.urlsplit(uri)
    dialect = parts.scheme.partition("+")[0].lower()
    if dialect in ("postgresql", "postgres"):
        return urllib.parse.urlunsplit(("postgresql", parts.netloc, parts.path, parts.query, ""))
    if dialect != "sqlite":
        return None
    path = urllib.parse.unquote(parts.path[1:] if parts.path.startswith("/") else parts.path)
    if not path or path == ":memory:" or "mode=memory" in parts.query:
        return None
    return "sqlite:///" + urllib.parse.quote(os.path.join(instance_path, path))


def _url_and_options(config: Mapping[str, Any], instance_path: str) -> tuple[str, dict[str, Any]]:
    # The same checks as Django's settings: a misspelt key is refused, a bad value is named by
    # its config key rather than by the connect() option it becomes.
    check_setting_names(config, prefix=CONFIG_PREFIX, where="app.config")
    given = config.get("LEASE_LOCK_OPTIONS") or {}
    errors = setting_errors(config, given if isinstance(given, Mapping) else {}, prefix=CONFIG_PREFIX,
                            shown='app.config["{}"]')
    if errors:
        raise ValidationError("; ".join(errors))
    options = connect_options(config, given, prefix=CONFIG_PREFIX, options_name="LEASE_LOCK_OPTIONS")
    url = resolve_url(
        config.get("LEASE_LOCK_URL"), "LEASE_LOCK_URL", lambda: database_lock_url(config, instance_path),
        add="app.config['LEASE_LOCK_URL'] (or a PostgreSQL or SQLite-file SQLALCHEMY_DATABASE_URI)",
    )
    check_backend_options(
        url, {name: value for name, value in options.items() if name not in LOCKER_OPTIONS},
        options_name="LEASE_LOCK_OPTIONS",
    )
    return url, options


class LeaseLock:
    """The Flask extension: one :class:`~lease_lock.Locker` per app, at
    ``app.extensions["lease_lock"]``.

    ``LeaseLock(app)`` sets the app up at once; ``LeaseLock()`` then ``init_app(app)`` suits an
    app factory (one extension object, any number of apps). Pass ``locker=`` to use a locker
    you built (it is then yours to close); otherwise the locker is built from ``app.config`` in
    ``init_app``, so a bad setting fails at start-up, and is closed at interpreter exit.
    A forked worker (gunicorn ``--preload``) gets its own heartbeat from the core, and redis-py
    reopens its connections there, but a psycopg2 pool would be shared with the parent: with
    PostgreSQL, create the app in each worker instead of preloading it.
    """

    def __init__(self, app: Optional[Flask] = None, *, locker: Optional[Locker] = None) -> None:
        if locker is not None and not isinstance(locker, Locker):
            raise ValidationError(f"locker must be a lease_lock.Locker, not {type(locker).__name__}")
        self._locker = locker
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        """Build (or adopt) the app's locker and register it under ``app.extensions``."""
        if EXTENSION_NAME in app.extensions:
            raise LockStateError(f"LeaseLock is already set up on the app {app.name!r}")
        if self._locker is not None:
            app.extensions[EXTENSION_NAME] = self._locker
            return
        url, options = _url_and_options(app.config, app.instance_path)
        built = connect(url, **options)
        atexit.register(built.close)
        app.extensions[EXTENSION_NAME] = built

    @property
    def locker(self) -> Locker:
        """The locker of the current app (needs an app context)."""
        return _current_locker()


def _current_locker() -> Locker:
    try:
        found = current_app.extensions[EXTENSION_NAME]
    except KeyError:
        raise LockStateError(
            f"LeaseLock is not set up on the app {current_app.name!r}: call LeaseLock(app) or init_app(app)"
        ) from None
    return cast(Locker, found)


#: The current app's locker (a ``werkzeug`` ``LocalProxy``; needs an app or request context).
locker: Locker = cast(Locker, LocalProxy(_current_locker))
