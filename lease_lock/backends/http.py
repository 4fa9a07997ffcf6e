"""HTTP backend: a client of the "project locks" API (our ``lease-lock serve`` or the hosted one).

Built on ``requests``: a backend that owns its session sends its requests straight through
``urllib3``'s connection pool where no proxy applies (see :class:`_DirectPool`). The wire rules
apply before anything is sent: keys are ``[A-Za-z0-9._:-]{1,128}``, tokens and request ids are
UUIDs, and TTLs travel as whole seconds, rounded up, at least 5 and at most 90 days. The local
lease of the core still follows the TTL the caller asked for.

Answers: 409 is a plain "no" (``None``/``False``); 429 raises
:class:`~lease_lock.errors.RateLimitedError`; 400 raises
:class:`~lease_lock.errors.ValidationError`; 401/403 raise
:class:`~lease_lock.errors.AccessDeniedError`. A transport failure (refused, reset, timed out)
or a 503 raises :class:`~lease_lock.errors.BackendUnavailableError` with ``requests``' exception
as ``__cause__``; anything else unexpected raises ``requests``' ``HTTPError``, a redirect too:
none is followed, so a key, a token and the credential only ever go to ``base_url``.
An acquisition is retried exactly once, with the same token, TTL, request id and credential,
after a transport failure or a 503: the token makes the repeat safe.

A backend used before ``fork()`` is safe in the child: the child builds its own session on its
first request and never touches a connection its parent opened.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import threading
import time
import urllib.parse
import uuid
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, ClassVar, ContextManager, NamedTuple, Optional

import requests
import urllib3
from requests.structures import CaseInsensitiveDict
from requests.utils import DEFAULT_CA_BUNDLE_PATH, get_encoding_from_headers, select_proxy

from .. import wire
from ..errors import AccessDeniedError, BackendUnavailableError, RateLimitedError, ValidationError
from ..validation import redact_url
from .base import (
    CALL_MARGIN,
    Backend,
    CallBudget,
    Capabilities,
    Holder,
    LineGrant,
    LockState,
    ReleaseWatcher,
    WaitingLine,
    parse_url_options,
)
from .line import AnnouncedLine, Announcements, LineSlots
from .service import RequestIdCarrier

__all__ = ["HttpBackend"]

_API_KEY_ENV = "LEASE_LOCK_API_KEY"
# Owner labels travel percent-encoded so that any printable text survives an HTTP header.
_OWNER_SAFE = " !#$&'()*+,/:;=?@[]^_`{|}~"


def _positive_seconds(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise ValueError("must be a finite number of seconds > 0")
    return value


def _parse_time(text: Any) -> datetime:
    if not isinstance(text, str):
        raise requests.exceptions.InvalidJSONError(f"expires_at must be a string, got {text!r}")
    # ``fromisoformat`` reads a trailing ``Z`` only from Python 3.11 on.
    moment = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    return moment.astimezone(timezone.utc)


# Backends alive in this process; a forked child gives each a new session (see _after_fork).
_LIVE: weakref.WeakSet[HttpBackend] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for backend in list(_LIVE):
        backend._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# Longest server-side wait one watching request asks for: short, so that a watch nobody needs
# any more holds a server's waiting slot briefly.
_WATCH_WAIT = 5
# A key is watched while an acquisition of it failed this recently (a waiting Locker retries
# at least every second while notifications flow).
_INTEREST_WINDOW = 3.0
# A grant a watching request won waits this long for the acquisition it was made for (which is
# woken at once, and retries at least every second anyway); unclaimed, it is given back.
_CLAIM_WINDOW = 2.0
# A claimed grant's lease is counted by the caller from its own call, a little after the
# store's lease began. The store keeps the key from every other token for the takeover grace
# after the lease's expiry; a claim may use a tenth of that grace, no more (later, the caller's
# attempt is sent as a request of its own, which renews the lease from its sending).
_CLAIM_SLACK = wire.TAKEOVER_GRACE / 10
#: At most this many threads of one backend wait with an acquisition of their own held by the
#: server (see HttpBackend.join_line), each on one pooled connection; further waiters are woken
#: through the shared watcher.
LINE_WAITERS = 2
#: A wait shorter than this is not asked for (the wire carries milliseconds).
_SHORTEST_WAIT = 0.001
#: ``_wait_offered`` before the server's first answer.
_NOT_HEARD = -1


class _Answer(NamedTuple):
    """What one acquisition request came to: the grant's ``fence`` (``None`` when refused),
    whether the server ``applied`` a wait preference, and ``held_back``, how long it held the
    request before it tried the grant (the lease began no earlier than the sending plus this)."""

    fence: Optional[int]
    applied: bool = False
    held_back: float = 0.0


def _held_back(response: requests.Response, sent: float) -> float:
    """The seconds the server says it held a waiting request before its grant, never more than
    the request's whole round trip since ``sent`` (``time.monotonic()``), nor negative."""
    try:
        held_back = float(response.headers.get(wire.HEADER_WAITED, ""))
    except ValueError:
        return 0.0  # then the request's sending is the earliest start there is
    return min(max(held_back, 0.0), time.monotonic() - sent) if math.isfinite(held_back) else 0.0


def _refusal(response: requests.Response) -> tuple[Optional[str], Optional[str]]:
    """The ``error`` message and ``code`` of an error answer (``None`` where it has none)."""
    try:
        body = response.json()
    except ValueError:
        return None, None
    if not isinstance(body, dict):
        return None, None
    message, code = body.get("error"), body.get("code")
    return (message if isinstance(message, str) else None), (code if isinstance(code, str) else None)


def _json_field(response: requests.Response, name: str) -> Any:
    """Field ``name`` of a JSON object answer, ``None`` when absent or not an object."""
    try:
        body = response.json()
    except ValueError:
        return None
    return body.get(name) if isinstance(body, dict) else None


def _json_body(value: Any) -> bytes:
    """``value`` as JSON, encoded as ``requests`` encodes a ``json=`` body."""
    return json.dumps(value, allow_nan=False).encode("utf-8")


def _within(timeout: Any, left: float) -> Any:
    """A request's timeout (seconds, or a (connect, read) pair) cut to the ``left`` seconds of a
    call budget: a request sent with nothing left still gets a moment, so that what ends it is
    the transport's own timeout."""
    left = max(left, _SHORTEST_WAIT)
    if isinstance(timeout, tuple):
        return tuple(min(part, left) for part in timeout)
    return min(timeout, left)


def _wait_step(text: Optional[str]) -> float:
    """The finest wait a server announced (``X-Lease-Lock-Wait-Step``), or ``0.0`` for none."""
    try:
        step = float(text) if text is not None else 0.0
    except ValueError:
        return 0.0
    return step if 0.0 < step <= 1.0 else 0.0


