"""The WSGI application of the lock service: routing, authentication, budgets and the wire format.

No web framework: one callable that parses the request, checks the credential, counts the
request against its project's budget, validates every input, and asks :class:`LockService`.
Every answer is JSON (``{"error", "code"}`` for errors) except the bodiless 204s. A store that
cannot be reached (:class:`~lease_lock.errors.BackendUnavailableError`) gives 503
``unavailable`` (fail closed); any other exception is a bug of ours or of the store and gives a
500 ``internal`` whose body says nothing more (the traceback goes to the log). No input can
produce a 5xx.

``GET /healthz``, ``GET /readyz`` and (with ``metrics=True``) ``GET /metrics`` need no
credential and spend no budget. Every answer carries the request id (the client's valid one,
on every answer including 401 and 429, or a new one), and each request makes one access-log
line with its route template and that id, never its path, written when the server closes the
answer (once it has the answer to send).

Order of checks: credential (401, counts for no project) -> budget (429; every authenticated
request counts against one of its project's budgets, rejected ones included, see
:func:`budget_of`) -> route (404/405) -> scope (403) -> inputs (400/413)
-> the lock operation (201/200/204/409/503).
"""

from __future__ import annotations

import functools
import json
import logging
import math
import re
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Union

from ..backends import backend_from_url
from ..backends.base import Backend, LineGrant
from ..backends.service import ServiceStore
from ..errors import BackendUnavailableError
from ..validation import MAX_LIMIT, check_owner
from ..wire import (
    HEADER_ADOPT,
    HEADER_EXPIRES_IN,
    HEADER_OWNER,
    HEADER_PREFER,
    HEADER_PREFERENCE_APPLIED,
    HEADER_RELEASED,
    HEADER_REQUEST_ID,
    HEADER_TOKEN,
    HEADER_WAIT,
    HEADER_WAIT_STEP,
    HEADER_WAITED,
    KEY_PATTERN,
    MAX_TTL,
    MIN_TTL,
    wait_text,
)
from ._logs import log_access
from .keys import KeyFile, KeyRecord, PathLike
from .metrics import Metrics
from .ratelimit import RateLimiter
from .service import Conflict, Grant, Holder, LockService, Place, ReservedKeyError
from .waits import WAIT_STEP, WaitRoom, parse_wait_preference

__all__ = ["BUDGETS", "LockServiceApp", "budget_of", "create_app", "format_time"]

_log = logging.getLogger("lease_lock.server")
# Read by the readiness probe; never written.
_READY_PROBE_KEY = "lease-lock-readyz"
_MAX_OWNER = 200
_REASONS = {
    200: "OK",
    201: "Created",
    204: "No Content",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Payload Too Large",
    429: "Too Many Requests",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
}
_STATUS_LINES = {status: f"{status} {reason}" for status, reason in _REASONS.items()}
# The form ``str(uuid.UUID(...))`` gives, which needs no parsing to normalise.
_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# The body every client sends, ``{"ttl_seconds": N}``, written as JSON allows it (JSON's four
# whitespace characters, no leading zeros): read without the JSON parser, to the same value.
_JSON_SPACE = rb"[ \t\n\r]*"
_TTL_ONLY = re.compile(
    _JSON_SPACE + rb"\{" + _JSON_SPACE + rb'"ttl_seconds"' + _JSON_SPACE + rb":" + _JSON_SPACE
    + rb"(0|[1-9][0-9]{0,17})" + _JSON_SPACE + rb"\}" + _JSON_SPACE
)

StartResponse = Callable[..., Any]

#: The separate per-project budgets, each of ``rate_limit`` requests per window.
BUDGETS = ("read", "acquire", "hold")


def budget_of(method: str, *, write_allowed: bool) -> str:
    """The budget a request of ``method`` spends: ``read``, ``acquire`` or ``hold``.

    Renewals and releases (``PATCH``/``DELETE``) spend ``hold``, acquisitions ``acquire`` and
    everything else ``read``, so that neither a flood of reads nor a crowd of would-be holders
    can starve the renewals that keep granted leases alive. A key that may not write spends
    ``read`` whatever it sends: a read-only key can never touch the writers' budgets.
    """
    if not write_allowed:
        return "read"
    if method == "POST":
        return "acquire"
    if method in ("PATCH", "DELETE"):
        return "hold"
    return "read"


