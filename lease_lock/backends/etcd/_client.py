"""A small client of etcd's v3 JSON gateway: endpoints, failover and auth.

Every call is one ``POST`` of a JSON body to a ``/v3/...`` path of one member, sent through the
``requests`` session, or over the client's own connections when the backend made the session
itself (see :mod:`._direct`); watch streams always use the session. The client keeps
using the member that answered last; a member that refuses, resets, times out or answers that
it cannot serve now (no leader, lost quorum, a leader change, a request timed out inside the
cluster) is left at once for the next one, so one stalled member costs one ``timeout``, not a
lease. Only when every member failed in turn does a call raise
:class:`~lease_lock.errors.BackendUnavailableError`, with the last failure as ``__cause__``.
Clients start on a member chosen at random, which spreads many processes over the cluster.

With a user name, the client authenticates on first use and sends etcd's token with every
request; a token etcd no longer accepts (it expired, or the member restarted) is replaced once
and the request sent again.
"""

from __future__ import annotations

import base64
import http.client
import json
import random
import ssl
import threading
import time
from typing import Any, ContextManager, Iterator, Optional, Sequence

import requests
from requests.utils import select_proxy

from ...errors import BackendUnavailableError
from ..base import CallBudget
from ._direct import DirectConnections, tls_context

__all__ = ["CODE_NOT_FOUND", "EtcdClient", "EtcdError", "b64", "prefix_end", "unb64"]

#: The gRPC status code of etcd's "requested lease not found" (and other missing things).
CODE_NOT_FOUND = 5
# What a member that refuses, resets, stalls or cannot serve raises: try the next one.
_TRY_NEXT = (requests.ConnectionError, requests.Timeout, OSError, http.client.HTTPException)
# gRPC status codes the gateway reports in its error bodies.
_CODE_UNAUTHENTICATED = 16
# A member that cannot serve now: unavailable, deadline exceeded, resource exhausted, aborted.
_CODES_TRY_ELSEWHERE = frozenset({14, 4, 8, 10})
_MESSAGES_TRY_ELSEWHERE = (
    "no leader",
    "leader changed",
    "request timed out",
    "timed out",
    "too many requests",
    "not capable",
    "stopped",
    "unhealthy cluster",
)


def b64(data: bytes) -> str:
    """``data`` as the gateway carries bytes: standard base64 text."""
    return base64.b64encode(data).decode("ascii")


def unb64(text: Optional[str]) -> bytes:
    """Bytes from the gateway's base64 text (an omitted field is empty)."""
    return base64.b64decode(text) if text else b""


def prefix_end(prefix: bytes) -> bytes:
    """The range end that makes a range over ``[prefix, end)`` cover every key under ``prefix``."""
    trimmed = bytearray(prefix)
    while trimmed:
        if trimmed[-1] < 0xFF:
            trimmed[-1] += 1
            return bytes(trimmed)
        trimmed.pop()
    return b"\x00"  # etcd's "every key" range end


class EtcdError(Exception):
    """An error answer of etcd that is not an outage (a refused permission, a bad request).

    ``code`` is the gRPC status code etcd gave (``7`` permission denied, ``3`` invalid
    argument, ...) and ``str(error)`` its message.
    """

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class _TryElsewhere(Exception):
    """This member cannot serve the request now; the next one may."""