# urllib3's failures of a request, as requests' adapter reports them (most specific first).
_TRANSPORT_FAILURES: tuple[tuple[type[Exception], type[requests.RequestException]], ...] = (
    (urllib3.exceptions.SSLError, requests.exceptions.SSLError),
    (urllib3.exceptions.NewConnectionError, requests.ConnectionError),
    (urllib3.exceptions.ConnectTimeoutError, requests.ConnectTimeout),
    (urllib3.exceptions.ReadTimeoutError, requests.ReadTimeout),
    (urllib3.exceptions.ProtocolError, requests.ConnectionError),
    (urllib3.exceptions.ClosedPoolError, requests.ConnectionError),
)


class _DirectPool:
    """Requests to the service straight through a ``urllib3`` connection pool.

    ``requests.Session`` spends a fifth of the client's CPU per request on loopback (more than
    a third over TLS) on its own layers: it merges settings, headers and cookies, runs hooks,
    picks an adapter and builds its answer through cookie jars. A backend that owns its session talks to one
    origin with no cookies, hooks, redirects, credentials of the URL or proxy, so where the
    environment names no proxy for the service (see :meth:`usable`) it sends through this
    pool: the same pool ``requests`` would use, verifying TLS as ``requests`` does, without the
    layers around it. Its answers are ``requests.Response`` objects and its transport failures
    ``requests``' exceptions, exactly as through the session, so nothing above this class can
    tell the two apart.
    """

    def __init__(self, base_url: str, ca_bundle: str) -> None:
        self._base_url = base_url
        self._ca_bundle = ca_bundle
        parts = urllib.parse.urlsplit(base_url)
        self._origin = f"{parts.scheme}://{parts.netloc}"
        self._pool = self._new_pool()

    @staticmethod
    def usable(base_url: str, environment: Mapping[str, Any]) -> Optional[str]:
        """The CA bundle to verify ``base_url``'s certificate with (``""`` for plain HTTP) when
        the session's ``environment`` (``merge_environment_settings``) lets requests go
        through a pool of this class; ``None`` when they must go through the session: a
        proxy, a client certificate, or a CA bundle that is not there (the session raises
        its own error for that)."""
        if select_proxy(base_url, environment["proxies"]) is not None or environment["cert"]:
            return None
        if base_url.startswith("http://"):
            return ""
        verify = environment["verify"]
        # As requests verifies by default: against its own bundle (certifi's), or the one the
        # environment names (REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE), a file or a directory.
        bundle = DEFAULT_CA_BUNDLE_PATH if verify is True else verify
        return bundle if isinstance(bundle, str) and os.path.exists(bundle) else None

    def _new_pool(self) -> urllib3.HTTPConnectionPool:
        # Ten connections, as requests keeps per host; retries=False: one attempt, whose
        # failure raises at once (the backend's own rules decide what is sent again).
        options: dict[str, Any] = {"maxsize": 10, "block": False, "retries": False}
        if self._ca_bundle:
            # The certificate and the host name are verified, as requests verifies them.
            options["cert_reqs"] = "CERT_REQUIRED"
            options["ca_cert_dir" if os.path.isdir(self._ca_bundle) else "ca_certs"] = self._ca_bundle
        return urllib3.connection_from_url(self._base_url, **options)

    def send(
        self, method: str, url: str, headers: dict[str, str], timeout: Any, body: Optional[bytes]
    ) -> requests.Response:
        """Send one request to ``url`` (under ``base_url``); its answer, body read."""
        connect, read = timeout if isinstance(timeout, tuple) else (timeout, timeout)
        try:
            raw = self._pool.urlopen(
                method,
                url[len(self._origin):],
                body=body,
                headers=headers,
                retries=False,
                redirect=False,
                timeout=urllib3.Timeout(connect=connect, read=read),
            )
        except urllib3.exceptions.HTTPError as exc:
            for failure, reported in _TRANSPORT_FAILURES:
                if isinstance(exc, failure):
                    raise reported(exc) from exc
            raise
        response = requests.Response()
        response.status_code = raw.status
        response.reason = raw.reason or ""
        response.headers = CaseInsensitiveDict(raw.headers)
        response.encoding = get_encoding_from_headers(response.headers)
        response.raw = io.BytesIO(raw.data)
        response.url = url
        return response

    def close(self) -> None:
        """Close the pooled connections; a later request opens a new one, as a session does."""
        pool, self._pool = self._pool, self._new_pool()
        pool.close()


@dataclass(frozen=True)
class _Refused:
    """The latest refused acquisition of a key: what a watching request repeats, waiting."""

    seen: float  # time.monotonic() of the refusal
    token: str
    wire_ttl: int
    headers: dict[str, str]  # token, request id and owner label, as the refused request sent them
    limit: int = 1  # a place of a counting key asked for when above 1


@dataclass(frozen=True)
class _Won:
    """A grant a watching request won for an acquisition that has not claimed it yet."""

    fence: int
    earliest: float  # time.monotonic(): the store's lease began no earlier
    wire_ttl: int
    owner: Optional[str]  # the owner header it was granted with
    limit: int  # the limit it was granted with (1: the key itself)
    taken: threading.Event = field(default_factory=threading.Event, compare=False)


class _WaitWatcher(ReleaseWatcher):
    """Release notifications: this backend's own releases, and the server's wait extension.

    Releases and force releases made through the backend are reported at once. A key is watched
    once an acquisition of it through this backend was refused (409): a thread repeats that
    acquisition (same token, TTL, owner and request id) with ``Prefer: wait``, so that the
    server holds it until the key is free and grants it in the same request. The grant is kept
    for the waiting acquisition, which is woken and takes it without another request (see
    :meth:`HttpBackend.acquire_fenced`). Threads run only while the server announces the
    extension (``announced``), and the watcher is active only then: without it, releases made
    elsewhere are announced to nobody here, and a waiter asks at its quiet pace.
    """

    def __init__(
        self, callback: Callable[[str], None], waiting: Callable[[str, int], None], announced: Callable[[], bool]
    ) -> None:
        self._callback = callback
        self._waiting = waiting
        self._announced = announced
        self._closed = threading.Event()

    @property
    def active(self) -> bool:
        """``True`` until closed while the server announces its wait extension."""
        return not self._closed.is_set() and self._announced()

    def closed(self) -> bool:
        """Whether :meth:`close` ran."""
        return self._closed.is_set()

    def notify(self, key: str) -> None:
        """Report ``key`` released (from a watching thread)."""
        if not self._closed.is_set():
            self._callback(key)

    def wanted(self, key: str) -> None:
        """A thread of the caller's process waits for ``key`` now."""
        self._waiting(key, 1)

    def unwanted(self, key: str) -> None:
        """Nobody of the caller's process waits for ``key`` any more: a grant won for it is
        given back at once (see :meth:`HttpBackend.acquire_fenced`)."""
        self._waiting(key, -1)

    def close(self) -> None:
        """Stop watching; threads end after their current request."""
        self._closed.set()