@dataclass
class _Response:
    status: int
    body: Optional[dict[str, Any]] = None
    headers: list[tuple[str, str]] = field(default_factory=list)
    text: Optional[str] = None  # a plain-text body instead of JSON (the metrics)
    encoded: Optional[bytes] = None  # a JSON body already written (the lease answers)


class _Reject(Exception):
    """A request refused with an error status; becomes the JSON error body.

    ``takeover_in`` is the conflict's (see :class:`Conflict`) when the refusal is one.
    """

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        headers: Iterable[tuple[str, str]] = (),
        takeover_in: Optional[float] = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.takeover_in = takeover_in
        self.response = _Response(status, {"error": message, "code": code}, list(headers))


# The date part of the second format_time wrote last (one tuple, read and replaced whole).
_last_second: tuple[int, str] = (-1, "")


def format_time(epoch: float) -> str:
    """RFC 3339 UTC with a ``Z``, to the millisecond, rounded down (never later than the truth)."""
    global _last_second
    seconds, millis = divmod(math.floor(epoch * 1000), 1000)
    second, stamp = _last_second
    if second != seconds:
        # Most answers fall in the same second as the one before: format the date once per second.
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S.", time.gmtime(seconds))
        _last_second = (seconds, stamp)
    return f"{stamp}{millis:03d}Z"


def _environ_name(name: str) -> str:
    """The WSGI environ key of request header ``name``."""
    return "HTTP_" + name.upper().replace("-", "_")


# The environ keys of the headers the service reads, made once rather than per request.
_ENV_ADOPT = _environ_name(HEADER_ADOPT)
_ENV_AUTHORIZATION = _environ_name("Authorization")
_ENV_OWNER = _environ_name(HEADER_OWNER)
_ENV_PREFER = _environ_name(HEADER_PREFER)
_ENV_REQUEST_ID = _environ_name(HEADER_REQUEST_ID)
_ENV_TOKEN = _environ_name(HEADER_TOKEN)


def _header(environ: dict[str, Any], environ_name: str) -> Optional[str]:
    """The text of a request header by its environ key (``_ENV_...``), ``None`` when absent."""
    value = environ.get(environ_name)
    return value if isinstance(value, str) else None


def _request_line_path(environ: dict[str, Any]) -> Optional[str]:
    """The request target as the client sent it, where the WSGI server passes it on."""
    raw = environ.get("RAW_URI") or environ.get("REQUEST_URI")
    return raw if isinstance(raw, str) and raw else None


