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

Configuration keys: ``LEASE_LOCK_URL`` (default: ``connect()``'s default), ``LEASE_LOCK_TTL``,
``LEASE_LOCK_MAX_HOLD``, ``LEASE_LOCK_KEY_PREFIX``, ``LEASE_LOCK_FENCING``,
``LEASE_LOCK_OPTIONS`` (a dict of backend options such as ``table``) and ``LEASE_LOCK_METRICS``
(``"prometheus"`` or ``"opentelemetry"``: record lock metrics).
"""

from __future__ import annotations

import atexit
from collections.abc import Mapping
from typing import Any, Optional, cast

from flask import Flask, current_app
from werkzeug.local import LocalProxy

from ..connect import connect
from ..errors import LockStateError, ValidationError
from ..locker import Locker
from ._config import connect_options

__all__ = ["CONFIG_PREFIX", "EXTENSION_NAME", "LeaseLock", "locker"]

#: The key of ``app.extensions`` that holds the app's locker.
EXTENSION_NAME = "lease_lock"
#: The prefix of every ``app.config`` key the extension reads.
CONFIG_PREFIX = "LEASE_LOCK_"


def _locker_from_config(config: Mapping[str, Any]) -> Locker:
    options = connect_options(
        config, config.get("LEASE_LOCK_OPTIONS") or {}, prefix=CONFIG_PREFIX, options_name="LEASE_LOCK_OPTIONS"
    )
    url = config.get("LEASE_LOCK_URL")
    if url is not None and not isinstance(url, str):
        raise ValidationError(f"LEASE_LOCK_URL must be a str, not {type(url).__name__}")
    return connect(url or None, **options)


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
        built = _locker_from_config(app.config)
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