class _HeldAcquisition(WaitingLine):
    """One waiting thread's line (see :meth:`HttpBackend.join_line`): every wait is the
    thread's acquisition, held by the server for that long while the key is held (while every
    place is taken, for a place of a counting key)."""

    direct = True

    def __init__(
        self,
        backend: HttpBackend,
        key: str,
        token: str,
        ttl: float,
        owner: str,
        fenced: bool,
        clock: Callable[[], float],
        limit: int = 1,
    ) -> None:
        self._backend = backend
        self._limit = limit
        self._key = key
        self._token = token
        self._ttl = ttl
        self._owner = owner
        self._fenced = fenced
        self._clock = clock
        # Whether a request of this line may have been granted without the thread knowing (its
        # answer was lost): then leaving gives the key back.
        self._unsure = False
        self._left = False
        # Whether the latest wait was held to its end and refused: the server tried the grant
        # at that end, so that refusal answers the attempt that follows it (see ask).
        self._refused = False

    def _acquire(self, wait: Optional[float]) -> _Answer:
        self._unsure = True
        answer = self._backend._acquire(
            self._key, self._token, self._ttl, self._owner, watch=False, wait=wait, limit=self._limit
        )
        self._unsure = False
        return answer

    def _fence(self, fence: int) -> int:
        # A place of a counting key is always fenced (the core reads its fence).
        return fence if self._fenced or self._limit > 1 else 0

    def ask(self) -> Optional[int]:
        """See :meth:`WaitingLine.ask`: a plain acquisition, or, right after a wait the server
        held to its end, that wait's refusal (the server tried the grant as the wait ended),
        so that a waiting thread sends one request per pause, as it would without the line."""
        if self._refused:
            self._refused = False
            return None
        fence = self._acquire(None).fence
        return None if fence is None else self._fence(fence)

    def wait(self, seconds: float) -> Optional[LineGrant]:
        """See :meth:`WaitingLine.wait`: the acquisition, held by the server for ``seconds``
        (rounded down to the server's step, and at most its longest wait) while the key is
        held. When the server had no waiting slot free (it answered at once), or the wait is
        shorter than one step, the rest of ``seconds`` is slept instead."""
        backend = self._backend
        started = time.monotonic()
        self._refused = False
        # Never finer than a millisecond: the wait travels with three decimals at most.
        step = max(backend._wait_step, 0.001)
        wait = min(math.floor(seconds / step + 1e-9) * step, float(backend._wait_offered))
        if wait >= step:
            sent = self._clock()
            answer = self._acquire(wait)
            if answer.fence is not None:
                # Won: leaving without holding it gives it back (see leave).
                self._unsure = True
                return LineGrant(self._fence(answer.fence), sent + answer.held_back, self._ttl, False)
            if answer.applied:
                self._refused = True
                return None
        left = seconds - (time.monotonic() - started)
        if left > 0:
            time.sleep(left)
        return None

    def leave(self, granted: bool) -> None:
        """See :meth:`WaitingLine.leave`: a key that a wait won, or that a request whose answer
        was lost may have won, is released (best effort: it runs out with its lease otherwise)."""
        if self._left:
            return
        self._left = True
        self._backend._line_slots.give()
        if not granted and self._unsure:
            with contextlib.suppress(Exception):
                # Bounded: the thread leaving may be on its way out of a wait that met a silent
                # service, and the lease runs out without this anyway.
                backend = self._backend
                backend._release(self._key, self._token, min(backend.timeout, CALL_MARGIN))


def _forget_after(now: float, ttl: float) -> float:
    # The grace second plus a wide margin for a slow reply: only then is the grant surely over.
    return now + ttl + wire.TAKEOVER_GRACE + 60.0


