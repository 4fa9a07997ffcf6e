"""The etcd backend: one etcd lease per lock, every check and write in one transaction.

Layout: a lock on ``key`` is the etcd key ``namespace + key``, attached to a lease of its own.
Its value is the holder's token, a NUL byte, then the owner label. "``token`` holds the key" is
checked inside etcd's transactions as "the value sorts strictly between ``token`` and
``token + "\\x01"``": only values that start with ``token`` and a NUL do, since tokens contain
no NUL. So a guard needs no read before the write, and the owner rides in the same key.

- **acquire**: a lease (a spare one, which lost an earlier race or held a key this backend
  released, renewed by a keep-alive, else a new grant: see :mod:`._leases`), then one
  transaction: "if the key does not exist, put it on that lease; else if our token holds it,
  put it on that lease (same key, so the same ``create_revision``) and say which lease it
  had". A re-acquire revokes the old lease; a lost race keeps the one it brought for the next
  attempt.
- **fence** = the key's ``create_revision``: etcd's revision counts every write of the whole
  cluster, is stored with the data (it survives restarts, leader changes and compaction) and
  only grows; a key created again after a release or an expiry gets the revision of that new
  write, so every later grant has a larger fence, and extending or re-acquiring (a put on the
  existing key that keeps its value) keeps it. A key a release handed straight to a waiter
  (``direct_handoff``) carries its fence in its value instead (see ``_line``).
- **extend** with the lease's own length: a read of the key (its token checked, its lease
  noted), then a keep-alive of that lease. With another length, the key moves to a new lease of that length (a guarded
  put that keeps the value) and the old lease is revoked: the new expiry replaces the old one.
- **release**: one guarded delete ("if ``token`` holds the key, delete it"), whose answer names
  the lease the key was on: when that is the lease this backend put it on (noted at the grant,
  and at a move to another length), the lease is kept as a spare for the next lock of its
  length, which renews it instead of granting one (see :mod:`._leases`); any other lease is
  revoked. A key on a lease a waiter brought (a ready lease, a place's claim lease) is released
  by the revoke of that lease, which deletes the key in the same write, and by the guarded
  delete when etcd no longer has the lease. What no release can notice: the key deleted behind
  the library's back (``etcdctl del``) while the lease lives; the heartbeat's next read sees it.
- **force_release**: a delete of the key guarded by the holding read (its ``create_revision``
  and value), then the revoke of the lease that delete found the key on, so the holder's
  extends and release find it gone; never a lease read before the delete, which its holder may
  have released and taken again for another key meanwhile.
- **extend_many**: the reads of up to 100 keys in one transaction, then one keep-alive
  request carrying all their leases.
- **direct hand-off** (``direct_handoff``): a release that finds a place in the key's line (as
  the line watcher follows it, else by a serializable read) puts the key on the oldest place's
  claim lease in one guarded transaction (see ``_line``); else it releases as above.
- **hand-off**: waiting processes queue under ``namespace + NUL + "queue" + NUL + key`` (no
  lock key contains a NUL, so ``scan`` skips those names); the grant transaction of a queued
  waiter deletes its queue entry as well. The queue only decides whom a release wakes. A queued
  waiter's attempt skips the lease grant: it puts the key on a lease its watcher kept ready,
  which etcd runs at least the asked length from the attempt on (see ``_handoff``); such a key's
  lease runs up to two seconds longer in etcd than asked until its first extend moves it to a
  lease of its own length.

- **counting keys** (``limit`` > 1): one key per place, ``namespace + key + NUL + "place" +
  NUL + token``, on a lease of its own; each grant is one transaction guarded by "no lock key,
  and no place created since the read it decided on" (see :mod:`._places`). Exclusive grants
  guard on "no place", and the other primitives act on the token's place.

TTLs: etcd grants whole seconds, at least its minimum (2 s with the default 1 s election
timeout), so a ttl is rounded up to whole seconds and to that minimum; the core still judges
the local lease on the ttl the caller asked for, from when the request was sent, so the store's
lease is never shorter than the one the caller believes in. A leader change restarts every
lease at its full length, so a dead holder's key may free up to one ttl late; never early.
"""

from __future__ import annotations

import contextlib
import math
import threading
import urllib.parse
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, ClassVar, ContextManager, Iterator, Mapping, Optional, Sequence, TypeVar

import requests

from ... import forksafe
from ...errors import BackendUnavailableError, ValidationError
from ...validation import check_bool, check_duration
from ..base import (
    CALL_MARGIN,
    Capabilities,
    ExtendRequest,
    Holder,
    LockState,
    ReleaseWatcher,
    WaitingLine,
    limit_mismatch,
    parse_bool,
    parse_url_options,
)
from ..line import AnnouncedLine, Announcements, LineSlots, claim_for
from ..service import ServiceStore
from ._client import CODE_NOT_FOUND, EtcdClient, EtcdError, b64, prefix_end, unb64
from ._counters import count_in_window
from ._handoff import EtcdHandoffWatcher, ReadyLease
from ._leases import SpareLeases
from ._line import (
    UNKNOWN,
    EtcdLineWatcher,
    EtcdWaitingLine,
    LineCalls,
    Unknown,
    fence_of,
    holds,
    line_range,
    owner_of,
    ranged,
    token_guard,
)
from ._places import (
    limit_of,
    no_places,
    place_name,
    place_value,
    places_created_by,
    places_range,
)
from ._watch import EtcdReleaseWatcher, WatchStream, counted_key, lock_key

__all__ = ["DEFAULT_NAMESPACE", "MIN_TTL", "EtcdBackend", "lease_seconds"]

#: The prefix every lock key gets in etcd unless ``namespace`` says otherwise.
DEFAULT_NAMESPACE = "lease_lock/"
#: etcd's shortest lease with its default election timeout (1.5 election timeouts, rounded up).
MIN_TTL = 2
# etcd's longest lease.
_MAX_TTL = 9_000_000_000
# Keys per batched transaction: below etcd's default limit of 128 operations per transaction.
_BATCH = 100
_DEFAULT_PORT = 2379
# Holdings noted for the release (see _holdings); beyond it the oldest is forgotten (a lock taken and
# never released, as a service's abandoned leases are, must not grow the map for ever). A
# forgotten one's release takes the guarded path: slower, never wrong.
_HOLDINGS = 16_384
_Watcher = TypeVar("_Watcher", bound=WatchStream)