def _raw_path(environ: dict[str, Any], raw: Optional[str]) -> str:
    """The request path still percent-encoded, so an encoded ``/`` stays inside its segment
    (``raw``: the request target as the client sent it, see :func:`_request_line_path`)."""
    if raw is None:
        return urllib.parse.quote(environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", ""))
    path = raw.split("?", 1)[0]
    if "://" in path:  # absolute-form request target
        path = "/" + path.split("://", 1)[1].partition("/")[2]
    script = environ.get("SCRIPT_NAME", "")
    if not script:  # the application at the root: nothing to strip (and nothing to quote)
        return path
    script = urllib.parse.quote(script)
    return path[len(script) :] if path.startswith(script) else path


_LIST_ROUTE = "/locks"
_KEY_ROUTE = "/locks/{key}"
_LEASE_ROUTE = "/locks/{key}/lease"


def _route_of(segments: list[str]) -> str:
    """The route template of a path split at its ``/`` for logs and metrics (``-`` when none
    matches)."""
    count = len(segments)
    if count < 2 or segments[1] != "locks" or segments[0]:
        return "-"
    if count == 2:
        return _LIST_ROUTE
    if count == 3:
        return _KEY_ROUTE
    return _LEASE_ROUTE if count == 4 and segments[3] == "lease" else "-"


def _canonical_uuid(value: str) -> Optional[str]:
    """``value`` as a canonical UUID, or ``None`` when it is not one."""
    if _CANONICAL_UUID.fullmatch(value):
        return value  # already what the parse below would give (what clients usually send)
    try:
        return str(uuid.UUID(value))
    except ValueError:
        return None


def _uuid(value: Optional[str], what: str, code: str) -> Optional[str]:
    if value is None:
        return None
    parsed = _canonical_uuid(value)
    if parsed is None:
        raise _Reject(400, code, f"{what} must be a UUID")
    return parsed


@functools.lru_cache(maxsize=1024)
def _decoded_owner(raw: str) -> Optional[str]:
    """The owner label of an ``X-Lease-Lock-Owner`` header, ``None`` when it is not valid.

    A client sends the same label with each of its acquisitions, so the decoded labels are
    kept (a pure function of the header's text).
    """
    try:
        owner = check_owner(urllib.parse.unquote(raw, errors="strict"), HEADER_OWNER)
    except (UnicodeDecodeError, ValueError):
        return None
    return owner if len(owner) <= _MAX_OWNER else None


@functools.lru_cache(maxsize=1024)
def _decoded_key(segment: str) -> Optional[str]:
    """The key a path segment names, ``None`` when it names no valid key.

    Clients use the same lock names again and again, so the decoded names are kept (a pure
    function of the segment's text).
    """
    try:
        key = urllib.parse.unquote(segment, errors="strict")
    except UnicodeDecodeError:
        return None
    return key if KEY_PATTERN.fullmatch(key) else None


def _lease_response(
    status: int, grant: Grant, headers: Optional[list[tuple[str, str]]] = None, limit: Optional[int] = None
) -> _Response:
    """A granted or renewed lease, ``{"expires_at", "fencing_token"}``, its JSON written
    directly (the text is our own time and an int); a place of a counting key says its
    ``limit`` too, so that a client knows the service granted a place, not the key."""
    counted = "" if limit is None else f', "limit": {int(limit)}'
    encoded = (
        f'{{"expires_at": "{format_time(grant.expires_at)}", "fencing_token": {int(grant.fence)}{counted}}}'.encode()
    )
    return _Response(status, headers=headers or [], encoded=encoded)


def _place_body(place: Place) -> dict[str, Any]:
    body: dict[str, Any] = {"expires_at": format_time(place.expires_at), "fencing_token": place.fence}
    if place.owner:
        body["owner"] = place.owner
    body["expires_in"] = round(place.takeover_in, 3)
    return body


def _holder_body(holder: Holder, *, with_key: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"key": holder.key} if with_key else {}
    body["held"] = holder.held
    if holder.held and holder.expires_at is not None:
        body["expires_at"] = format_time(holder.expires_at)
        body["fencing_token"] = holder.fence
        if holder.owner:
            body["owner"] = holder.owner
        body["limit"] = holder.limit
        body["holders"] = [_place_body(place) for place in holder.places]
    return body


class _Answer(list[bytes]):
    """The body of one answer, which writes the request's access line when the server closes it.

    A WSGI server closes the body once it has handed the body to the connection, so the line
    is written after the answer is on its way: its system call no longer stands between the
    request and its answer, and the client's next request can overlap it.
    """

    __slots__ = ("_line",)

    def __init__(self, body: list[bytes], line: tuple[str, str, int, str, str, float]) -> None:
        super().__init__(body)
        self._line: Optional[tuple[str, str, int, str, str, float]] = line

    def close(self) -> None:
        """Write the access line (once; a second close writes nothing)."""
        line, self._line = self._line, None
        if line is not None:
            log_access(*line)


def _applied(wait: float) -> list[tuple[str, str]]:
    """The header saying the server honoured ``Prefer: wait`` for ``wait`` seconds."""
    return [(HEADER_PREFERENCE_APPLIED, f"wait={wait_text(wait)}")]


def _waited(seconds: float) -> str:
    """How long a request was held before the store request that granted it was sent, rounded
    down: the client then knows the lease started no earlier than its sending plus this."""
    return f"{math.floor(seconds * 1000) / 1000:.3f}"


class LockServiceApp:
    """The WSGI callable. Build it with :func:`create_app`; it is safe across threads."""

    def __init__(
        self,
        service: LockService,
        keys: KeyFile,
        limiter: RateLimiter,
        *,
        max_body: int = 16 * 1024,
        waits: Optional[WaitRoom] = None,
        metrics: bool = False,
    ) -> None:
        self.service = service
        self.keys = keys
        self.limiter = limiter
        self.max_body = max_body
        self.waits = waits
        self.metrics = Metrics(lambda: waits.waiting if waits is not None else 0) if metrics else None
        # The paths of the routes that need no service key (the metrics only when served).
        self._operation_paths = frozenset(("/healthz", "/readyz", *(("/metrics",) if metrics else ())))
        # The headers that end every answer: no caching, and the wait extension's announcement.
        self._closing_headers = [("Cache-Control", "no-store")]
        if waits is not None and waits.max_waits:
            self._closing_headers += [(HEADER_WAIT, str(int(waits.max_wait))), (HEADER_WAIT_STEP, wait_text(WAIT_STEP))]

    def close(self) -> None:
        """Stop the release notifications of the wait extension (the store stays open)."""
        if self.waits is not None:
            self.waits.close()

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> _Answer:
        """Serve one request."""
        started = time.monotonic()
        context: dict[str, str] = {"project": "-", "route": "-"}
        method = environ.get("REQUEST_METHOD", "")
        # Read before anything can refuse the request, so that a 401, a 429 or a 500 names the
        # client's request too; an id that is not a UUID is refused later, in its turn.
        request_id = _header(environ, _ENV_REQUEST_ID)
        valid_id = None if request_id is None else _canonical_uuid(request_id)
        if valid_id is not None:
            context["request_id"] = valid_id
        try:
            response = self._handle(environ, method, context)
        except _Reject as reject:
            response = reject.response
        except Exception:  # noqa: BLE001 - the last line of defence of a server thread
            # A bug of ours, never a bad input: those are all rejected above with a 4xx.
            _log.exception(
                "internal error on %s %s (request_id=%s)", method, context["route"], context.get("request_id", "-")
            )
            response = _Response(500, {"error": "internal server error", "code": "internal"})
        # Every answer names its request: the client's id, or one made here for the log.
        request_id = context.get("request_id") or str(uuid.uuid4())
        duration = time.monotonic() - started
        if self.metrics is not None:
            self.metrics.observe(context["route"], method, response.status, context["project"], duration)
        headers = list(response.headers)
        headers.append((HEADER_REQUEST_ID, request_id))
        if response.text is not None:
            payload = response.text.encode()
            headers.append(("Content-Type", "text/plain; version=0.0.4; charset=utf-8"))
        elif response.encoded is not None or response.body is not None:
            payload = response.encoded if response.encoded is not None else json.dumps(response.body).encode()
            headers.append(("Content-Type", "application/json"))
        else:
            payload = b""
        if response.status != 204:
            # RFC 9110: a 204 carries no Content-Length.
            headers.append(("Content-Length", str(len(payload))))
        headers += self._closing_headers
        start_response(_STATUS_LINES[response.status], headers)
        line = (method, context["route"], response.status, context["project"], request_id, duration)
        # RFC 9110: an answer to HEAD has headers only; a body would be read as the start of
        # the next response on a kept-alive connection.
        return _Answer([] if method == "HEAD" else [payload], line)

    # -- the steps of one request --------------------------------------------------------------

    def _operations(self, path: str, method: str, context: dict[str, str]) -> _Response:
        """The routes without a service key (a path of ``_operation_paths``): health, readiness
        and (when on) the metrics."""
        context["route"] = path
        self._allow(method, ("GET",))
        if path == "/healthz":
            return _Response(200, {"status": "ok"})
        if path == "/metrics" and self.metrics is not None:
            return _Response(200, text=self.metrics.render())
        try:
            # A read of a key nobody uses: the store answers, and nothing is written.
            self.service.backend.inspect(_READY_PROBE_KEY)
        except Exception:  # noqa: BLE001 - whatever stops the store from answering means "not ready"
            _log.exception("readiness probe: the lock store does not answer")
            if self.metrics is not None:
                self.metrics.store_error()
            raise _Reject(503, "unavailable", "the lock store is unavailable") from None
        return _Response(200, {"status": "ready"})

    def _handle(self, environ: dict[str, Any], method: str, context: dict[str, str]) -> _Response:
        request_line_path = _request_line_path(environ)
        path = _raw_path(environ, request_line_path)  # once per request: it is on every request's path
        if path in self._operation_paths:
            return self._operations(path, method, context)
        segments = path.split("/")
        route = context["route"] = _route_of(segments)
        record = self._authenticate(environ)
        context["project"] = record.project
        budget_name = budget_of(method, write_allowed=record.allows(True))
        budget = self._store(self.limiter.hit, f"{record.project}/{budget_name}")
        if not budget.allowed:
            raise _Reject(
                429,
                "lock_rate_limited",
                f"project {budget_name} budget of {self.limiter.limit} requests per window is spent",
                [("Retry-After", str(budget.retry_after))],
            )
        if "request_id" not in context and _header(environ, _ENV_REQUEST_ID) is not None:
            # Parsed once, on arrival (see __call__): an id that is there but was not taken is no UUID.
            raise _Reject(400, "invalid_request", f"{HEADER_REQUEST_ID} must be a UUID")
        if route == _LIST_ROUTE:
            self._allow(method, ("GET",))
            self._scope(record, write=False)
            return self._list(environ, record.project)
        if route == "-":
            if request_line_path is None and len(segments) > 3 and segments[:2] == ["", "locks"]:
                # Without the raw request line (wsgiref, some servers) PATH_INFO is already
                # decoded, so an extra "/" may have been a %2F inside the key: that makes an
                # invalid key rather than an unknown resource.
                raise _Reject(400, "invalid_key", "key must be 1 to 128 of A-Z a-z 0-9 . _ : - (no '/')")
            raise _Reject(404, "not_found", "no such resource")
        lease = route == _LEASE_ROUTE
        self._allow(method, ("POST", "PATCH", "DELETE") if lease else ("GET", "DELETE"))
        self._scope(record, write=method != "GET")
        key = self._key(segments[2])
        project = record.project
        wait = parse_wait_preference(_header(environ, _ENV_PREFER)) if self.waits is not None else None
        # Waitress tells a request whose client closed its connection (see serving.py).
        gone = environ.get("waitress.client_disconnected") if wait else None
        if not lease:
            if method == "GET":
                return self._read(project, key, wait, gone)
            return self._released(project, key, self._store(self.service.force_release, project, key))
        token = _uuid(_header(environ, _ENV_TOKEN), HEADER_TOKEN, "invalid_token")
        if token is None:
            raise _Reject(400, "invalid_token", f"{HEADER_TOKEN} header is required")
        if method == "DELETE":
            return self._released(project, key, self._store(self.service.release, project, key, token))
        ttl, limit = self._lease_request(environ, acquire=method == "POST")
        if method == "POST":
            owner = self._owner(environ)
            claim = _uuid(_header(environ, _ENV_ADOPT), HEADER_ADOPT, "invalid_token")
            if claim is not None:
                if limit is not None:
                    # The request is well formed; what it asks for (a place) is not what an
                    # adoption grants (the key itself).
                    raise _Reject(
                        409, "limit_mismatch", f"limit={limit} with {HEADER_ADOPT}: an adoption grants the key "
                        "itself (limit=1)"
                    )
                # One attempt: an adoption that finds another holder is a duplicate, which
                # waiting would not make less of one.
                return _lease_response(
                    201, self._store(self.service.adopt, project, key, claim, token, ttl, owner)
                )
            return self._acquire(project, key, token, ttl, owner, wait, gone, limit)
        grant = self._store(self.service.renew, project, key, token, ttl)
        return _lease_response(200, grant)

    def _authenticate(self, environ: dict[str, Any]) -> KeyRecord:
        # Only ``Authorization: Bearer``; an ``apikey`` header never authenticates.
        scheme, _, credential = (_header(environ, _ENV_AUTHORIZATION) or "").strip().partition(" ")
        record = None
        if scheme.lower() == "bearer" and credential.strip():
            record = self.keys.authenticate(credential.strip())
        if record is None:
            raise _Reject(
                401, "unauthorized", "a valid service key is required (Authorization: Bearer)"
            )
        return record

    @staticmethod
    def _allow(method: str, allowed: tuple[str, ...]) -> None:
        if method not in allowed:
            raise _Reject(
                405,
                "method_not_allowed",
                f"method {method or '?'} not allowed here",
                [("Allow", ", ".join(allowed))],
            )

    @staticmethod
    def _scope(record: KeyRecord, *, write: bool) -> None:
        if not record.allows(write):
            raise _Reject(403, "forbidden", f"scope {record.scope} does not allow this operation")

    @staticmethod
    def _key(segment: str) -> str:
        key = _decoded_key(segment)
        if key is None:
            raise _Reject(400, "invalid_key", "key must be 1 to 128 of A-Z a-z 0-9 . _ : -")
        return key

    def _body(self, environ: dict[str, Any]) -> bytes:
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            raise _Reject(400, "invalid_request", "Content-Length is not a number") from None
        if length > self.max_body:
            raise _Reject(413, "payload_too_large", f"request body over {self.max_body} bytes")
        return environ["wsgi.input"].read(length) if length > 0 else b""

    @staticmethod
    def _json(data: bytes) -> Any:
        try:
            return json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            # Deeply nested arrays exhaust the parser's recursion well inside the size limit.
            raise _Reject(400, "invalid_request", "body must be a JSON object") from None

    def _lease_request(self, environ: dict[str, Any], *, acquire: bool) -> tuple[int, Optional[int]]:
        """The ``ttl_seconds`` of a lease request's body, and on an acquisition its ``limit``
        (``None`` for an exclusive lock; a renewal leaves any ``limit`` unread, as it leaves
        every other field)."""
        data = self._body(environ)
        simple = _TTL_ONLY.fullmatch(data)
        if simple is not None:
            body: Any = {"ttl_seconds": int(simple[1])}
        else:
            body = self._json(data)
        if not isinstance(body, dict):
            raise _Reject(400, "invalid_request", "body must be a JSON object")
        ttl = body.get("ttl_seconds")
        if isinstance(ttl, bool) or not isinstance(ttl, int) or not MIN_TTL <= ttl <= MAX_TTL:
            raise _Reject(
                400, "invalid_ttl", f"ttl_seconds must be an integer from {MIN_TTL} to {MAX_TTL}"
            )
        if not acquire or "limit" not in body:
            return ttl, None
        limit = body["limit"]
        if isinstance(limit, bool) or not isinstance(limit, int) or not 2 <= limit <= MAX_LIMIT:
            raise _Reject(
                400,
                "invalid_request",
                f"limit must be an integer from 2 to {MAX_LIMIT} (how many holders the key admits at "
                "once); leave it out for an exclusive lock",
            )
        return ttl, limit

    @staticmethod
    def _owner(environ: dict[str, Any]) -> str:
        raw = _header(environ, _ENV_OWNER)
        if raw is None:
            return ""
        owner = _decoded_owner(raw)
        if owner is None:
            raise _Reject(
                400,
                "invalid_request",
                f"{HEADER_OWNER} must be percent-encoded printable text of at most {_MAX_OWNER} "
                "characters",
            )
        return owner

    def _store(self, operation: Callable[..., Any], *args: Any) -> Any:
        """``operation(*args)``, its refusals and store errors turned into error answers."""
        try:
            return operation(*args)
        except Conflict as conflict:
            raise _Reject(409, conflict.code, conflict.message, takeover_in=conflict.takeover_in) from None
        except NotImplementedError as exc:
            raise _Reject(501, "not_implemented", str(exc)) from None
        except ReservedKeyError:
            # Its message would show how the service lays out its store, so it stays here.
            raise _Reject(400, "invalid_key", "key is a name the lock store keeps for itself") from None
        except BackendUnavailableError:
            # Fail closed; the cause (the driver's exception) stays in the log only.
            _log.exception("lock store unavailable")
            if self.metrics is not None:
                self.metrics.store_error()
            raise _Reject(503, "unavailable", "the lock store is unavailable") from None

    def _released(self, project: str, key: str, dropped: bool) -> _Response:
        if dropped and self.waits is not None:
            self.waits.released(self.service.store_key(project, key))
        return _Response(204, None, [(HEADER_RELEASED, "true" if dropped else "false")])

    def _wait_free(
        self,
        project: str,
        key: str,
        wait: Optional[float],
        held_for: Callable[[], Optional[float]],
        *,
        takes: bool,
        gone: Optional[Callable[[], bool]] = None,
    ) -> list[tuple[str, str]]:
        """Honour ``Prefer: wait=N`` on a held key; the ``Preference-Applied`` header if it was.

        ``held_for`` looks at the key after every wake-up, and ``takes`` it when free or not
        (see :meth:`WaitRoom.wait_until_free`). Without a free waiting slot nothing waits and
        no header is returned. ``gone`` says whether the client closed its connection (see
        :meth:`WaitRoom.wait_until_free`).
        """
        if self.waits is None or not wait:
            return []
        waits = self.waits
        store_key = self.service.store_key(project, key)
        waited = self._store(lambda: waits.wait_until_free(store_key, held_for, wait, takes=takes, gone=gone))
        return [] if waited is None else _applied(wait)

    def _acquire(
        self,
        project: str,
        key: str,
        token: str,
        ttl: int,
        owner: str,
        wait: Optional[float],
        gone: Optional[Callable[[], bool]] = None,
        limit: Optional[int] = None,
    ) -> _Response:
        received = time.monotonic()
        service = self.service
        acquire: Callable[[], Grant]
        if limit is None:
            acquire = functools.partial(service.acquire, project, key, token, ttl, owner)
        else:
            acquire = functools.partial(service.acquire_counted, project, key, token, ttl, owner, limit)
        try:
            grant = self._store(acquire)
        except _Reject as reject:
            if not wait or reject.code != "lock_held":
                raise
            # A store's line hands a whole key over; a place of a counting key is waited for
            # on the releases, as on a store without a line.
            in_line = (
                None if limit is not None
                else self._wait_in_line(project, key, token, ttl, owner, wait, gone, reject.takeover_in)
            )
            if in_line is not None:
                applied, claimed = in_line
                if claimed is None:
                    reject.response.headers.extend(applied)
                    raise
                line_grant, sent = claimed
                return _lease_response(201, line_grant, [*applied, (HEADER_WAITED, _waited(sent - received))])
            # Each wake-up tries the grant itself: a release is turned into this request's grant
            # at once (for an exclusive key in one store round trip, with no read before it).
            granted: list[tuple[Grant, float]] = []

            def held_for() -> Optional[float]:
                tried = time.monotonic()
                try:
                    granted.append((acquire(), tried))
                except Conflict as conflict:
                    if conflict.code != "lock_held":
                        raise
                    return conflict.takeover_in or 0.0
                return None

            applied = self._wait_free(project, key, wait, held_for, takes=True, gone=gone)
            if not applied:
                raise
            if not granted:
                reject.response.headers.extend(applied)
                raise
            grant, tried = granted[-1]
            return _lease_response(201, grant, [*applied, (HEADER_WAITED, _waited(tried - received))], limit)
        return _lease_response(201, grant, limit=limit)

    def _wait_in_line(
        self,
        project: str,
        key: str,
        token: str,
        ttl: int,
        owner: str,
        wait: float,
        gone: Optional[Callable[[], bool]],
        expires_in: Optional[float],
    ) -> Optional[tuple[list[tuple[str, str]], Optional[tuple[Grant, float]]]]:
        """Honour ``Prefer: wait=N`` in the store's line of the key, where the store keeps one:
        the ``Preference-Applied`` header and the grant with the send of the store request it
        followed, or no grant; ``None`` when the request waits as before (no line, or no
        waiting slot free)."""
        waits, service = self.waits, self.service
        if waits is None:
            return None

        def claim(grant: LineGrant) -> Optional[tuple[Grant, float]]:
            claimed = service.claim(project, key, token, ttl, grant)
            return None if claimed is None else (claimed, grant.sent)

        in_line = self._store(
            lambda: waits.wait_in_line(
                lambda: service.join_line(project, key, token, ttl, owner),
                claim,
                wait,
                service.store_lease(ttl),
                gone=gone,
                expires_in=expires_in,
            )
        )
        if in_line is None:
            return None
        return _applied(wait), in_line.claimed

    def _read(
        self, project: str, key: str, wait: Optional[float] = None, gone: Optional[Callable[[], bool]] = None
    ) -> _Response:
        holder: Holder = self._store(self.service.read, project, key)
        headers = []
        if holder.held and wait:
            free: list[Holder] = []

            def held_for() -> Optional[float]:
                seen = self.service.read(project, key)
                if seen.held:
                    return seen.takeover_in or 0.0
                free.append(seen)  # the read after the wake-up: the answer needs no other
                return None

            headers = self._wait_free(project, key, wait, held_for, takes=False, gone=gone)
            if free:
                holder = free[-1]
            elif headers:
                holder = self._store(self.service.read, project, key)
        if holder.held and holder.takeover_in is not None:
            headers.append((HEADER_EXPIRES_IN, f"{holder.takeover_in:.3f}"))
        return _Response(200, _holder_body(holder), headers)

    def _list(self, environ: dict[str, Any], project: str) -> _Response:
        query = urllib.parse.parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
        prefix = query.get("prefix", [""])[-1]
        if prefix and not KEY_PATTERN.fullmatch(prefix):
            raise _Reject(400, "invalid_key", "prefix must be up to 128 of A-Z a-z 0-9 . _ : -")
        holders = self._store(lambda: list(self.service.list(project, prefix)))
        locks = []
        for holder in holders:
            item = _holder_body(holder, with_key=True)
            item["expires_in"] = round(holder.takeover_in or 0.0, 3)
            locks.append(item)
        return _Response(200, {"locks": locks})


def create_app(
    backend_url: Union[str, Backend],
    keys_file: PathLike,
    *,
    rate_limit: int = 600,
    rate_window: float = 60.0,
    max_body: int = 16 * 1024,
    key_prefix: str = "locks/",
    max_waits: int = 4,
    max_wait: float = 30.0,
    metrics: bool = False,
) -> LockServiceApp:
    """The WSGI application serving the locks of ``backend_url`` to the keys of ``keys_file``.

    ``backend_url`` is any lease_lock backend URL (or a backend object, which stays the
    caller's to close). ``rate_limit`` requests per project per fixed ``rate_window`` seconds
    in each of the budgets of :func:`budget_of`; ``max_body`` bytes per request body;
    ``key_prefix`` namespaces the service's keys in the store (followed by ``<project>/``).
    ``max_waits`` requests of this process may wait at once under ``Prefer: wait=N``, for
    ``max_wait`` seconds at most (``max_waits=0`` turns the extension off); keep ``max_waits``
    below the WSGI server's thread count. ``metrics`` serves ``GET /metrics`` (Prometheus text).
    """
    from ..errors import ValidationError

    if isinstance(rate_limit, bool) or not isinstance(rate_limit, int) or rate_limit < 1:
        raise ValidationError("rate_limit must be a positive int (requests per window)")
    if (
        isinstance(rate_window, bool)
        or not isinstance(rate_window, (int, float))
        or not rate_window > 0
    ):
        raise ValidationError("rate_window must be > 0 seconds")
    keys = KeyFile(keys_file)
    backend = backend_from_url(backend_url) if isinstance(backend_url, str) else backend_url
    if not backend.capabilities.fencing:
        raise ValidationError(f"{type(backend).__name__} cannot fence; the service needs fences")
    if not isinstance(backend, ServiceStore):
        if isinstance(backend_url, str):
            backend.close()  # built here, so ours to close
        raise ValidationError(
            f"backend_url: {type(backend).__name__} is not a ServiceStore (it keeps no shared"
            " counters for the rate limits); serve from memory, SQLite, Redis or PostgreSQL"
        )
    if isinstance(max_waits, bool) or not isinstance(max_waits, int) or max_waits < 0:
        raise ValidationError("max_waits must be a whole number >= 0 (0 turns waiting off)")
    if isinstance(max_wait, bool) or not isinstance(max_wait, (int, float)) or not 0 < max_wait <= 3600:
        raise ValidationError("max_wait must be > 0 and at most 3600 seconds")
    service = LockService(backend, key_prefix=key_prefix)
    limiter = RateLimiter(backend, limit=rate_limit, window=float(rate_window))
    waits = WaitRoom(backend, max_waits=max_waits, max_wait=float(max_wait))
    return LockServiceApp(service, keys, limiter, max_body=max_body, waits=waits, metrics=metrics)
