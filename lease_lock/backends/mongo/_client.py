"""The MongoDB backend's URL, the client it builds from one, and which driver errors are outages.

A URL names pymongo's own connection string plus the backend's options::

    mongodb://[user:password@]host[:port][,host...]/DATABASE?collection=NAME&create_indexes=false
    mongodb+srv://user:password@cluster.example.net/DATABASE

The backend's options (see ``OPTIONS``) are taken out of the query; every other option is
pymongo's and goes to ``MongoClient`` as it is, after pymongo's own check of its options (so a
misspelled one is a ``ValidationError`` here, not a warning at connect time).
"""

from __future__ import annotations

import contextlib
import urllib.parse
from typing import Any, Callable, Iterator, Mapping

import pymongo
import pymongo.errors
from pymongo.uri_parser import split_options

from ...errors import BackendUnavailableError, ValidationError
from ...validation import redact_url
from ..base import parse_bool, parse_url_options

__all__ = ["OPTIONS", "ClientPlan", "is_outage", "plan_client", "unavailable_on_outage"]



def _keyword_only(text: str) -> Any:
    raise ValueError("a URL sets the write concern with pymongo's own options w, journal and wTimeoutMS")


#: The backend's options, with the parser of each one's text in a URL's query.
OPTIONS: Mapping[str, Callable[[str], Any]] = {
    "collection": str,
    "create_indexes": parse_bool,
    "write_concern": _keyword_only,
}

#: Timeouts (ms) a client built from a URL gets unless the URL sets them: pymongo's defaults
#: (30 s to pick a server, no bound on an answer) would hold a caller far past a lock's TTL
#: while a server is unreachable or silent.
DEFAULT_TIMEOUTS = (("serverSelectionTimeoutMS", "5000"), ("connectTimeoutMS", "5000"), ("socketTimeoutMS", "10000"))

#: pymongo's URL options that set the write concern: a URL naming one of them keeps the
#: client's write concern instead of the backend's default ``w: "majority"``.
WRITE_CONCERN_OPTIONS = frozenset({"w", "wtimeoutms", "journal"})


class ClientPlan:
    """What :func:`plan_client` read from a URL: ``client_url`` (pymongo's connection string,
    the backend's options taken out and the default timeouts put in), ``database``, the
    backend's ``options`` and whether the URL set a write concern of its own."""

    def __init__(self, client_url: str, database: str, options: dict[str, Any], own_write_concern: bool) -> None:
        self.client_url = client_url
        self.database = database
        self.options = options
        self.own_write_concern = own_write_concern

    def client(self) -> Any:
        """A new ``MongoClient`` on :attr:`client_url`; it connects on first use."""
        return pymongo.MongoClient(self.client_url, connect=False)


def plan_client(url: str, overrides: Mapping[str, Any]) -> ClientPlan:
    """Split ``url`` into pymongo's connection string, the database and the backend's options
    (``overrides``, keyword options, win over the query). Raises ``ValidationError`` for a URL
    without a database, a misspelled or malformed option of either kind."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme.lower() not in ("mongodb", "mongodb+srv") or not parts.netloc:
        raise ValidationError(f"url {redact_url(url)!r} must look like mongodb://host:27017/DATABASE")
    database = urllib.parse.unquote(parts.path.lstrip("/"))
    if not database or any(character in database for character in '/\\. "$\x00'):
        raise ValidationError(
            f"mongodb URL {redact_url(url)!r} must name its database in the path: mongodb://host:27017/DATABASE"
        )
    pairs = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    ours = [(name, value) for name, value in pairs if name in OPTIONS]
    theirs = [(name, value) for name, value in pairs if name not in OPTIONS]
    options = parse_url_options("?" + urllib.parse.urlencode(ours), OPTIONS, overrides, backend="mongodb")
    named = {name.lower() for name, _ in theirs}
    theirs += [(name, value) for name, value in DEFAULT_TIMEOUTS if name.lower() not in named]
    query = urllib.parse.urlencode(theirs, safe=":,/")
    try:
        split_options(query, validate=True, warn=False)
    except (pymongo.errors.ConfigurationError, ValueError, TypeError) as error:
        raise ValidationError(f"mongodb URL {redact_url(url)!r}: {error}") from None
    client_url = urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, query, ""))
    return ClientPlan(client_url, database, options, bool(named & WRITE_CONCERN_OPTIONS))


def is_outage(error: BaseException) -> bool:
    """Whether a pymongo error means the server could not be reached or did not answer in
    time: no server could be selected, a connection was refused, reset or timed out, the
    primary stepped down (an election), or a call's time ran out (``pymongo.timeout``,
    a write concern's ``wtimeout``). Errors of the statement itself are not outages."""
    if isinstance(error, pymongo.errors.ConnectionFailure):
        return True
    return isinstance(error, pymongo.errors.PyMongoError) and bool(getattr(error, "timeout", False))


@contextlib.contextmanager
def unavailable_on_outage(where: str) -> Iterator[None]:
    """Raise ``BackendUnavailableError`` (the driver's error as its cause) from the pymongo
    errors that mean an outage; ``where`` names the collection in the message."""
    try:
        yield
    except pymongo.errors.PyMongoError as error:
        if not is_outage(error):
            raise
        detail = " ".join(str(error).split()) or type(error).__name__
        raise BackendUnavailableError(
            f"MongoDB backend unavailable (collection {where}): {detail}", backend="mongodb"
        ) from error
