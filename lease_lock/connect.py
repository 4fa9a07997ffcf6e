"""``lease_lock.connect()``: a :class:`~lease_lock.Locker` from a URL."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Optional

from .errors import ValidationError
from .options import LOCKER_OPTIONS, check_locker_options
from .validation import unknown_option_error

if TYPE_CHECKING:
    from .locker import Locker

__all__ = ["LOCKER_OPTIONS", "check_locker_options", "connect", "default_url"]


def default_url() -> str:
    """The URL ``connect()`` uses with no argument: ``LEASE_LOCK_URL``, else the embedded
    SQLite file in the user's state directory."""
    url = os.environ.get("LEASE_LOCK_URL")
    if url:
        return url
    from .backends.sqlite import default_url as embedded_url

    return embedded_url()


def connect(url: Optional[str] = None, **options: Any) -> Locker:
    """A ``Locker`` on the backend that ``url`` names.

    Options named like ``Locker`` parameters go to the ``Locker``; the rest go to the backend
    (for example ``table=``, ``api_key=``, ``wait_for_replicas=``); an unknown option is a
    ``ValidationError``. With no ``url``: ``LEASE_LOCK_URL``, else the embedded SQLite default.
    The locker owns the backend it built: ``locker.close()`` closes it.
    """
    # Imported here, not at the top: ``import lease_lock`` loads this module, and a program
    # pays for the core and the backend registry only once it connects.
    from .backends import backend_from_url
    from .locker import Locker

    if url is not None and not isinstance(url, str):
        raise ValidationError(f"url must be a str, not {type(url).__name__}")
    locker_options = {name: options.pop(name) for name in list(options) if name in LOCKER_OPTIONS}
    # Check the Locker's settings first: a bad one must fail before the backend connects or
    # creates anything.
    check_locker_options(**locker_options)
    url = url or default_url()
    try:
        backend = backend_from_url(url, **options)
    except ValidationError as error:
        unknown: tuple[str, ...] = getattr(error, "unknown", ())
        if not unknown or not set(unknown) <= set(options):
            raise
        # The backend knows only its own options; a typo may be of a Locker option (tll).
        known: tuple[str, ...] = getattr(error, "known", ())
        scheme = url.partition(":")[0]
        listing = f"Locker options {', '.join(sorted(LOCKER_OPTIONS))}; {scheme} options {', '.join(known) or 'none'}"
        raise unknown_option_error("connect()", unknown, {*LOCKER_OPTIONS, *known}, listing=listing) from None
    try:
        return Locker(backend, owns_backend=True, **locker_options)
    except BaseException:
        backend.close()
        raise