def lease_seconds(ttl: float) -> int:
    """``ttl`` as etcd grants it: whole seconds, rounded up, at least :data:`MIN_TTL`."""
    if not ttl <= _MAX_TTL:
        raise ValidationError(f"ttl must be at most {_MAX_TTL} seconds on etcd")
    return max(MIN_TTL, math.ceil(ttl))


def _positive_seconds(text: str) -> float:
    return check_duration(float(text), "timeout")


def _url_endpoints(netloc: str, scheme: str) -> list[str]:
    hosts = netloc.rpartition("@")[2]
    endpoints = []
    for item in hosts.split(","):
        parts = urllib.parse.urlsplit(f"//{item}")
        try:
            port = parts.port or _DEFAULT_PORT
        except ValueError:
            raise ValidationError(f"etcd URL host {item!r} has a bad port (expected 1 to 65535)") from None
        if not parts.hostname:
            raise ValidationError("an etcd URL needs at least one host: etcd://host:port[,host:port...]")
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        endpoints.append(f"{scheme}://{host}:{port}")
    return endpoints


def _check_endpoints(endpoints: Sequence[str]) -> list[str]:
    if isinstance(endpoints, str) or not endpoints:
        raise ValidationError("endpoints must be a non-empty list of http:// or https:// base URLs")
    checked = []
    for endpoint in endpoints:
        parts = urllib.parse.urlsplit(endpoint) if isinstance(endpoint, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValidationError(f"endpoints must be http:// or https:// base URLs, got {endpoint!r}")
        checked.append(endpoint.rstrip("/"))
    return checked


class _LeaseGone(BackendUnavailableError):
    """etcd refused a write because the lease it names is gone; nothing was written."""


class EtcdBackend(ServiceStore):
    """Leases kept by an etcd cluster (v3), over its JSON gateway.

    ``endpoints`` are the members' client URLs (``http://10.0.0.1:2379``); ``session`` a
    ``requests.Session`` to send every request with (TLS settings, adapters and hooks included;
    it stays the caller's to close); without one, the backend makes its own and sends all but
    its watch streams over plain pooled connections with that session's TLS settings, which
    costs a fraction of the client CPU (see :mod:`._direct`);
    ``namespace`` the prefix of every key in etcd; ``timeout`` seconds for each request to one
    member before the next one is tried; ``user``/``password`` etcd credentials, when the
    cluster has auth enabled; ``direct_handoff`` makes a release hand the key straight to the
    thread that waited longest in the key's line (see :meth:`join_line`).
    """

    capabilities: ClassVar[Capabilities] = Capabilities(
        server_clock=True,
        fencing=True,
        release_notify=True,
        scan=True,
        batch_extend=True,
        counting=True,
        replica_wait=False,
        min_ttl=float(MIN_TTL),
        clock="the etcd leader's lease clock (whole seconds; a leader change restarts every lease)",
        wake="a wake-one queue over one watch stream; a direct line with direct_handoff=True",
    )
    url_options: ClassVar[Mapping[str, Callable[[str], Any]]] = {
        "namespace": str,
        "timeout": _positive_seconds,
        "ca": str,
        "cert": str,
        "key": str,
        "direct_handoff": parse_bool,
    }

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        session: Optional[requests.Session] = None,
        namespace: str = DEFAULT_NAMESPACE,
        timeout: float = 2.0,
        user: Optional[str] = None,
        password: Optional[str] = None,
        direct_handoff: bool = False,
    ) -> None:
        checked = _check_endpoints(endpoints)
        if not isinstance(namespace, str) or "\x00" in namespace:
            raise ValidationError("namespace must be a str without NUL characters")
        timeout = check_duration(timeout, "timeout")
        if user is not None and (not isinstance(user, str) or not user):
            raise ValidationError("user must be a non-empty str (an etcd user name)")
        if (user is None) != (password is None):
            raise ValidationError("user and password go together: give both or neither")
        self.namespace = namespace
        #: Whether a release hands the key straight to the oldest waiter in line (see
        #: join_line); off, waiters are woken through the watch and take the key themselves.
        self.direct_handoff = check_bool(direct_handoff, "direct_handoff")
        self._prefix = namespace.encode()
        self._own_session = session is None
        self._client = EtcdClient(
            checked, session if session is not None else requests.Session(),
            timeout=timeout, user=user, password=password, direct=session is None,
        )
        self._watchers: list[WatchStream] = []
        # Lease length asked -> length etcd granted, when etcd's minimum raised it.
        self._granted: dict[int, int] = {}
        self._spares = SpareLeases()
        # (name, token) -> the lease this backend put the key on, and its length when the
        # lease is one of the backend's own (a release then keeps it as a spare, see _leases);
        # None for a lease a waiter brought (released by revoke).
        self._holdings: dict[tuple[bytes, str], tuple[str, Optional[int]]] = {}
        self._holdings_mutex = threading.Lock()
        # The lease length of the latest attempt that found its key held (see _expect_wait).
        self._lost_length: Optional[int] = None
        self._line_slots = LineSlots()
        #: The shared watcher of the waiters beyond the line (see join_line).
        self._announcements = Announcements(self)
        self._line_watcher: Optional[EtcdLineWatcher] = None
        self._line_mutex = threading.Lock()
        self._closed = False
        forksafe.register(self)

    @property
    def endpoints(self) -> list[str]:
        """The members' client URLs, in the order they were given."""
        return list(self._client.endpoints)

    def __repr__(self) -> str:
        return f"EtcdBackend({self._client.endpoints!r}, namespace={self.namespace!r})"

    @classmethod
    def from_url(cls, url: str, **options: Any) -> EtcdBackend:
        """``etcd://[user:password@]host[:port][,host[:port]...][?namespace=...&timeout=...]``
        (and ``direct_handoff=true``); ``etcds://`` for TLS, with ``ca=`` (a CA bundle),
        ``cert=`` and ``key=`` (a client certificate and its key, for clusters that check them)."""
        parts = urllib.parse.urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ("etcd", "etcds"):
            raise ValidationError(f"an etcd URL starts with etcd:// or etcds://, got {scheme}://")
        if parts.path not in ("", "/"):
            raise ValidationError("an etcd URL has no path: put keys under a prefix with ?namespace=")
        parsed = parse_url_options(url, cls.url_options, options, backend="etcd")
        tls = {name: parsed.pop(name) for name in ("ca", "cert", "key") if name in parsed}
        if tls and scheme != "etcds":
            raise ValidationError("ca, cert and key are TLS options: use an etcds:// URL")
        if ("cert" in tls) != ("key" in tls):
            raise ValidationError("cert and key go together: a client certificate needs its key")
        userinfo, at, _hosts = parts.netloc.rpartition("@")
        if at and "user" not in parsed:
            user, _colon, password = userinfo.partition(":")
            parsed["user"] = urllib.parse.unquote(user)
            parsed["password"] = urllib.parse.unquote(password)
        endpoints = _url_endpoints(parts.netloc, "https" if scheme == "etcds" else "http")
        backend = cls(endpoints, **parsed)
        # The backend's own session: read for its TLS settings on the first request.
        session = backend._client.session
        if "ca" in tls:
            session.verify = tls["ca"]
        if "cert" in tls:
            session.cert = (tls["cert"], tls["key"])
        return backend

    # -- fork --------------------------------------------------------------------------------

    def before_fork(self) -> None:
        """Fork hook: nothing to quiesce (each request holds no lock of ours while it waits)."""

    def after_fork_in_parent(self) -> None:
        """Fork hook: nothing to undo."""

    def after_fork(self) -> None:
        """Fork hook, in the child: a session of its own, never the parent's connections."""
        parent = self._client.session
        session = requests.Session()
        session.verify, session.cert = parent.verify, parent.cert
        session.headers.update(parent.headers)
        self._client.reset_after_fork(session)
        self._own_session = True
        # The parent's watching threads do not exist here.
        self._watchers = []
        self._line_watcher = None
        self._line_mutex = threading.Lock()
        # Both processes would attach keys to the same spare leases.
        self._spares.after_fork()
        # A parent thread may have held the mutex at the fork; the child's releases of the
        # parent's keys take the guarded path.
        self._holdings_mutex = threading.Lock()
        self._holdings = {}

    # -- encoding ----------------------------------------------------------------------------

    def _name(self, key: str) -> bytes:
        return self._prefix + key.encode()

    def _key_of(self, name: bytes) -> str:
        return name[len(self._prefix):].decode("utf-8", "replace")

    # -- calls ---------------------------------------------------------------------------------

    def _call(self, path: str, body: dict[str, Any], within: Optional[float] = None) -> dict[str, Any]:
        return self._client.call(path, body, within)

    def call_budget(self, seconds: float) -> ContextManager[None]:
        """Bound the requests this thread sends inside the block (see
        :meth:`Backend.call_budget`): each ends by ``seconds`` and :data:`~lease_lock.backends.base.CALL_MARGIN`
        from now, sooner than its ``timeout`` when that is shorter, and failing over to the
        next member only while time is left; the call then raises ``BackendUnavailableError``."""
        return self._client.budget(seconds + CALL_MARGIN)

    def _txn(
        self,
        compare: list[dict[str, Any]],
        success: list[dict[str, Any]],
        failure: Optional[list[dict[str, Any]]] = None,
    ) -> dict[str, Any]:
        try:
            return self._call("/v3/kv/txn", {"compare": compare, "success": success, "failure": failure or []})
        except EtcdError as error:
            if error.code != CODE_NOT_FOUND:
                raise
            # The lease granted for this write ran out before the write was applied (an
            # election longer than the lease), or was revoked: nothing was written.
            raise _LeaseGone(f"etcd lease ran out before the write ({error})", backend="etcd") from error

    def _grant(self, seconds: int, within: Optional[float] = None) -> str:
        answer = self._call("/v3/lease/grant", {"TTL": seconds}, within)
        granted = int(answer.get("TTL") or seconds)
        if granted != seconds:
            self._granted[seconds] = granted
        return str(answer["ID"])

    def _lease_for(self, seconds: int) -> str:
        """A lease of ``seconds`` for one acquisition: a spare one renewed by a keep-alive (the
        leader's answer alone), else a new grant (a replicated write); see :mod:`._leases`."""
        spare = self._spares.take(seconds)
        # A failed keep-alive raises (the lease, not known to be renewed, runs out).
        if spare is not None and self._keepalive([spare]).get(spare, 0) >= seconds:
            return spare
        return self._grant(seconds)

    def _revoke(self, lease: Optional[str]) -> None:
        # Best effort: a lease left behind holds no key and runs out by itself.
        if not lease or lease == "0":
            return
        with contextlib.suppress(BackendUnavailableError, EtcdError):
            self._call("/v3/lease/revoke", {"ID": lease})

    def _revoke_holding(self, lease: str) -> bool:
        """Revoke ``lease`` and the key on it; ``False`` when etcd no longer has the lease.
        Any other failure raises: the key may still be held."""
        try:
            self._call("/v3/lease/revoke", {"ID": lease})
        except EtcdError as error:
            if error.code != CODE_NOT_FOUND:
                raise
            return False
        return True

    def _note_holding(self, name: bytes, token: str, lease: str, seconds: Optional[int] = None) -> None:
        with self._holdings_mutex:
            self._holdings.pop((name, token), None)  # a re-acquire: the newest goes last
            self._holdings[(name, token)] = (lease, seconds)
            if len(self._holdings) > _HOLDINGS:
                del self._holdings[next(iter(self._holdings))]

    def _keepalive(self, leases: Sequence[str], within: Optional[float] = None) -> dict[str, int]:
        return self._client.keepalive(leases, within)

    def _remaining(self, lease: Optional[str]) -> Optional[float]:
        if not lease or lease == "0":
            return None
        answer = self._call("/v3/lease/timetolive", {"ID": lease})
        return float(max(0, int(answer.get("TTL") or 0)))

    # -- primitives ----------------------------------------------------------------------------

    def acquire(self, key: str, token: str, ttl: float, owner: str) -> bool:
        """Grant or renew ``key`` for ``token`` (one lease grant and one transaction)."""
        return self.acquire_fenced(key, token, ttl, owner) is not None

    def acquire_fenced(self, key: str, token: str, ttl: float, owner: str) -> Optional[int]:
        """Grant or renew ``key`` for ``token``; the fence is the key's ``create_revision``."""
        seconds = lease_seconds(ttl)
        name = self._name(key)
        watcher, entry = self._queue_entry(key)
        # A queued waiter's attempt (the one its wake brings) takes a lease its watcher kept
        # ready, which runs at least `seconds` from now: one request instead of two.
        ready = watcher.take_lease(seconds) if watcher is not None else None
        value = b64(token.encode() + b"\x00" + owner.encode())
        # A waiter of this process queued for the key leaves the queue as it takes the key.
        also = [{"request_delete_range": {"key": b64(entry)}}] if entry is not None else []
        follower = self._follower(name, token)
        if follower is not None:
            also.append(line_range(self._prefix, key.encode()))
        try:
            answer, lease, ready = self._take_on(name, token, value, seconds, ready, also)
        except BaseException:
            if follower is not None:
                follower.forget(name, token)
            raise
        # The backend's own lease of `seconds` is kept as a spare by the release; a ready one is not.
        reusable = seconds if ready is None else None
        if answer.get("succeeded"):
            self._note_holding(name, token, lease, reusable)
            if watcher is not None and entry is not None:
                watcher.granted(key, entry)
            # The key was created by this transaction, so its create_revision is the write's.
            revision = int(answer["header"]["revision"])
            if follower is not None:
                follower.settle(name, revision, ranged(answer["responses"][-1]))
                follower.hold(name, token, revision, revision)
            return revision
        mine = answer["responses"][0]["response_txn"]
        if not mine.get("succeeded"):
            if follower is not None:
                follower.forget(name, token)
            if ready is not None and watcher is not None:
                watcher.keep_lease(ready)  # no key went on it: ready for the next attempt
            else:
                # The lease is attached to nothing: kept for this lock's next attempt.
                if not self._spares.keep(seconds, lease):
                    self._revoke(lease)
                self._expect_wait(seconds)
            return None
        self._note_holding(name, token, lease, reusable)
        previous = mine["responses"][0]["response_put"].get("prev_kv", {}).get("lease")
        if previous != lease:
            self._revoke(previous)
        kv = ranged(mine["responses"][1])[0]
        if follower is not None:
            # Not settled: a line first followed now is known only from its next events on.
            follower.hold(name, token, fence_of(kv), int(kv["create_revision"]))
        return fence_of(kv)

    def adopt(self, key: str, claim_token: str, token: str, ttl: float, owner: str) -> Optional[int]:
        """Hand ``key`` from the claim ``claim_token`` to ``token`` (see
        :meth:`~lease_lock.backends.base.Backend.adopt`).

        Each decision is one transaction guarded by what it decides on: "the key is absent"
        (then it is put on a new lease, its fence the write's revision), else "the key is as
        read" (its ``mod_revision``): held by the claim, it is put on the new lease with
        ``token``, ``owner`` and the claim's fence plus one in its value (as a hand-over does:
        see ``_line``); held by ``token``, it moves to the new lease and keeps its fence. The
        absent case's transaction reads the key when it finds it there, so a claim costs two
        round trips; a guard that lost to another write decides again on what that write left.
        """
        seconds = lease_seconds(ttl)
        name = self._name(key)
        lease = self._lease_for(seconds)
        while True:
            try:
                fence = self._adopt_once(name, claim_token, token, owner, lease)
            except _LeaseGone:
                lease = self._grant(seconds)  # it ran out before the write: nothing was written
                continue
            if fence is None:
                # Held by another token: nothing went on the lease.
                if not self._spares.keep(seconds, lease):
                    self._revoke(lease)
                return None
            if fence > 0:
                with self._holdings_mutex:
                    self._holdings.pop((name, claim_token), None)
                self._note_holding(name, token, lease, seconds)
                return fence
            # fence == 0: the key changed between the read and the guarded write; decide again.

    def _adopt_once(self, name: bytes, claim_token: str, token: str, owner: str, lease: str) -> Optional[int]:
        """One decision of :meth:`adopt` on ``lease``: the fence granted, ``None`` for another
        holder, ``0`` when the key changed under the guard."""
        value = token.encode() + b"\x00" + owner.encode()
        key = name[len(self._prefix):]
        answer = self._txn(
            [
                {"key": b64(name), "target": "CREATE", "result": "EQUAL", "create_revision": "0"},
                no_places(self._prefix, key),
            ],
            [{"request_put": {"key": b64(name), "value": b64(value), "lease": lease}}],
            [{"request_range": {"key": b64(name)}}, places_range(self._prefix, key, count_only=True)],
        )
        if answer.get("succeeded"):
            return int(answer["header"]["revision"])
        held = ranged(answer["responses"][0])
        if not held:
            # Places of a counting key hold it; else it was released since the compare.
            return None if int(answer["responses"][1]["response_range"].get("count") or 0) else 0
        kv = held[0]
        if holds(kv, claim_token):
            fence = fence_of(kv) + 1
            put = {"key": b64(name), "value": b64(value + b"\x00%d" % fence), "lease": lease, "prev_kv": True}
        elif holds(kv, token):
            fence = fence_of(kv)
            put = {"key": b64(name), "lease": lease, "ignore_value": True, "prev_kv": True}
        else:
            return None
        unchanged = {"key": b64(name), "target": "MOD", "result": "EQUAL", "mod_revision": kv["mod_revision"]}
        answer = self._txn([unchanged], [{"request_put": put}])
        if not answer.get("succeeded"):
            return 0
        previous = answer["responses"][0]["response_put"].get("prev_kv", {}).get("lease")
        if previous != lease:
            self._revoke(previous)
        return fence

    def _take_on(
        self, name: bytes, token: str, value: str, seconds: int, ready: Optional[ReadyLease], also: list[dict[str, Any]]
    ) -> tuple[dict[str, Any], str, Optional[ReadyLease]]:
        """The acquire transaction on a lease kept ready, else on one of this backend's: the
        answer, the lease, and the ready lease if it was used."""
        if ready is None:
            lease = self._lease_for(seconds)
            return self._take(name, token, value, lease, also), lease, None
        try:
            return self._take(name, token, value, ready.lease, also), ready.lease, ready
        except _LeaseGone:
            # Revoked as its watcher closed (or run out while this process was paused): nothing
            # was written, and the attempt grants a lease of its own. Any other failure leaves
            # the lease to run out: the key may be on it now.
            lease = self._grant(seconds)
            return self._take(name, token, value, lease, also), lease, None

    def _follower(self, name: bytes, token: str) -> Optional[EtcdLineWatcher]:
        """With ``direct_handoff``, the line watcher when it runs, told to follow ``name``'s line
        for ``token``'s attempt (its release then needs no read to find the next waiter); what
        it knew of an earlier grant to ``token`` is dropped either way."""
        if not self.direct_handoff or self._closed:
            return None
        watcher = self._lines()
        watcher.forget(name, token)
        if not watcher.active:
            return None
        watcher.expect(name, token)
        return watcher

    def _take(self, name: bytes, token: str, value: str, lease: str, also: list[dict[str, Any]]) -> dict[str, Any]:
        """The acquire transaction: put the key on ``lease`` if it is free, with no place of a
        counting key either (and run ``also``), or if ``token`` holds it already (then read it:
        its create_revision is the fence).
        Raises :class:`_LeaseGone` when etcd no longer has ``lease``."""
        return self._txn(
            [
                {"key": b64(name), "target": "CREATE", "result": "EQUAL", "create_revision": "0"},
                no_places(self._prefix, name[len(self._prefix):]),
            ],
            [{"request_put": {"key": b64(name), "value": value, "lease": lease}}, *also],
            [{"request_txn": {
                "compare": token_guard(name, token),
                # The value stays: a key handed over carries its fence there.
                "success": [
                    {"request_put": {"key": b64(name), "lease": lease, "ignore_value": True, "prev_kv": True}},
                    {"request_range": {"key": b64(name)}},
                ],
                "failure": [],
            }}],
        )

    def acquire_counted(self, key: str, token: str, ttl: float, owner: str, limit: int) -> Optional[int]:
        """Grant or renew ``token``'s place of the counting key ``key`` (see
        :meth:`~lease_lock.backends.base.Backend.acquire_counted` and :mod:`._places`): each
        write is one transaction guarded by the read it decides on; a guard that lost to
        another grant decides again on the read its failure brings back."""
        seconds = lease_seconds(ttl)
        name, raw = self._name(key), key.encode()
        place = place_name(self._prefix, raw, token)
        value = b64(place_value(token, owner, limit))
        watcher, entry = self._queue_entry(key)
        # A waiter of this process queued for the key leaves the queue as it takes a place.
        also = [{"request_delete_range": {"key": b64(entry)}}] if entry is not None else []
        absent = {"key": b64(name), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}
        reads = [{"request_range": {"key": b64(name), "keys_only": True}}, places_range(self._prefix, raw)]
        # The first attempt decides on "free" without a read: no lock key and no place at all.
        guard = [absent, no_places(self._prefix, raw)]
        renewed: Optional[int] = None
        # A queued waiter's attempt takes a lease its watcher kept ready (as acquire_fenced does).
        ready = watcher.take_lease(seconds) if watcher is not None else None
        lease = ready.lease if ready is not None else self._lease_for(seconds)
        while True:
            put = {"key": b64(place), "value": value, "lease": lease, "prev_kv": True}
            try:
                answer = self._txn(guard, [{"request_put": put}, *also], reads)
            except _LeaseGone:
                # Revoked, or run out before the write: nothing was written.
                ready, lease = None, self._grant(seconds)
                continue
            if answer.get("succeeded"):
                break
            held, places = ranged(answer["responses"][0]), ranged(answer["responses"][1])
            held_limit = 1 if held else next((limit_of(kv) for kv in places if limit_of(kv) != limit), limit)
            mine = next((kv for kv in places if unb64(kv.get("key")) == place), None)
            if held_limit != limit or (mine is None and len(places) >= limit):
                # Nothing went on the lease: kept for this lock's next attempt.
                if ready is not None and watcher is not None:
                    watcher.keep_lease(ready)
                elif not self._spares.keep(seconds, lease):
                    self._revoke(lease)
                if held_limit != limit:
                    raise limit_mismatch(key, limit, held_limit)
                if ready is None:
                    self._expect_wait(seconds)
                return None
            if mine is not None:
                renewed = int(mine["create_revision"])
                guard = [{"key": b64(place), "target": "CREATE", "result": "EQUAL", "create_revision": str(renewed)}]
            else:
                renewed = None
                guard = [absent, places_created_by(self._prefix, raw, int(answer["header"]["revision"]))]
        # The backend's own lease of `seconds` is kept as a spare by the release; a ready one is not.
        self._note_holding(place, token, lease, seconds if ready is None else None)
        if watcher is not None and entry is not None:
            watcher.granted(key, entry)
        if renewed is None:
            return int(answer["header"]["revision"])  # the place was created by this write
        previous = answer["responses"][0]["response_put"].get("prev_kv", {}).get("lease")
        if previous != lease:
            self._revoke(previous)
        return renewed

    def _expect_wait(self, seconds: int) -> None:
        """An attempt found the key held: when this backend hands keys over by wake-one, its
        waiter is about to queue, so the watcher keeps a lease ready for the woken attempt (a
        watcher started after it, for this very wait, is told at its start)."""
        self._lost_length = seconds
        for watcher in self._watchers:
            if isinstance(watcher, EtcdHandoffWatcher) and not watcher.closed:
                watcher.expect_lease(seconds)
                return

    def _queue_entry(self, key: str) -> tuple[Optional[EtcdHandoffWatcher], Optional[bytes]]:
        """The hand-off watcher of this backend queued for ``key``, and its entry, if any."""
        for watcher in self._watchers:
            if isinstance(watcher, EtcdHandoffWatcher):
                entry = watcher.entry_for(key)
                if entry is not None:
                    return watcher, entry
        return None, None

    def release(self, key: str, token: str) -> bool:
        """End ``key``'s lease, or ``token``'s place of a counting ``key``, if ``token`` holds
        it: one guarded delete, its lease kept as a spare (or, for a waiter's lease, one
        revoke); see the module's notes."""
        name = self._name(key)
        otherwise: list[dict[str, Any]] = []
        if (name, token) not in self._holdings:
            place = place_name(self._prefix, key.encode(), token)
            if (place, token) in self._holdings:
                return self._delete_held(place, token, [])
            # Not a holding this backend noted: a place of a counting key it did not grant (or
            # forgot) is deleted the same way, in the same request.
            otherwise = [{"request_txn": {
                "compare": token_guard(place, token),
                "success": [{"request_delete_range": {"key": b64(place), "prev_kv": True}}],
                "failure": [],
            }}]
        if self.direct_handoff and self._hand_on(name, token):
            return True
        return self._delete_held(name, token, otherwise)

    def _delete_held(self, name: bytes, token: str, otherwise: list[dict[str, Any]]) -> bool:
        """Delete ``name`` (a lock key or a place) if ``token`` holds it, else run ``otherwise``
        (a guarded delete of the token's place, in the same transaction); the lease it was on
        is kept as a spare when it is one of this backend's own, else revoked."""
        with self._holdings_mutex:
            lease, seconds = self._holdings.pop((name, token), (None, None))
        if lease is not None and seconds is None and self._revoke_holding(lease):
            return True
        delete = {"request_delete_range": {"key": b64(name), "prev_kv": True}}
        answer = self._txn(token_guard(name, token), [delete], otherwise)
        response = answer["responses"][0] if answer.get("responses") else {}
        if not answer.get("succeeded"):
            nested = response.get("response_txn", {})
            if nested.get("succeeded"):
                for kv in nested["responses"][0]["response_delete_range"].get("prev_kvs", []):
                    self._revoke(str(kv.get("lease") or "0"))
                return True
            # Not ours (any more): a lease of ours it was on holds nothing now, or is gone.
            self._revoke(lease if seconds is not None else None)
            return False
        for kv in response["response_delete_range"].get("prev_kvs", []):
            on = str(kv.get("lease") or "0")
            if on != lease or seconds is None or not self._spares.keep(seconds, on):
                self._revoke(on)
        return True

    def _hand_on(self, name: bytes, token: str) -> bool:
        """Hand ``name`` to the oldest place in its line, if ``token`` holds it and the line has
        one (see :mod:`._line`); ``False`` when nothing was handed over (the caller releases as
        usual). The line watcher usually knows the line and the holding (it follows the line of
        every key this backend holds); else a serializable read of the line and the key finds
        them first."""
        watcher = self._line_watcher
        known = watcher.next_place(name, token) if watcher is not None else UNKNOWN
        if watcher is not None:
            watcher.forget(name, token)
        if known is None:
            return False
        if not isinstance(known, Unknown):
            place, fence, create = known
            same = {"key": b64(name), "target": "CREATE", "result": "EQUAL", "create_revision": str(create)}
            if self._hand_to(name, token, place, fence, same):
                return True
            # What the watcher knew was behind etcd (the place went): read what is there.
        key = name[len(self._prefix):]
        oldest = line_range(self._prefix, key, sort_order="ASCEND", sort_target="CREATE", limit=1, serializable=True)
        read = self._txn([], [oldest, {"request_range": {"key": b64(name), "serializable": True}}])
        places, held = ranged(read["responses"][0]), ranged(read["responses"][1])
        if not places or not held or not holds(held[0], token):
            return False
        unchanged = {"key": b64(name), "target": "MOD", "result": "EQUAL", "mod_revision": held[0]["mod_revision"]}
        return self._hand_to(name, token, places[0], fence_of(held[0]), unchanged)

    def _hand_to(self, name: bytes, token: str, place: dict[str, Any], fence: int, same: dict[str, Any]) -> bool:
        """One transaction: if ``token`` holds ``name`` (and ``same`` holds: the holding whose
        fence is ``fence``) and ``place`` is still in line on its lease, put the key on that
        lease with the place's token and owner and the next fence, and delete the place. Then
        revoke the key's old lease, which holds nothing any more."""
        entry, lease = place["key"], place.get("lease", "0")
        value = unb64(place.get("value")) + b"\x00%d" % (fence + 1)
        try:
            answer = self._txn(
                [
                    *token_guard(name, token),
                    same,
                    {"key": entry, "target": "CREATE", "result": "EQUAL", "create_revision": place["create_revision"]},
                    {"key": entry, "target": "LEASE", "result": "EQUAL", "lease": lease},
                ],
                [
                    {"request_put": {"key": b64(name), "value": b64(value), "lease": lease, "prev_kv": True}},
                    {"request_delete_range": {"key": entry}},
                ],
            )
        except _LeaseGone:
            return False  # the place's claim lease ran out: the place went with it
        if not answer.get("succeeded"):
            return False
        with self._holdings_mutex:
            self._holdings.pop((name, token), None)
        self._revoke(answer["responses"][0]["response_put"].get("prev_kv", {}).get("lease"))
        return True

    def _holder_leases(self, items: Sequence[tuple[bytes, str]]) -> list[Optional[str]]:
        """The lease of each name (a lock key or a place) its token holds (``None`` where it
        does not), in one read.

        The read is serializable: the member asked answers from its own state, without the
        leader. During an election a linearizable read stalls for etcd's whole request timeout
        (7 s), which no short lease survives; a serializable one answers at once. What it may
        miss (a write the member has not applied yet) is caught by the keep-alive that
        follows, which goes to the leader: a released, expired or force-released key's lease
        was revoked with it, so its keep-alive answers that the lease is gone.
        """
        answer = self._txn([], [{"request_range": {"key": b64(name), "serializable": True}} for name, _token in items])
        leases: list[Optional[str]] = []
        for (_name, token), response in zip(items, answer.get("responses", [])):
            kvs = response["response_range"].get("kvs", [])
            held = bool(kvs) and unb64(kvs[0].get("value")).startswith(token.encode() + b"\x00")
            leases.append(str(kvs[0].get("lease", "0")) if held else None)
        return leases

    def extend(self, key: str, token: str, ttl: float) -> bool:
        """Set ``key``'s lease to ``ttl`` from now if ``token`` holds it."""
        return self.extend_many([ExtendRequest(key, token, ttl)])[0]

    def extend_many(self, requests: Sequence[ExtendRequest]) -> list[bool]:
        """Extend several leases: per 100 keys, one guarded read and one keep-alive request."""
        answers: list[bool] = []
        for start in range(0, len(requests), _BATCH):
            answers += self._extend_batch(requests[start:start + _BATCH])
        return answers

    def _extend_batch(self, batch: Sequence[ExtendRequest]) -> list[bool]:
        seconds = [lease_seconds(item.ttl) for item in batch]
        names = [self._held_name(item.key, item.token) for item in batch]
        leases = self._holder_leases([(name, item.token) for name, item in zip(names, batch)])
        # Not held under the name read: a place of a counting key this backend did not grant
        # (or forgot), else a lock lost; one more read tells (never for a lease that is kept).
        others = [
            index for index, (item, name, lease) in enumerate(zip(batch, names, leases))
            if lease is None and name == self._name(item.key)
        ]
        if others:
            places = [(place_name(self._prefix, batch[index].key.encode(), batch[index].token), batch[index].token)
                      for index in others]
            for index, (place, _token), lease in zip(others, places, self._holder_leases(places)):
                if lease is not None:
                    names[index], leases[index] = place, lease
        live = [lease for lease in leases if lease is not None and lease != "0"]
        left = self._keepalive(sorted(set(live))) if live else {}
        answers = []
        for item, name, length, lease in zip(batch, names, seconds, leases):
            if lease is None or left.get(lease, 0) <= 0:
                answers.append(False)
            elif left[lease] == self._granted.get(length, length):
                answers.append(True)
            else:
                answers.append(self._move(name, item.token, lease, length))
        return answers

    def _held_name(self, key: str, token: str) -> bytes:
        """The name ``token`` holds ``key`` under as this backend granted it: the key's own,
        or the token's place of a counting key."""
        name = self._name(key)
        if (name, token) not in self._holdings:
            place = place_name(self._prefix, key.encode(), token)
            if (place, token) in self._holdings:
                return place
        return name

    def _move(self, name: bytes, token: str, old: str, seconds: int) -> bool:
        """Put the key on a new lease of ``seconds`` (the value stays) and revoke the old one."""
        new = self._grant(seconds)
        answer = self._txn(
            [*token_guard(name, token), {"key": b64(name), "target": "LEASE", "result": "EQUAL", "lease": old}],
            [{"request_put": {"key": b64(name), "lease": new, "ignore_value": True}}],
        )
        if answer.get("succeeded"):
            with self._holdings_mutex:
                # Only a holding not being released meanwhile (which then finds `old` gone
                # and deletes the key by its token).
                if self._holdings.get((name, token), ("", None))[0] == old:
                    self._holdings[(name, token)] = (new, seconds)
            self._revoke(old)
            return True
        self._revoke(new)
        return False

    def is_held(self, key: str, token: str) -> bool:
        """``True`` if ``token`` holds ``key``, or a place of it (one guarded, empty transaction)."""
        place = token_guard(place_name(self._prefix, key.encode(), token), token)
        answer = self._txn(
            token_guard(self._name(key), token), [], [{"request_txn": {"compare": place, "success": [], "failure": []}}]
        )
        return bool(answer.get("succeeded") or answer["responses"][0]["response_txn"].get("succeeded"))

    def _state(self, kv: dict[str, Any]) -> LockState:
        key = self._key_of(unb64(kv.get("key")))
        remaining = self._remaining(kv.get("lease"))
        return LockState(
            key=key,
            held=True,
            expires_at=None if remaining is None else datetime.now(timezone.utc) + timedelta(seconds=remaining),
            fence=fence_of(kv),
            owner=owner_of(unb64(kv.get("value"))),
            expires_in=remaining,
        )

    def _counted_state(self, key: str, places: Sequence[dict[str, Any]]) -> LockState:
        """The state of a counting key from its places (each lease's time read from etcd)."""
        now = datetime.now(timezone.utc)
        holders = []
        for kv in places:
            left = self._remaining(kv.get("lease"))
            expires_at = None if left is None else now + timedelta(seconds=left)
            value = unb64(kv.get("value"))
            holders.append(Holder(owner_of(value), int(kv.get("create_revision") or 0), expires_at, left))
        return LockState.counting(key, limit_of(places[0]), holders) if places else LockState.free(key)

    def inspect(self, key: str) -> LockState:
        """The state of ``key``: its owner, fence and the lease time etcd has left; for a
        counting key, its limit and each place's (the key and its places read at once)."""
        name = self._name(key)
        answer = self._txn([], [{"request_range": {"key": b64(name)}}, places_range(self._prefix, key.encode())])
        held, places = ranged(answer["responses"][0]), ranged(answer["responses"][1])
        return self._state(held[0]) if held else self._counted_state(key, places)

    def force_release(self, key: str) -> bool:
        """End ``key``'s lease whoever holds it: delete the key if the holding read is still
        there (never a newer holder's), then revoke the lease it was on in that very write, so
        the holder's extends and release find it gone. A counting key's places (no lock key
        read) are all deleted in one write, and the leases it found them on revoked.

        Only the lease the delete saw is revoked: a holder's backend keeps the lease of a key it
        released as a spare for its next lock (see :mod:`._leases`), so a lease read before the
        delete may hold another key by the time it is revoked; the one the delete saw cannot,
        since its holder never released that key."""
        name = self._name(key)
        kvs = self._call("/v3/kv/range", {"key": b64(name)}).get("kvs", [])
        if not kvs:
            return self._drop_places(name, key)
        # The same holding: a key handed over keeps its create_revision but not its value.
        same_holding = [
            {"key": b64(name), "target": "CREATE", "result": "EQUAL", "create_revision": kvs[0]["create_revision"]},
            {"key": b64(name), "target": "VALUE", "result": "EQUAL", "value": kvs[0].get("value", "")},
        ]
        answer = self._txn(same_holding, [{"request_delete_range": {"key": b64(name), "prev_kv": True}}])
        if answer.get("succeeded"):
            for kv in answer["responses"][0]["response_delete_range"].get("prev_kvs", []):
                lease = str(kv.get("lease") or "0")
                if lease != "0":
                    self._revoke_holding(lease)
        return True

    def _drop_places(self, name: bytes, key: str) -> bool:
        """Delete every place of the counting key ``key`` in one write (while no lock key is
        there), then revoke the leases that write found them on; whether it dropped any."""
        answer = self._txn(
            [{"key": b64(name), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}],
            [{"request_delete_range": {**places_range(self._prefix, key.encode())["request_range"], "prev_kv": True}}],
        )
        if not answer.get("succeeded"):
            return False  # an exclusive holder that came after the read: it stays
        dropped = answer["responses"][0]["response_delete_range"].get("prev_kvs", [])
        for kv in dropped:
            lease = str(kv.get("lease") or "0")
            if lease != "0":
                self._revoke_holding(lease)
        return bool(dropped)

    def scan(self, prefix: str) -> Iterator[LockState]:
        """Held keys starting with ``prefix``, in key order (one range over the lock keys and
        the places of counting keys, then each lease's time)."""
        name = self._name(prefix)
        # An empty name (no namespace, no prefix) is etcd's "from the first key": NUL.
        body = {"key": b64(name or b"\x00"), "range_end": b64(prefix_end(name))}
        kvs = self._call("/v3/kv/range", body).get("kvs", [])
        # The hand-off queues and lines, the places (and, in the empty namespace, the rate
        # counters) are no lock keys; a counting key is listed once, from its places.
        states: list[LockState] = []
        counted: dict[bytes, list[dict[str, Any]]] = {}
        for kv in kvs:
            name = unb64(kv.get("key"))
            if lock_key(self._prefix, name) is not None:
                states.append(self._state(kv))
            else:
                key = counted_key(self._prefix, name)
                if key is not None:
                    counted.setdefault(key, []).append(kv)
        for key, places in counted.items():
            states.append(self._counted_state(key.decode("utf-8", "replace"), places))
        return iter(sorted(states, key=lambda state: state.key.encode()) if counted else states)

    def count_in_window(self, name: str, window: float, amount: int = 1) -> tuple[int, float]:
        """Add ``amount`` to counter ``name`` in the current window (see
        :class:`~lease_lock.backends.service.ServiceStore`). etcd has no clock to read, so the
        windows are aligned on this process's wall clock; the count is exact across processes.
        The counter is a key outside the namespace's range, dropped by etcd after its window."""
        return count_in_window(self._client, self._prefix, name, window, amount, self._revoke)

    def watch_releases(self, callback: Callable[[str], None]) -> ReleaseWatcher:
        """One watch stream over the namespace; ``callback(key)`` for every deleted key
        (releases, force releases and expiries alike)."""
        return self._keep(EtcdReleaseWatcher(self._client, self._prefix, callback))

    @property
    def handoff_ready(self) -> bool:
        """Always: the wake-one queues need nothing beyond the namespace's own permissions."""
        return True

    def watch_handoffs(self, callback: Callable[[str], bool]) -> EtcdHandoffWatcher:
        """A wake-one watcher: while this process waits for a key it holds an entry in the key's
        queue in etcd, and a release wakes only the process whose entry is first (see
        :class:`~lease_lock.backends.handoff.HandoffWatcher`)."""
        watcher = self._keep(EtcdHandoffWatcher(self._client, self._prefix, callback))
        if self._lost_length is not None:
            watcher.expect_lease(self._lost_length)
        return watcher

    def join_line(
        self, key: str, token: str, ttl: float, owner: str, fenced: bool, clock: Callable[[], float],
        limit: int = 1,
    ) -> Optional[WaitingLine]:
        """A waiting line for ``key`` (see :meth:`Backend.join_line`).

        With ``direct_handoff``, a direct line: a release hands the key straight to the oldest
        place in line, on that place's claim lease, and the waiter hears it on the backend's
        line watcher (one watch stream for all its waiters). At most
        :data:`~lease_lock.backends.line.LINE_WAITERS` threads of one backend wait this way at
        once. Other waiters (and every one without ``direct_handoff``, or once the backend is
        closed) are woken by the backend's shared wake-one watcher (see
        :class:`~lease_lock.backends.line.AnnouncedLine`), and so are the waiters for a place
        of a counting key (``limit`` > 1), whose lines ask with :meth:`acquire_counted`.
        """
        if limit > 1 or not self.direct_handoff or self._closed or not self._line_slots.take():
            return AnnouncedLine(self._announcements, self, key, token, ttl, owner, fenced, clock, limit)
        name = self._name(key)
        claim = claim_for(ttl)

        def note_holding(lease: str) -> None:
            self._note_holding(name, token, lease)

        def keep_spare(seconds: int, lease: str) -> None:
            if not self._spares.keep(seconds, lease):
                self._revoke(lease)

        calls = LineCalls(
            call=self._call, keepalive=self._keepalive, grant=self._grant, note_holding=note_holding,
            release=lambda: self.release(key, token), keep_spare=keep_spare, revoke=self._revoke,
            timeout=self._client.timeout,
        )
        line = EtcdWaitingLine(
            name=name, prefix=self._prefix, token=token, owner=owner, fenced=fenced, seconds=lease_seconds(ttl),
            claim_seconds=lease_seconds(claim), calls=calls, watcher=self._lines(), ttl=ttl, claim=claim,
            clock=clock, slots=self._line_slots,
        )
        line.watch_lease(lambda: self.inspect(key).expires_in)
        return line

    def _lines(self) -> EtcdLineWatcher:
        """The watcher of the waiting lines, started on first need."""
        with self._line_mutex:
            if self._line_watcher is None or self._line_watcher.closed:
                self._line_watcher = self._keep(EtcdLineWatcher(self._client, self._prefix))
            return self._line_watcher

    def _keep(self, watcher: _Watcher) -> _Watcher:
        """Remember ``watcher`` for :meth:`close`, forgetting the ones closed already."""
        self._watchers = [item for item in self._watchers if not item.closed]
        self._watchers.append(watcher)
        return watcher

    def close(self) -> None:
        """Stop the watchers, revoke the spare leases, and close the session if the backend opened it."""
        self._closed = True
        self._announcements.close()
        for watcher in self._watchers:
            watcher.close()
        self._watchers = []
        for lease in self._spares.drain():
            self._revoke(lease)
        self._client.close()
        if self._own_session:
            self._client.session.close()