class EtcdClient:
    """POSTs JSON to a list of etcd members, failing over between them.

    ``endpoints`` are base URLs (``http://127.0.0.1:2379``); ``session`` carries TLS settings
    (``verify``, ``cert``) and pooling; ``direct`` sends the requests that are no watch over
    the client's own connections with the session's TLS settings (for a session nobody else
    configured: see :mod:`._direct`); ``timeout`` bounds each request's connect and each read
    (half of it for keep-alives). A call given ``within`` seconds, or made inside a
    :meth:`budget`, also ends by then, failing over to the next member only while time is left.
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        session: requests.Session,
        *,
        timeout: float,
        user: Optional[str] = None,
        password: Optional[str] = None,
        direct: bool = False,
    ) -> None:
        self.endpoints = list(endpoints)
        self.session = session
        self._direct = DirectConnections() if direct else None
        self.timeout = timeout
        self._user = user
        self._password = password
        self._mutex = threading.Lock()
        self._current = random.SystemRandom().randrange(len(self.endpoints))
        self._token: Optional[str] = None
        #: Endpoint -> the session's settings from the environment for it (see send).
        self._settings: dict[str, dict[str, Any]] = {}
        #: Endpoint -> whether its requests go over the own connections, and their TLS context.
        self._routes: dict[str, tuple[bool, Optional[ssl.SSLContext]]] = {}
        self._budget = CallBudget(0.0)

    def budget(self, seconds: float) -> ContextManager[None]:
        """End the calls and keep-alives this thread makes inside the block by ``seconds`` from
        now (``math.inf``: no sooner than their own timeouts say)."""
        return self._budget.block(seconds)

    def _deadline(self, within: Optional[float]) -> Optional[float]:
        """When a call given ``within`` seconds (``None``: its timeouts alone) must end."""
        until = self._budget.deadline
        if within is None:
            return until
        asked = time.monotonic() + within
        return asked if until is None else min(until, asked)

    def reset_after_fork(self, session: requests.Session) -> None:
        """In a forked child: a session of its own and fresh locks (the parent's may be held)."""
        self.session = session
        self._settings = {}
        self._routes = {}
        self._mutex = threading.Lock()
        if self._direct is not None:
            self._direct.after_fork()

    def close(self) -> None:
        """Close the client's own connections (the session is its owner's to close)."""
        if self._direct is not None:
            self._direct.close()

    def order(self) -> list[str]:
        """The endpoints in the order the next call tries them: the last good one first."""
        start = self._current
        return self.endpoints[start:] + self.endpoints[:start]

    def _settle_on(self, endpoint: str) -> None:
        self._current = self.endpoints.index(endpoint)

    def unavailable(self, cause: BaseException) -> BackendUnavailableError:
        """The error of a cluster none of whose members could serve (``cause`` is the last)."""
        error = BackendUnavailableError(
            f"no etcd member of {', '.join(self.endpoints)} could serve ({cause})",
            backend="etcd",
        )
        error.__cause__ = cause
        return error

    def call(self, path: str, body: dict[str, Any], within: Optional[float] = None) -> dict[str, Any]:
        """POST ``body`` to ``path`` on the first member that serves it; its decoded answer.
        With ``within``, the call ends by that many seconds from now."""
        deadline = self._deadline(within)
        last: Optional[BaseException] = None
        try:
            for endpoint in self.order():
                timeout = _time_left(self.timeout, deadline)
                if timeout <= 0:
                    last = last or requests.Timeout(f"no time left for {path}")
                    break
                try:
                    answer = self._call_one(endpoint, path, body, timeout)
                except (*_TRY_NEXT, _TryElsewhere) as error:
                    last = error
                    continue
                self._settle_on(endpoint)
                return answer
            assert last is not None
            raise self.unavailable(last)
        finally:
            # The error's traceback holds this frame, and through it every caller's frame with
            # its locals: kept here, it would make a reference cycle only the cyclic collector
            # frees (a lock its holder dropped would outlive the drop until then).
            del last

    def _headers(self, endpoint: str, *, renew: bool = False) -> dict[str, str]:
        if self._user is None:
            return {}
        with self._mutex:
            if self._token is None or renew:
                self._token = self._authenticate(endpoint)
            return {"Authorization": self._token}

    def _authenticate(self, endpoint: str) -> str:
        answer = self._post(endpoint, "/v3/auth/authenticate", {"name": self._user, "password": self._password}, {})
        return str(answer["token"])

    def _call_one(self, endpoint: str, path: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        try:
            return self._post(endpoint, path, body, self._headers(endpoint), timeout)
        except EtcdError as error:
            if error.code != _CODE_UNAUTHENTICATED or self._user is None:
                raise
        # etcd forgot our token (it expired, or the member restarted): one more, once.
        return self._post(endpoint, path, body, self._headers(endpoint, renew=True), timeout)

    def send(
        self, endpoint: str, path: str, data: str, headers: dict[str, str], timeout: Any, stream: bool = False
    ) -> requests.Response:
        """One POST of ``data`` to ``path`` on ``endpoint`` through the session.

        Sent as ``Session.post`` would (the session's headers, cookies, auth, adapters and
        hooks), except that the settings ``requests`` reads from the environment (proxies,
        ``NO_PROXY``, ``REQUESTS_CA_BUNDLE``) are read once per member instead of on every
        request: reading them costs a fifth of a request's own time, and every lock operation
        waits for it. ``verify`` is the session's own, given explicitly as before, because
        ``requests`` lets ``REQUESTS_CA_BUNDLE`` (and ``CURL_CA_BUNDLE``) override a session's
        CA bundle otherwise, which would silently drop the ``ca=`` of an ``etcds://`` URL.
        """
        request = self.session.prepare_request(requests.Request("POST", endpoint + path, headers=headers, data=data))
        return self.session.send(request, timeout=timeout, stream=stream, **self._settings_for(endpoint))

    def _settings_for(self, endpoint: str) -> dict[str, Any]:
        settings = self._settings.get(endpoint)
        if settings is None:
            merged = self.session.merge_environment_settings(endpoint, {}, None, self.session.verify, None)
            settings = self._settings[endpoint] = {key: merged[key] for key in ("proxies", "verify", "cert")}
        return settings

    def _exchange(
        self, endpoint: str, path: str, data: str, headers: dict[str, str], timeout: float
    ) -> tuple[int, bytes, str]:
        """One POST that is no watch: the answer's status, body and URL. Over the client's own
        connections when it has them and no proxy applies to ``endpoint``, else the session."""
        if self._direct is not None:
            route = self._routes.get(endpoint)
            if route is None:
                settings = self._settings_for(endpoint)
                direct = not select_proxy(endpoint, settings["proxies"])
                https = direct and endpoint.startswith("https:")
                route = self._routes[endpoint] = (
                    direct, tls_context(settings["verify"], settings["cert"]) if https else None
                )
            if route[0]:
                status, body = self._direct.post(endpoint, path, data.encode(), headers, timeout, route[1])
                return status, body, endpoint + path
        response = self.send(endpoint, path, data, headers, timeout)
        return response.status_code, response.content, response.url

    def _post(
        self, endpoint: str, path: str, body: Any, headers: dict[str, str], timeout: Optional[float] = None
    ) -> dict[str, Any]:
        data = body if isinstance(body, str) else json.dumps(body)
        timeout = self.timeout if timeout is None else timeout
        return self._decode(*self._exchange(endpoint, path, data, headers, timeout))

    @staticmethod
    def _decode(status: int, body: bytes, url: str) -> dict[str, Any]:
        try:
            answer = json.loads(body)
        except ValueError:
            if status >= 500:
                raise _TryElsewhere(f"HTTP {status} from {url}") from None
            if status >= 400:
                raise requests.HTTPError(f"HTTP {status} from {url}") from None
            raise
        if not isinstance(answer, dict):
            raise _TryElsewhere(f"unexpected answer from {url}")
        if "error" in answer or status >= 400:
            message = str(answer.get("message") or answer.get("error") or status)
            code = int(answer.get("code") or 0)
            lowered = message.lower()
            if code in _CODES_TRY_ELSEWHERE or any(text in lowered for text in _MESSAGES_TRY_ELSEWHERE):
                raise _TryElsewhere(message)
            raise EtcdError(message, code)
        return answer

    def keepalive(self, leases: Sequence[str], within: Optional[float] = None) -> dict[str, int]:
        """Renew ``leases`` through one keep-alive stream per round; each lease's new TTL (0 for
        a lease etcd no longer has). With ``within``, the call ends by that many seconds from now.

        The gateway may cut a stream's answers short once the request's body has ended (often
        after its first 4 KiB of answers), so the leases left unanswered go out again in another
        round. Renewing a lease twice is harmless; a round that answers nothing counts as a
        failure of that member.
        """
        deadline = self._deadline(within)
        left: dict[str, int] = {}
        pending = list(dict.fromkeys(leases))
        last: Optional[BaseException] = None
        failures = 0
        while pending:
            # Half the timeout: a keep-alive is safe to repeat, and a member whose leader just
            # died holds one until it learns of the next leader, while another member may
            # already know it.
            timeout = _time_left(self.timeout / 2, deadline)
            if timeout <= 0:
                raise self.unavailable(last or requests.Timeout("no time left for a keep-alive"))
            if failures >= len(self.endpoints):
                assert last is not None
                raise self.unavailable(last)
            endpoint = self.order()[0]
            try:
                answers = self._keepalive_round(endpoint, pending, timeout)
            except (*_TRY_NEXT, _TryElsewhere) as error:
                answers, last = {}, error
            if not answers:
                last = last or _TryElsewhere(f"no keep-alive answers from {endpoint}")
                failures += 1
                self._current = (self.endpoints.index(endpoint) + 1) % len(self.endpoints)
                continue
            failures = 0
            left.update(answers)
            pending = [lease for lease in pending if lease not in left]
        return left

    def _keepalive_round(self, endpoint: str, leases: Sequence[str], timeout: float) -> dict[str, int]:
        body = "".join(json.dumps({"ID": lease}) for lease in leases)
        try:
            headers = self._headers(endpoint)
            status, stream, url = self._exchange(endpoint, "/v3/lease/keepalive", body, headers, timeout)
        except EtcdError as error:
            if error.code != _CODE_UNAUTHENTICATED or self._user is None:
                raise
            self._headers(endpoint, renew=True)
            raise _TryElsewhere(str(error)) from error
        answers: dict[str, int] = {}
        for line in stream.splitlines():
            try:
                message = json.loads(line)
            except ValueError:
                continue  # the last line of a stream cut short
            if not isinstance(message, dict):
                continue
            if "error" in message:
                details = message["error"] if isinstance(message["error"], dict) else {}
                text = str(details.get("message") or message["error"])
                code = int(details.get("code") or details.get("grpc_code") or 0)
                if code == _CODE_UNAUTHENTICATED and self._user is not None:
                    self._headers(endpoint, renew=True)
                    raise _TryElsewhere(text)
                if code in _CODES_TRY_ELSEWHERE or any(part in text.lower() for part in _MESSAGES_TRY_ELSEWHERE):
                    raise _TryElsewhere(text)
                raise EtcdError(text, code)
            result = message.get("result")
            if isinstance(result, dict) and "ID" in result:
                answers[str(result["ID"])] = int(result.get("TTL") or 0)
        if not answers and status >= 400:
            self._decode(status, stream, url)
        return answers

    def watch(self, endpoint: str, request: dict[str, Any]) -> requests.Response:
        """Open a watch stream on ``endpoint``; the caller reads and closes the response.

        Connecting is bounded by ``timeout``; reading is not, since an idle watch is quiet.
        """
        try:
            headers = self._headers(endpoint)
            return self.send(endpoint, "/v3/watch", json.dumps(request), headers, (self.timeout, None), stream=True)
        except (requests.ConnectionError, requests.Timeout, _TryElsewhere) as error:
            raise self.unavailable(error) from error

    @staticmethod
    def messages(response: requests.Response) -> Iterator[dict[str, Any]]:
        """The decoded messages of a watch stream, as they arrive."""
        for line in response.iter_lines(chunk_size=None):
            if line:
                yield _decode_stream_message(line)


def _time_left(timeout: float, deadline: Optional[float]) -> float:
    """A request's timeout: ``timeout``, cut to what is left before ``deadline`` (if any)."""
    return timeout if deadline is None else min(timeout, deadline - time.monotonic())


def _decode_stream_message(line: bytes) -> dict[str, Any]:
    message = json.loads(line)
    if "error" in message:
        # The stream is over either way; the watcher reconnects as after a dropped connection.
        error = message["error"]
        raise requests.ConnectionError(str(error.get("message") or error))
    result = message.get("result", {})
    return result if isinstance(result, dict) else {}