class HttpBackend(Backend, RequestIdCarrier):
    """Leases kept by a lock service speaking the project-locks API.

    ``base_url`` is the service root (``/locks`` is appended); ``api_key`` a service key with
    scope ``locks.manage`` or ``full``; ``session`` a ``requests.Session`` to use (it stays the
    caller's to close); ``timeout`` seconds per request (connect and read).

    ``is_held`` compares the fence of a read with the fence the grant returned (the wire has no
    token check for reads), so it only knows tokens granted through this backend object.
    """

    capabilities: ClassVar[Capabilities] = Capabilities(
        server_clock=True,
        fencing=True,
        scan=True,
        # Through the server's wait extension, when the server offers it (see watch_releases).
        release_notify=True,
        replica_wait=False,
        batch_extend=False,
        # Asked of the service, which answers per store (a store that grants none: ValidationError).
        counting=True,
        min_ttl=float(wire.MIN_TTL),
        clock="the lock service's clock (its store's clock for a lease_lock server)",
        wake="the service holds the request (Prefer: wait), else the backend's release watcher",
    )
    url_options: ClassVar[Mapping[str, Callable[[str], Any]]] = {
        "api_key": str,
        "timeout": _positive_seconds,
    }

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        session: Optional[requests.Session] = None,
        timeout: float = 10.0,
    ) -> None:
        parts = urllib.parse.urlsplit(base_url) if isinstance(base_url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
            shown = redact_url(base_url) if isinstance(base_url, str) else repr(base_url)
            raise ValidationError(f"base_url must be an http:// or https:// URL with a host, got {shown}")
        try:
            parts.port  # noqa: B018 - urlsplit parses the port lazily and raises here
        except ValueError as exc:
            # The URL may carry ?api_key=...: show it only redacted.
            raise ValidationError(f"base_url {redact_url(base_url)} has a bad port: {exc}") from None
        if not isinstance(api_key, str) or not api_key or not api_key.isprintable():
            raise ValidationError("api_key must be a non-empty printable str (a service key)")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ValidationError("timeout must be > 0 seconds")
        self.base_url = urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))
        self.timeout = float(timeout)
        self._own_session = session is None
        self._session = session if session is not None else requests.Session()
        # The environment's proxy and CA settings for base_url, read on first use (see _send_prepared).
        self._environment: Optional[dict[str, Any]] = None
        # Set with the environment: the direct pool (when _DirectPool.usable allows one) and the
        # session's default headers, which it sends as the session would.
        self._direct: Optional[_DirectPool] = None
        self._direct_headers: dict[str, str] = {}
        self._authorization = f"Bearer {api_key}"
        self._mutex = threading.Lock()
        self._scope = threading.local()
        # Inside call_budget blocks, every request's timeouts end by the budget's deadline.
        self._budget = CallBudget(CALL_MARGIN)
        # (key, token) -> (fence, monotonic time after which the grant surely ended)
        self._fences: dict[tuple[str, str], tuple[int, float]] = {}
        # A parent's sessions and direct pools, kept referenced in a forked child: closing them
        # there could disturb the parent's connections (a TLS close_notify on a shared socket).
        self._inherited: list[object] = []
        # The longest wait the server offers (0 until it announced the extension), and the
        # finest (0.0 unless it announced waits to a fraction of a second).
        self._wait_offered = _NOT_HEARD
        self._wait_step = 0.0
        self._line_slots = LineSlots(LINE_WAITERS)
        #: The shared watcher of the waiters without a held acquisition (see join_line).
        self._announcements = Announcements(self)
        self._watchers: list[_WaitWatcher] = []
        self._interest: dict[str, _Refused] = {}
        self._watching: set[str] = set()
        # key -> how many watchers have a thread waiting for it (see _WaitWatcher.wanted).
        self._waiters: dict[str, int] = {}
        # Grants won by watching requests, until claimed; acquisitions in flight per
        # (key, token); give-backs of unclaimed grants in flight (an acquisition of the same
        # token waits for one, so that the two never cross on the wire).
        self._won: dict[tuple[str, str], _Won] = {}
        self._in_flight: dict[tuple[str, str], int] = {}
        self._giving_back: dict[tuple[str, str], threading.Event] = {}
        _LIVE.add(self)

    def _after_fork(self) -> None:
        """In a forked child: a new session and fresh locks, never the parent's connections."""
        self._inherited.append(self._session)
        self._session = requests.Session()
        self._environment = None
        # The parent's pool is kept, unused, like its session; the child's first request makes one.
        if self._direct is not None:
            self._inherited.append(self._direct)
            self._direct = None
        # The child's session is its own, whoever owned the parent's.
        self._own_session = True
        self._mutex = threading.Lock()
        self._scope = threading.local()
        # The parent's watching threads and acquisitions do not exist here.
        self._watchers = []
        self._interest = {}
        self._watching = set()
        self._waiters = {}
        self._won = {}
        self._in_flight = {}
        self._giving_back = {}

    def __repr__(self) -> str:
        return f"HttpBackend({redact_url(self.base_url)!r})"

    @classmethod
    def from_url(cls, url: str, **options: Any) -> HttpBackend:
        """``http(s)://host[:port][/base]?timeout=10``; ``api_key`` from options or the env."""
        parsed = parse_url_options(url, cls.url_options, options, backend="http")
        api_key = parsed.pop("api_key", None) or os.environ.get(_API_KEY_ENV)
        if not api_key:
            raise ValidationError(f"the http backend needs api_key=... or the {_API_KEY_ENV} environment variable")
        return cls(url, api_key, **parsed)

    # -- wire rules ------------------------------------------------------------------------------

    def check_key(self, key: str) -> None:
        """The service's key rule: 1 to 128 of ``A-Z a-z 0-9 . _ : -``."""
        if not isinstance(key, str) or not wire.KEY_PATTERN.fullmatch(key):
            raise ValidationError(
                "key must be 1 to 128 characters of letters, digits, '.', '_', ':' or '-' "
                "for the HTTP lock service (key_prefix included)"
            )

    def check_token(self, token: str) -> None:
        """The service compares tokens as UUIDs, so a token must be one."""
        try:
            uuid.UUID(token)
        except (TypeError, ValueError, AttributeError):
            raise ValidationError("token must be a UUID for the HTTP lock service") from None

    def new_token(self) -> str:
        """A random UUID."""
        return str(uuid.uuid4())

    @staticmethod
    def wire_ttl(ttl: float) -> int:
        """``ttl`` as the service takes it: whole seconds rounded up, at least 5."""
        if not ttl <= wire.MAX_TTL:
            raise ValidationError(f"ttl must be at most {wire.MAX_TTL} seconds (90 days) over HTTP")
        return max(wire.MIN_TTL, math.ceil(ttl))

    # -- requests --------------------------------------------------------------------------------

    def _url(self, key: Optional[str], lease: bool = False) -> str:
        if key is None:
            return f"{self.base_url}/locks"
        path = f"{self.base_url}/locks/{urllib.parse.quote(key, safe='')}"
        return path + "/lease" if lease else path

    def _send(self, method: str, url: str, **kwargs: Any) -> requests.Response:
        """One request; a transport failure raises ``requests``' own exception."""
        headers = kwargs.pop("headers", {})
        headers["Authorization"] = self._authorization
        if wire.HEADER_REQUEST_ID not in headers:
            # Inside request_id_scope() every request of the block carries the caller's id.
            headers[wire.HEADER_REQUEST_ID] = getattr(self._scope, "request_id", None) or str(uuid.uuid4())
        timeout = kwargs.pop("timeout", self.timeout)
        deadline = self._budget.deadline
        if deadline is not None:
            timeout = _within(timeout, deadline - time.monotonic())
        if self._own_session:
            response = self._send_prepared(method, url, headers, timeout, **kwargs)
        else:
            response = self._session.request(
                method, url, headers=headers, timeout=timeout, allow_redirects=False, **kwargs
            )
        offered = response.headers.get(wire.HEADER_WAIT)
        if offered is not None:
            self._wait_offered = int(offered) if offered.isdigit() else 0
            self._wait_step = _wait_step(response.headers.get(wire.HEADER_WAIT_STEP))
        elif self._wait_offered == _NOT_HEARD:
            self._wait_offered = 0  # a server that does not offer the extension
        return response

    def _send_prepared(
        self, method: str, url: str, headers: dict[str, str], timeout: Any, json: Any = None, params: Any = None
    ) -> requests.Response:
        """What ``Session.request`` does, on a session of our own, without its per-request costs.

        ``Session.request`` reads the whole environment on every request (proxy variables,
        twice, and the CA bundle) and looks for a ``.netrc`` file, which together cost about as
        much CPU as the rest of the request. Every request here goes to the one ``base_url``,
        so the environment's settings for it are read once per session. A ``.netrc`` entry is
        never wanted: its credential would replace the service key. Where the environment allows
        it (see :meth:`_DirectPool.usable`) the request goes through :class:`_DirectPool`;
        otherwise the session sends it, with its headers and cookies applied as
        ``Session.request`` would.
        """
        environment = self._environment or self._read_environment()
        if self._direct is not None:
            if params:
                url = f"{url}?{urllib.parse.urlencode(params)}"
            headers = {**self._direct_headers, **headers}
            body = None
            if json is not None:
                headers["Content-Type"] = "application/json"
                body = _json_body(json)
            return self._direct.send(method, url, headers, timeout, body)
        prepared = requests.PreparedRequest()
        prepared.prepare(
            method=method,
            url=url,
            headers={**self._session.headers, **headers},
            json=json,
            params=params,
            cookies=self._session.cookies,
        )
        return self._session.send(prepared, timeout=timeout, allow_redirects=False, **environment)

    def _read_environment(self) -> dict[str, Any]:
        """The environment's settings for ``base_url``, read once, and the direct pool if they
        allow one."""
        with self._mutex:
            if self._environment is None:
                environment: dict[str, Any] = dict(
                    self._session.merge_environment_settings(self.base_url, {}, None, None, None)
                )
                ca_bundle = _DirectPool.usable(self.base_url, environment)
                if ca_bundle is not None:
                    self._direct_headers = {name: str(value) for name, value in self._session.headers.items()}
                    self._direct = _DirectPool(self.base_url, ca_bundle)
                self._environment = environment
            return self._environment

    def _unavailable(self, cause: BaseException) -> BackendUnavailableError:
        # ``base_url`` never carries the key (it travels in a header) and has no query.
        return BackendUnavailableError(
            f"lock service at {redact_url(self.base_url)} unreachable ({type(cause).__name__})",
            backend="http",
        )

    def _call(self, method: str, url: str, **kwargs: Any) -> requests.Response:
        """One attempt; a transport failure or a 503 raises ``BackendUnavailableError``."""
        try:
            response = self._send(method, url, **kwargs)
        except (requests.ConnectionError, requests.Timeout) as exc:
            raise self._unavailable(exc) from exc
        self._raise_if_unavailable(response)
        return response

    def _raise_if_unavailable(self, response: requests.Response) -> None:
        if response.status_code == 503:
            error = requests.HTTPError(f"503 from {redact_url(response.url)}", response=response)
            raise self._unavailable(error) from error

    @staticmethod
    def _raise_for(response: requests.Response, expected: int) -> None:
        """Turn a status other than ``expected`` (and 409, the caller's) into its exception."""
        status = response.status_code
        if status == expected:
            return
        message, code = _refusal(response)
        detail = f"lock service: {message or response.reason} ({code or status})"
        if status == 429:
            try:
                retry_after = float(response.headers.get("Retry-After", "1"))
            except ValueError:
                retry_after = 1.0
            raise RateLimitedError(detail, retry_after=retry_after, status=429)
        if status == 400:
            raise ValidationError(detail)
        if status in (401, 403):
            raise AccessDeniedError(detail, status=status)
        response.raise_for_status()
        raise requests.HTTPError(f"unexpected status {status} ({detail})", response=response)

    # -- primitives ------------------------------------------------------------------------------
    # acquire is the base class's: the service fences every grant, so a plain grant is a fenced
    # one (POST /locks/{key}/lease) with the fence dropped.

    def call_budget(self, seconds: float) -> ContextManager[None]:
        """Bound the requests this thread sends inside the block, the one retry after a
        transport failure included, to ``seconds`` plus :data:`CALL_MARGIN` in all: a
        request with no answer by then raises ``BackendUnavailableError`` (from the transport's
        timeout)."""
        return self._budget.block(seconds)

    def request_id_scope(self, request_id: Optional[str]) -> ContextManager[None]:
        """Send ``request_id`` (a UUID) with every request this thread makes inside the block
        (acquisitions, releases, extensions, reads and force-releases)."""
        if request_id is not None:
            try:
                request_id = str(uuid.UUID(request_id))
            except (TypeError, ValueError, AttributeError):
                raise ValidationError("request_id must be a UUID for the HTTP lock service") from None
        return self._request_id_block(request_id)

    @contextlib.contextmanager
    def _request_id_block(self, request_id: Optional[str]) -> Iterator[None]:
        previous = getattr(self._scope, "request_id", None)
        self._scope.request_id = request_id
        try:
            yield
        finally:
            self._scope.request_id = previous

    def acquire_fenced(self, key: str, token: str, ttl: float, owner: str) -> Optional[int]:
        """Grant or renew ``key``; the fence, or ``None`` when another holder has it.

        The request id (from :meth:`request_id_scope`, else a fresh UUID) is reused on the one
        retry, as are the token, TTL and credential.

        A grant that a watching request won for this token (see :class:`_WaitWatcher`) is
        taken without a request when it is fresh enough: when this call plus ``ttl`` ends no
        later than the earliest start of the store's lease plus its TTL and a tenth of the
        takeover grace. Otherwise the acquisition is sent, and renews that lease.
        """
        self.check_key(key)
        self.check_token(token)
        return self._acquire(key, token, ttl, owner, watch=True).fence

    def acquire_counted(self, key: str, token: str, ttl: float, owner: str, limit: int) -> Optional[int]:
        """Grant or renew ``token``'s place among the ``limit`` places of ``key``: an
        acquisition (``POST /locks/{key}/lease``) whose body carries ``limit``, a lease_lock
        server extension. The fence, or ``None`` when every place is taken.

        Raises ``ValidationError`` when the key's holders were granted another limit (the
        server's ``409 limit_mismatch``), when the service's store grants no counting leases
        (its ``501``, naming the store) and when the service answers a grant without the
        limit (a service without the extension, which granted the key itself: that grant is
        released first). A grant a watching request won for this place is taken as
        :meth:`acquire_fenced` takes one.
        """
        self.check_key(key)
        self.check_token(token)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 2:
            raise ValidationError(f"limit must be an int >= 2 for a counting lease, got {limit!r}")
        return self._acquire(key, token, ttl, owner, watch=True, limit=limit).fence

    def _acquire(
        self, key: str, token: str, ttl: float, owner: str, *, watch: bool, wait: Optional[float] = None,
        limit: int = 1,
    ) -> _Answer:
        """:meth:`acquire_fenced`'s work. ``watch``: a refusal starts the watching request of
        the key (see :meth:`watch_releases`); ``wait``: seconds the server may hold the request
        while the key is held (``Prefer: wait``), for a waiting line (see :meth:`join_line`);
        ``limit`` above 1: a place of a counting key (see :meth:`acquire_counted`)."""
        wire_ttl = self.wire_ttl(ttl)
        owner_header = urllib.parse.quote(owner, safe=_OWNER_SAFE) if owner else None
        attempt = (key, token)
        won = self._begin_attempt(attempt)
        try:
            if (
                won is not None
                and won.owner == owner_header
                and won.limit == limit
                and time.monotonic() + ttl <= won.earliest + won.wire_ttl + _CLAIM_SLACK
            ):
                self._remember(key, token, won.fence, won.wire_ttl)
                return _Answer(won.fence)
            return self._post_acquisition(key, token, wire_ttl, owner_header, watch, wait, limit)
        finally:
            self._end_attempt(attempt)

    def _post_acquisition(
        self, key: str, token: str, wire_ttl: int, owner_header: Optional[str], watch: bool, wait: Optional[float],
        limit: int = 1,
    ) -> _Answer:
        request_id = getattr(self._scope, "request_id", None) or str(uuid.uuid4())
        headers = {wire.HEADER_TOKEN: token, wire.HEADER_REQUEST_ID: request_id}
        if owner_header is not None:
            headers[wire.HEADER_OWNER] = owner_header
        url = self._url(key, lease=True)
        body = {"ttl_seconds": wire_ttl} if limit == 1 else {"ttl_seconds": wire_ttl, "limit": limit}
        sent = time.monotonic()
        response = self._post_twice(url, headers, body, wait)
        applied = wire.HEADER_PREFERENCE_APPLIED in response.headers
        if limit > 1:
            self._raise_for_counted(key, token, response, limit)
        if response.status_code == 409:
            if watch:
                self._watch(key, _Refused(time.monotonic(), token, wire_ttl, headers, limit))
            return _Answer(None, applied)
        self._raise_for(response, 201)
        fence = self._fence_of(response)
        self._remember(key, token, fence, wire_ttl)
        return _Answer(fence, applied, _held_back(response, sent) if applied else 0.0)

    def _raise_for_counted(self, key: str, token: str, response: requests.Response, limit: int) -> None:
        """Raise what an answer to a counting acquisition means beyond the answers every
        acquisition gets: another limit held, a store that cannot count, a service that
        ignored the limit (its grant of the key itself is given back first)."""
        status = response.status_code
        if status == 201:
            if _json_field(response, "limit") == limit:
                return
            with contextlib.suppress(Exception):
                self._release(key, token, min(self.timeout, CALL_MARGIN))
            raise ValidationError(
                f"lock service at {redact_url(self.base_url)} does not grant counting leases: it answered "
                f"limit={limit} with a grant of the whole key (released again)"
            )
        if status == 501 or (status == 409 and _refusal(response)[1] == "limit_mismatch"):
            message, code = _refusal(response)
            raise ValidationError(f"lock service: {message or response.reason} ({code or status})")

    def adopt(self, key: str, claim_token: str, token: str, ttl: float, owner: str) -> Optional[int]:
        """Replace the claim ``claim_token`` on ``key`` (or a free key) with a new grant to
        ``token``: ``POST /locks/{key}/lease`` with ``X-Lease-Lock-Adopt``, tried once more
        after a transport failure or a 503 (a repeat by the token holding the key keeps its
        grant and fence)."""
        self.check_key(key)
        self.check_token(claim_token)
        self.check_token(token)
        wire_ttl = self.wire_ttl(ttl)
        headers = {
            wire.HEADER_TOKEN: token,
            wire.HEADER_ADOPT: claim_token,
            wire.HEADER_REQUEST_ID: getattr(self._scope, "request_id", None) or str(uuid.uuid4()),
        }
        if owner:
            headers[wire.HEADER_OWNER] = urllib.parse.quote(owner, safe=_OWNER_SAFE)
        url, body = self._url(key, lease=True), {"ttl_seconds": wire_ttl}
        response = self._post_twice(url, headers, body)
        if response.status_code == 409:
            return None
        self._raise_for(response, 201)
        fence = self._fence_of(response)
        self._remember(key, token, fence, wire_ttl)
        return fence

    def _post_twice(
        self, url: str, headers: dict[str, str], body: dict[str, Any], wait: Optional[float] = None
    ) -> requests.Response:
        """A POST, sent once more (same headers: same token and request id) after a transport
        failure or a 503; the second failure raises ``BackendUnavailableError``.

        With ``wait``, the seconds the service may hold the request (``Prefer: wait``), both
        tries together end by the end of that wait and the answer's margin (see
        :meth:`_held`): the repeat asks to be held only for what is left of the wait, and
        is not sent when nothing is left (a service that did not answer in time is silent)."""
        end = None if wait is None else time.monotonic() + wait

        def post(send: Callable[..., requests.Response]) -> requests.Response:
            # A copy each time: sending adds the credential to the headers it is given.
            sent = dict(headers)
            if end is None:
                return send("POST", url, headers=sent, json=body, timeout=self.timeout)
            left = end - time.monotonic()
            sent[wire.HEADER_PREFER] = f"wait={wire.wait_text(left)}"
            return send("POST", url, headers=sent, json=body, timeout=self._held(left))

        def spent() -> bool:
            return end is not None and end - time.monotonic() < _SHORTEST_WAIT

        try:
            response = post(self._send)
        except (requests.ConnectionError, requests.Timeout) as exc:
            if spent():
                raise self._unavailable(exc) from exc
            return post(self._call)
        if response.status_code == 503 and not spent():
            return post(self._call)
        return response

    def _held(self, wait: float) -> tuple[float, float]:
        """The (connect, read) timeouts of a request the service may hold ``wait`` seconds: its
        answer is due then, after the service's last look at the store, which
        :data:`CALL_MARGIN` (or the request timeout, if shorter) covers. A request that the
        service does not answer by then meets a silent network, not a busy key."""
        bound = wait + min(self.timeout, CALL_MARGIN)
        return min(self.timeout, bound), bound

    @staticmethod
    def _fence_of(response: requests.Response) -> int:
        fence = response.json()["fencing_token"]
        if isinstance(fence, bool) or not isinstance(fence, int):
            raise requests.exceptions.InvalidJSONError(f"fencing_token is not an int: {fence!r}")
        return fence

    def _begin_attempt(self, attempt: tuple[str, str]) -> Optional[_Won]:
        """Count an acquisition of (key, token) in flight; the grant won for it, if any.

        Waits first for a give-back of the same token's unclaimed grant still on the wire.
        """
        while True:
            with self._mutex:
                giving_back = self._giving_back.get(attempt)
                if giving_back is None:
                    self._in_flight[attempt] = self._in_flight.get(attempt, 0) + 1
                    won = self._won.pop(attempt, None) if self._won else None
                    break
            giving_back.wait()
        if won is not None:
            won.taken.set()
        return won

    def _end_attempt(self, attempt: tuple[str, str]) -> None:
        with self._mutex:
            left = self._in_flight[attempt] - 1
            if left:
                self._in_flight[attempt] = left
            else:
                del self._in_flight[attempt]

    def _remember(self, key: str, token: str, fence: int, ttl: float) -> None:
        now = time.monotonic()
        with self._mutex:
            # A grant is over after its lease and the grace at the latest; forget older ones
            # so that a long-lived backend does not collect the fences of expired leases.
            for stale in [item for item, (_f, end) in self._fences.items() if end < now]:
                del self._fences[stale]
            self._fences[(key, token)] = (fence, _forget_after(now, ttl))
            # The caller holds this lease now: a grant a watching request won for it is this
            # same lease, nothing to claim or give back.
            won = self._won.pop((key, token), None) if self._won else None
        if won is not None:
            won.taken.set()

    def _prolong(self, key: str, token: str, ttl: float) -> None:
        with self._mutex:
            known = self._fences.get((key, token))
            if known is not None:
                self._fences[(key, token)] = (known[0], _forget_after(time.monotonic(), ttl))

    def _forget(self, key: str, token: Optional[str] = None) -> None:
        with self._mutex:
            for item in [item for item in self._fences if item[0] == key]:
                if token is None or item[1] == token:
                    del self._fences[item]
            # The release dropped whatever lease a watching request had won as well.
            dropped = [item for item in self._won if item[0] == key and (token is None or item[1] == token)]
            taken = [self._won.pop(item) for item in dropped]
        for won in taken:
            won.taken.set()

    def release(self, key: str, token: str) -> bool:
        """Drop our lease (``DELETE /locks/{key}/lease``); ``True`` when one was dropped."""
        return self._release(key, token, self.timeout)

    def _release(self, key: str, token: str, timeout: float) -> bool:
        """:meth:`release`, its request given up after ``timeout`` seconds."""
        self.check_key(key)
        self.check_token(token)
        response = self._call(
            "DELETE", self._url(key, lease=True), headers={wire.HEADER_TOKEN: token}, timeout=timeout
        )
        if response.status_code == 409:
            return False
        self._raise_for(response, 204)
        self._forget(key, token)
        # Against a server without the extension header a 204 can only be read as a drop.
        dropped = response.headers.get(wire.HEADER_RELEASED, "true").lower() == "true"
        if dropped:
            self._notify(key)  # waiters of this process need no server to hear of it
        return dropped

    def extend(self, key: str, token: str, ttl: float) -> bool:
        """Renew our lease to ``ttl`` from now (``PATCH /locks/{key}/lease``)."""
        self.check_key(key)
        self.check_token(token)
        wire_ttl = self.wire_ttl(ttl)
        response = self._call(
            "PATCH",
            self._url(key, lease=True),
            headers={wire.HEADER_TOKEN: token},
            json={"ttl_seconds": wire_ttl},
        )
        if response.status_code == 409:
            return False
        self._raise_for(response, 200)
        self._prolong(key, token, wire_ttl)
        return True

    def is_held(self, key: str, token: str) -> bool:
        """``True`` if the key is held with the fence this backend's grant to ``token`` got (one
        of its places, for a counting key)."""
        self.check_token(token)
        with self._mutex:
            known = self._fences.get((key, token))
        state = self.inspect(key)
        return known is not None and state.held and any(holder.fence == known[0] for holder in state.holders)

    def _state(self, key: str, body: dict[str, Any], expires_in: Optional[str]) -> LockState:
        if not body.get("held"):
            return LockState.free(key)
        limit = body.get("limit")
        if isinstance(limit, int) and not isinstance(limit, bool) and limit > 1:
            # A counting key: every place, each with its own remaining time.
            places = body.get("holders")
            if not isinstance(places, list):
                raise requests.exceptions.InvalidJSONError(f"holders is not a list: {places!r}")
            return LockState.counting(key, limit, [self._holder(place, place.get("expires_in")) for place in places])
        holder = self._holder(body, expires_in)
        return LockState(
            key=key,
            held=True,
            expires_at=holder.expires_at,
            fence=holder.fence,
            owner=holder.owner,
            expires_in=holder.expires_in,
        )

    @staticmethod
    def _holder(body: Any, expires_in: Any) -> Holder:
        """One lease as the service describes it (a held key, or a place of a counting key);
        ``expires_in``: the seconds until another token could take it, as the server measured
        them (``None`` when it did not say)."""
        if not isinstance(body, dict):
            raise requests.exceptions.InvalidJSONError(f"a holder is not an object: {body!r}")
        expires_at = _parse_time(body.get("expires_at"))
        if expires_in is not None:
            # Our server measures the time until another token may take the key, which is the
            # lease plus the grace second; report the lease itself, the moment expires_at names.
            remaining = float(expires_in) - wire.TAKEOVER_GRACE
        else:
            # The hosted service reports no remaining time: estimate it on our wall clock.
            remaining = (expires_at - datetime.now(timezone.utc)).total_seconds()
        fence = body.get("fencing_token")
        return Holder(
            owner=body.get("owner"),
            fence=fence if isinstance(fence, int) and not isinstance(fence, bool) else None,
            expires_at=expires_at,
            expires_in=max(0.0, remaining),
        )

    def inspect(self, key: str) -> LockState:
        """The state of ``key`` (``GET /locks/{key}``)."""
        self.check_key(key)
        response = self._call("GET", self._url(key))
        self._raise_for(response, 200)
        return self._state(key, response.json(), response.headers.get(wire.HEADER_EXPIRES_IN))

    def force_release(self, key: str) -> bool:
        """Drop whatever lease holds ``key`` (``DELETE /locks/{key}``)."""
        self.check_key(key)
        response = self._call("DELETE", self._url(key))
        self._raise_for(response, 204)
        self._forget(key)
        dropped = response.headers.get(wire.HEADER_RELEASED, "true").lower() == "true"
        if dropped:
            self._notify(key)
        return dropped

    def scan(self, prefix: str) -> Iterator[LockState]:
        """Held keys under ``prefix`` (``GET /locks?prefix=``, a lease_lock server extension)."""
        if prefix:
            self.check_key(prefix)
        response = self._call("GET", self._url(None), params={"prefix": prefix})
        self._raise_for(response, 200)
        states = [self._state(item["key"], item, str(item.get("expires_in", 0.0))) for item in response.json()["locks"]]
        return iter(states)

    # -- a waiting thread's own held acquisition --------------------------------------------------

    def join_line(
        self, key: str, token: str, ttl: float, owner: str, fenced: bool, clock: Callable[[], float],
        limit: int = 1,
    ) -> Optional[WaitingLine]:
        """A waiting thread's own acquisition held by the server, instead of a sleep and a wake
        from the watcher's thread: between attempts it sends its acquisition with ``Prefer:
        wait`` for the pause it would sleep, so the server turns the release into its grant and
        the thread holds the key when that request's answer arrives, with no thread between.

        Offered while the server announces waits to the millisecond (``X-Lease-Lock-Wait-Step``,
        a lease_lock server; a key's pause is mostly a fraction of a second), to at most
        :data:`LINE_WAITERS` threads of this backend at once; other threads are woken through
        :meth:`watch_releases` (see :class:`~lease_lock.backends.line.AnnouncedLine`). With
        ``limit`` above 1 the thread waits for a place of a counting key the same way: its
        acquisitions carry the limit, and the server holds them while every place is taken.
        Asks the server nothing.
        """
        if self._wait_offered <= 0 or not self._wait_step or not self._line_slots.take():
            return AnnouncedLine(self._announcements, self, key, token, ttl, owner, fenced, clock, limit)
        return _HeldAcquisition(self, key, token, ttl, owner, fenced, clock, limit)

    # -- release notifications through the wait extension -------------------------------------

    def watch_releases(self, callback: Callable[[str], None]) -> ReleaseWatcher:
        """Report releases of the keys this backend's acquisitions wait for.

        Uses the server's ``Prefer: wait`` extension: the watcher is ``active`` only while the
        server announces it (``X-Lease-Lock-Wait``), and a key is watched from its first refused
        acquisition until a few seconds after the last one.
        """
        # Active until the server's first answer says it offers no waits (then at its offer).
        watcher = _WaitWatcher(callback, self._count_waiters, lambda: self._wait_offered != 0)
        with self._mutex:
            self._watchers = [w for w in self._watchers if not w.closed()] + [watcher]
            # The refusal that made the caller start watching came just before: watch its key now.
            now = time.monotonic()
            recent = [key for key, refused in self._interest.items() if now - refused.seen <= _INTEREST_WINDOW]
        for key in recent:
            self._start_watch(key)
        return watcher

    def _watch(self, key: str, refused: _Refused) -> None:
        """Note a refused acquisition of ``key``; start its watching thread if none runs."""
        with self._mutex:
            if len(self._interest) > 1024:  # forget keys nobody waits for any more
                self._interest = {
                    k: r for k, r in self._interest.items() if refused.seen - r.seen <= _INTEREST_WINDOW
                }
            self._interest[key] = refused
        self._start_watch(key)

    def _start_watch(self, key: str) -> None:
        with self._mutex:
            if not self._listening() or self._wait_offered <= 0 or key in self._watching:
                return
            self._watching.add(key)
        thread = threading.Thread(target=self._watch_loop, args=(key,), name="lease-lock-http-watch", daemon=True)
        thread.start()

    def _listening(self) -> bool:
        return any(not watcher.closed() for watcher in self._watchers)

    def _notify(self, key: str) -> None:
        """Tell every open watcher that ``key`` was released."""
        with self._mutex:
            watchers = list(self._watchers)
        for watcher in watchers:
            watcher.notify(key)

    def _count_waiters(self, key: str, change: int) -> None:
        """Count the watchers with a thread waiting for ``key``; when the last one stops
        waiting, stop watching the key and give back what a watching request won for it."""
        with self._mutex:
            count = self._waiters.get(key, 0) + change
            if count > 0:
                self._waiters[key] = count
                return
            self._waiters.pop(key, None)
            if change > 0:
                return
            # Nobody here waits: a watching request in flight is not repeated, and a grant it
            # wins is given back as soon as it arrives (see _watch_loop).
            self._interest.pop(key, None)
            unclaimed = [(token, grant) for (name, token), grant in self._won.items() if name == key]
        for token, grant in unclaimed:
            self._give_back_unclaimed(key, token, grant)
            grant.taken.set()  # decided: the watching thread need not wait for a claim

    def _watch_loop(self, key: str) -> None:
        won: Optional[tuple[_Refused, _Won]] = None
        try:
            won = self._wait_for_grant(key)
        except Exception:  # noqa: BLE001 - a watch is an optimisation; the waiters retry anyway
            won = None
        finally:
            with self._mutex:
                self._watching.discard(key)
        if won is not None:
            refused, grant = won
            with self._mutex:
                abandoned = key not in self._interest
            if abandoned:
                # Every waiter here stopped waiting while the request was held (timed out,
                # cancelled; see _count_waiters): nobody claims this grant.
                self._give_back_unclaimed(key, refused.token, grant)
                return
            self._notify(key)  # the waiting acquisition takes the grant now
            if not grant.taken.wait(_CLAIM_WINDOW):
                self._give_back_unclaimed(key, refused.token, grant)

    def _wait_for_grant(self, key: str) -> Optional[tuple[_Refused, _Won]]:
        """Repeat the latest refused acquisition of ``key`` with ``Prefer: wait`` until granted
        (the grant, kept for its acquisition) or until nobody is refused any more."""
        while self._listening():
            with self._mutex:
                refused = self._interest.get(key)
            if refused is None or time.monotonic() - refused.seen > _INTEREST_WINDOW:
                return None
            wait = min(_WATCH_WAIT, self._wait_offered)
            if wait <= 0:
                return None
            sent = time.monotonic()
            body: dict[str, int] = {"ttl_seconds": refused.wire_ttl}
            if refused.limit > 1:
                body["limit"] = refused.limit
            response = self._call(
                "POST",
                self._url(key, lease=True),
                headers={**refused.headers, wire.HEADER_PREFER: f"wait={wait}"},
                json=body,
                timeout=self._held(wait),
            )
            if refused.limit > 1:
                self._raise_for_counted(key, refused.token, response, refused.limit)
            if response.status_code == 201:
                return self._keep(key, refused, response, sent)
            self._raise_for(response, 409)
            if wire.HEADER_PREFERENCE_APPLIED not in response.headers:
                # The server had no free waiting slot and answered at once: the waiters'
                # own schedule (at most a second) covers this key until the next try.
                return None
        return None

    def _keep(
        self, key: str, refused: _Refused, response: requests.Response, sent: float
    ) -> Optional[tuple[_Refused, _Won]]:
        """Keep a watching request's grant for the acquisition it repeats."""
        fence = self._fence_of(response)
        grant = _Won(
            fence, sent + _held_back(response, sent), refused.wire_ttl, refused.headers.get(wire.HEADER_OWNER),
            refused.limit,
        )
        attempt = (key, refused.token)
        with self._mutex:
            if attempt in self._fences:
                # The acquisition got this lease by a request of its own (the server renewed
                # it for the watching request): nothing to keep.
                return None
            self._won[attempt] = grant
        return refused, grant

    def _give_back_unclaimed(self, key: str, token: str, grant: _Won) -> None:
        """Release a won grant nobody claimed (the waiter gave up), unless its acquisition is on
        the wire right now: then its own answer decides, and the lease is never released under
        a caller that was just told it holds it."""
        attempt = (key, token)
        with self._mutex:
            if self._won.get(attempt) is not grant:
                return  # claimed, renewed or released meanwhile
            del self._won[attempt]
            if attempt in self._in_flight:
                return
            done = threading.Event()
            self._giving_back[attempt] = done
        try:
            response = self._call("DELETE", self._url(key, lease=True), headers={wire.HEADER_TOKEN: token})
        except Exception:  # noqa: BLE001 - best effort: the lease runs out on its own
            response = None
        finally:
            with self._mutex:
                del self._giving_back[attempt]
            done.set()
        if response is not None and response.status_code == 204:
            self._notify(key)  # another waiter of this process may take it now

    def close(self) -> None:
        """Close the session if this backend created it."""
        self._announcements.close()
        with self._mutex:
            watchers, self._watchers = self._watchers, []
            unclaimed = list(self._won.items())
        for watcher in watchers:
            watcher.close()
        # Nobody can claim these any more: give them back now rather than after the window.
        for (key, token), grant in unclaimed:
            self._give_back_unclaimed(key, token, grant)
            grant.taken.set()
        if self._own_session:
            self._session.close()
            if self._direct is not None:
                self._direct.close()
