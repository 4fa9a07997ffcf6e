"""The lease_lock lock service: the hosted "project locks" HTTP API over any lease_lock backend.

``create_app(backend_url, keys_file, **limits)`` returns a plain WSGI application; serve it with
``lease-lock serve`` (waitress) or any WSGI server. See ``docs/server.md``.
"""

import json
from importlib import resources
from typing import Any

from .app import LockServiceApp, create_app
from .keys import SCOPES, KeyFile, KeyRecord, create_key, list_keys, revoke_key

__all__ = [
    "SCOPES",
    "KeyFile",
    "KeyRecord",
    "LockServiceApp",
    "create_app",
    "create_key",
    "list_keys",
    "openapi_document",
    "revoke_key",
]


def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3 description of the API this package serves (extensions marked)."""
    text = resources.files(__name__).joinpath("openapi.json").read_text(encoding="utf-8")
    document: dict[str, Any] = json.loads(text)
    return document
