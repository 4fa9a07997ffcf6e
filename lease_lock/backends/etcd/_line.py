"""Direct hand-off on etcd (``direct_handoff``): a waiting thread's place in its key's line.

A waiting thread keeps a *place*: the name ``namespace + NUL + "line" + NUL + key + NUL + id``,
whose value is its token, a NUL byte and its owner label, on a *claim lease* of its own (its
claim window, rounded up to etcd's whole seconds), which it keeps alive at each refresh. A
release that finds places in the key's line (see ``EtcdBackend.release``) takes the oldest one
and, in one transaction guarded by its own token, the key's revision and the place's, puts the
key on that place's claim lease with the waiter's token and owner and a fence one above the
key's, and deletes the place. The release knows the oldest place without asking: the backend's
line watcher (one watch stream per backend) follows the line of every key the backend waits for
or holds, from a snapshot that its grant's transaction read plus the events after it (when it
does not know the line, the release reads it first). The waiter hears the put on its own
backend's line watcher and holds the key without a request of its own; its heartbeat turns
the claim into a full lease a third of the way into the window. A waiter that died or stopped
stops renewing its claim lease, and etcd deletes its place, and any key handed to it, when the
lease runs out.

Why the waiter may judge a handed key from the send of its latest refresh: the key is on the
claim lease, and etcd ends a lease no sooner than its length after the latest keep-alive (or
grant) reached the leader, which was after that request left the waiter; a leader change only
restarts a lease at its full length. That holds whenever the release came, before or after the
refresh.

Why the fence still grows: a key handed over keeps its ``create_revision``, so its fence rides
in its value (``token NUL owner NUL fence``), one above the fence of the holding it replaces,
which the transaction checks by the key's ``mod_revision``. That fence is at most the revision
of the handing write, and any later grant that creates the key gets a larger revision still; a
fence read from the value wins over ``create_revision`` (see :func:`fence_of`).
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Optional, Sequence, Union

from ...errors import BackendUnavailableError
from ..base import CALL_MARGIN, LineGrant
from ..line import FREED, Freed, Handed, Joined, LineSlots, RefreshedLine
from ._client import CODE_NOT_FOUND, EtcdClient, EtcdError, b64, prefix_end, unb64
from ._places import no_places
from ._watch import RESERVED, WatchStream

__all__ = ["FOLLOWED_LINES", "LINE_MARK", "UNKNOWN", "EtcdLineWatcher", "EtcdWaitingLine", "LineCalls",
           "Unknown", "fence_of", "holds", "line_prefix", "line_range", "owner_of", "ranged", "token_guard"]

#: What follows the namespace in the name of every place in line.
LINE_MARK = RESERVED + b"line" + RESERVED


def line_prefix(prefix: bytes, key: bytes) -> bytes:
    """The first bytes of every place in the line of lock key ``key`` under ``prefix``."""
    return prefix + LINE_MARK + key + RESERVED


def line_range(prefix: bytes, key: bytes, **options: Any) -> dict[str, Any]:
    """The request that reads every place in the line of lock key ``key`` under ``prefix``
    (``options``: more fields of etcd's range request, such as a sort order and a limit)."""
    start = line_prefix(prefix, key)
    return {"request_range": {"key": b64(start), "range_end": b64(prefix_end(start)), **options}}


def token_guard(name: bytes, token: str) -> list[dict[str, Any]]:
    """The compares of "``token`` holds ``name``": the value sorts strictly between ``token``
    and ``token + "\\x01"``, which only a value starting with ``token`` and a NUL does (tokens
    contain no NUL)."""
    held = token.encode()
    return [
        {"key": b64(name), "target": "VALUE", "result": "GREATER", "value": b64(held)},
        {"key": b64(name), "target": "VALUE", "result": "LESS", "value": b64(held + b"\x01")},
    ]


def holds(kv: dict[str, Any], token: str) -> bool:
    """Whether the key-value ``kv`` (as etcd answers it) is held by ``token``."""
    return unb64(kv.get("value")).startswith(token.encode() + b"\x00")


def owner_of(value: bytes) -> str:
    """The owner label in a lock key's value."""
    parts = value.split(b"\x00")
    return parts[1].decode("utf-8", "replace") if len(parts) > 1 else ""


def fence_of(kv: dict[str, Any]) -> int:
    """A lock key's fence: the one its value carries (a key handed over), else its
    ``create_revision``."""
    parts = unb64(kv.get("value")).split(b"\x00")
    if len(parts) > 2 and parts[2].isdigit():
        return int(parts[2])
    return int(kv.get("create_revision") or 0)


class Unknown(NamedTuple):
    """What :meth:`EtcdLineWatcher.next_place` answers when it cannot tell (ask etcd)."""


#: The one :class:`Unknown` answer.
UNKNOWN = Unknown()
#: Lines followed at once, at most; past it the oldest is forgotten (its release reads etcd).
FOLLOWED_LINES = 16_384


@dataclass
class _Followed:
    """The places of one key's line as this process knows them, and its holdings of the key."""

    #: Who wants the line followed: waiting lines (their place's name) and holders (their token).
    interested: set[Union[bytes, str]] = field(default_factory=set)
    #: The revision of the snapshot the places start from (0: none yet; events wait in backlog).
    base: int = 0
    #: Place name -> its key-value, as etcd last reported it.
    places: dict[bytes, dict[str, Any]] = field(default_factory=dict)
    backlog: list[tuple[int, bool, bytes, dict[str, Any]]] = field(default_factory=list)
    #: Token -> (fence, create_revision) of this process's holdings of the key.
    holders: dict[str, tuple[int, int]] = field(default_factory=dict)

    def settle(self, revision: int, places: list[dict[str, Any]]) -> None:
        if self.base:
            return  # followed already: the events kept it current
        self.base = revision
        self.places = {unb64(kv.get("key")): kv for kv in places}
        backlog, self.backlog = self.backlog, []
        for event in backlog:
            self.apply(*event)

    def apply(self, revision: int, put: bool, name: bytes, kv: dict[str, Any]) -> None:
        if not self.base:
            self.backlog.append((revision, put, name, kv))
        elif revision > self.base:
            if put:
                self.places[name] = kv
            else:
                self.places.pop(name, None)


class EtcdLineWatcher(WatchStream):
    """One watch stream over the namespace that tells each waiting line of the puts and deletes
    of its key, and follows the lines of the keys this process waits for or holds, so that a
    release knows whom to hand the key to without asking etcd (see :meth:`next_place`).

    A stream that cannot resume (its revision was compacted away) tells every line that the
    key may have gone free meanwhile, and forgets what it followed."""

    _thread_name = "lease-lock-etcd-line"

    def __init__(self, client: EtcdClient, prefix: bytes) -> None:
        super().__init__(client, prefix)
        self._lines_mutex = threading.Lock()
        self._lines: dict[bytes, set[EtcdWaitingLine]] = {}
        self._followed: dict[bytes, _Followed] = {}
        self._line_mark = prefix + LINE_MARK
        self._start()

    # -- following lines (any thread) --------------------------------------------------------

    def expect(self, name: bytes, who: Union[bytes, str]) -> None:
        """``who`` (a place's name, or a token about to take the key) wants ``name``'s line
        followed, from a snapshot that a transaction sent after this call will read."""
        with self._lines_mutex:
            followed = self._followed.pop(name, None) or _Followed()
            self._followed[name] = followed  # the latest interest goes last
            followed.interested.add(who)
            while len(self._followed) > FOLLOWED_LINES:
                del self._followed[next(iter(self._followed))]

    def settle(self, name: bytes, revision: int, places: list[dict[str, Any]]) -> None:
        """The places of ``name``'s line as a transaction read them at ``revision``."""
        with self._lines_mutex:
            followed = self._followed.get(name)
            if followed is not None:
                followed.settle(revision, places)

    def hold(self, name: bytes, token: str, fence: int, create: int) -> None:
        """``token`` took ``name`` with ``fence``, the key's ``create_revision`` being
        ``create``: its release may hand the key on from what is followed."""
        with self._lines_mutex:
            followed = self._followed.get(name)
            if followed is not None:
                followed.interested.add(token)
                followed.holders[token] = (fence, create)

    def forget(self, name: bytes, who: Union[bytes, str]) -> None:
        """``who`` no longer wants ``name``'s line followed (a token: nor holds the key)."""
        with self._lines_mutex:
            followed = self._followed.get(name)
            if followed is None:
                return
            followed.interested.discard(who)
            if isinstance(who, str):
                followed.holders.pop(who, None)
            if not followed.interested:
                del self._followed[name]

    def next_place(self, name: bytes, token: str) -> Union[tuple[dict[str, Any], int, int], Unknown, None]:
        """The oldest place in ``name``'s line with the fence and ``create_revision`` of
        ``token``'s holding, ``None`` when the line is empty, or :data:`UNKNOWN` when this
        watcher does not follow the line or does not know that holding. Events on their way may
        make it lag behind etcd: a transaction that acts on it checks what it assumed."""
        with self._lines_mutex:
            followed = self._followed.get(name)
            if followed is None or not followed.base or token not in followed.holders or not self.active:
                return UNKNOWN
            if not followed.places:
                return None
            oldest = min(followed.places.values(), key=lambda kv: int(kv.get("create_revision") or 0))
            return (oldest, *followed.holders[token])

    def add(self, name: bytes, line: EtcdWaitingLine) -> None:
        """Tell ``line`` of the events of lock key ``name`` (its full name in etcd) from now on."""
        with self._lines_mutex:
            self._lines.setdefault(name, set()).add(line)

    def remove(self, name: bytes, line: EtcdWaitingLine) -> None:
        """Stop telling ``line`` of ``name``'s events."""
        with self._lines_mutex:
            lines = self._lines.get(name)
            if lines is not None:
                lines.discard(line)
                if not lines:
                    del self._lines[name]

    def _follow_place(self, name: bytes, revision: int, put: bool, kv: dict[str, Any]) -> None:
        key = name[len(self._line_mark):].partition(RESERVED)[0]
        with self._lines_mutex:
            followed = self._followed.get(self._prefix + key)
            if followed is not None:
                followed.apply(revision, put, name, kv)

    def _listeners(self, name: bytes) -> list[EtcdWaitingLine]:
        with self._lines_mutex:
            return list(self._lines.get(name, ()))

    def _prepare(self) -> None:
        if self._next_revision:
            return
        with self._lines_mutex:
            lines = [line for lines in self._lines.values() for line in lines]
            self._followed = {}
        for line in lines:
            line.note_freed(math.inf)

    def _handle(self, events: list[dict[str, Any]]) -> None:
        for event in events:
            kv = event.get("kv", {})
            name = unb64(kv.get("key"))
            revision = int(kv.get("mod_revision") or 0)
            if name.startswith(self._line_mark):
                self._follow_place(name, revision, event.get("type") != "DELETE", kv)
                continue
            lines = self._listeners(name)
            for line in lines:
                if event.get("type") == "DELETE":
                    line.note_freed(revision)
                else:
                    line.note_put(revision, kv)


def ranged(response: dict[str, Any]) -> list[dict[str, Any]]:
    """The key-values of one range's answer in a transaction's responses."""
    kvs: list[dict[str, Any]] = response["response_range"].get("kvs", [])
    return kvs


class LineCalls(NamedTuple):
    """What the backend lends a waiting line."""

    #: POST a request to the cluster, within so many seconds if not ``None`` (``EtcdClient.call``).
    call: Callable[[str, dict[str, Any], Optional[float]], dict[str, Any]]
    #: Renew leases, within so many seconds if not ``None``: each one's new TTL
    #: (``EtcdClient.keepalive``).
    keepalive: Callable[[Sequence[str], Optional[float]], dict[str, int]]
    #: Grant a lease of so many seconds, within so many seconds if not ``None``; its ID.
    grant: Callable[[int, Optional[float]], str]
    #: The lease the waiter's key is on now, for a release by revoke.
    note_holding: Callable[[str], None]
    #: Release the key the waiter's token holds (to the next place in line).
    release: Callable[[], bool]
    #: Take back a lease of so many seconds that never held a key.
    keep_spare: Callable[[int, str], None]
    #: Revoke a lease, best effort.
    revoke: Callable[[str], None]
    #: Seconds to wait for the line watcher to be confirmed.
    timeout: float


class EtcdWaitingLine(RefreshedLine):
    """A waiting thread's place in one key's line (see the module docstring).

    ``name`` is the lock key's full name in etcd, ``prefix`` the namespace's; ``seconds`` and
    ``claim_seconds`` the etcd lengths of the lease asked for and of the claim window; the rest
    is :class:`~lease_lock.backends.line.RefreshedLine`'s.
    """

    def __init__(
        self,
        *,
        name: bytes,
        prefix: bytes,
        token: str,
        owner: str,
        fenced: bool,
        seconds: int,
        claim_seconds: int,
        calls: LineCalls,
        watcher: EtcdLineWatcher,
        ttl: float,
        claim: float,
        clock: Callable[[], float],
        slots: LineSlots,
    ) -> None:
        super().__init__(ttl=ttl, claim=claim, clock=clock, translate=lambda _error: None, slots=slots)
        self._name = name
        self._place = line_prefix(prefix, name[len(prefix):]) + uuid.uuid4().hex.encode()
        self._line_range = line_range(prefix, name[len(prefix):])
        # A counting key's places hold the key as well: the line takes no key that has any.
        self._no_places = no_places(prefix, name[len(prefix):])
        self._token = token
        self._value = b64(token.encode() + b"\x00" + owner.encode())
        self._fenced = fenced
        self._seconds = seconds
        self._claim_seconds = claim_seconds
        self._calls = calls
        self._watcher = watcher
        self._watching = False
        #: The lease a release puts the key on, and the send of the request that last renewed it.
        self._claim_lease: Optional[str] = None
        self._claim_sent = 0.0
        #: A lease of the full length, for a join that finds the key free.
        self._full_lease: Optional[str] = None
        #: Whether a key handed over is on the claim lease (then it is not revoked on leaving).
        self._claim_holds_key = False
        #: When (``time.monotonic()``) the current wait ends; ``None`` outside a wait.
        self._until: Optional[float] = None
        #: Whether the store left the latest join unanswered (an attempt whose answer was lost
        #: may have put the key on the full lease; see _quit and _done).
        self._unanswered = False
        #: What the watcher told: the revision of the latest join, of a put handing the key to
        #: this waiter (and its fence), of the key going free.
        self._events = threading.Condition()
        self._joined_at = 0
        #: (revision, fence, create_revision) of the put that handed the key over.
        self._handed: Optional[tuple[int, int, int]] = None
        self._freed_at = -math.inf

    # -- the watcher's thread --------------------------------------------------------------------

    def note_put(self, revision: int, kv: dict[str, Any]) -> None:
        """The key was put at ``revision``: a grant to this waiter when its token holds it."""
        if holds(kv, self._token):
            with self._events:
                self._handed = (revision, fence_of(kv), int(kv.get("create_revision") or 0))
                self._events.notify()

    def note_freed(self, revision: float) -> None:
        """The key went free at ``revision`` (``inf``: at an unknown revision)."""
        with self._events:
            self._freed_at = max(self._freed_at, revision)
            self._events.notify()

    # -- RefreshedLine ---------------------------------------------------------------------------

    def wait(self, seconds: float) -> Optional[LineGrant]:
        """See :meth:`~lease_lock.backends.handoff.WaitingLine.wait`. A refresh that falls due
        in the wait ends with it (or :data:`~lease_lock.backends.base.CALL_MARGIN` later: a
        refresh cut short would read as an outage), so a silent member holds the
        waiter no longer than the seconds given, instead of a request timeout per member."""
        self._until = time.monotonic() + seconds
        try:
            return super().wait(seconds)
        finally:
            self._until = None

    def _within(self) -> Optional[float]:
        """The seconds a request may take now: ``None`` (the client's timeouts) outside a wait."""
        if self._until is None:
            return None
        return max(self._until - time.monotonic(), CALL_MARGIN)

    def _join(self, sent: float) -> Joined:
        self._unanswered = True
        joined = self._take_or_queue(sent)
        self._unanswered = False
        return joined

    def _take_or_queue(self, sent: float) -> Joined:
        if not self._watching:
            # Before the first request: every event after the join's revision reaches the line.
            self._watcher.add(self._name, self)
            self._watcher.expect(self._name, self._place)
            self._watching = True
            if not self._watcher.wait_active(min(self._calls.timeout, self._within() or math.inf)):
                raise BackendUnavailableError("the etcd line watch was not confirmed in time", backend="etcd")
        self._claim_holds_key = False
        self._renew(sent)
        try:
            answer = self._attempt()
        except EtcdError as error:
            if error.code != CODE_NOT_FOUND:
                raise
            # A lease ran out between its renewal and the write (this process was paused):
            # nothing was written; both are granted again.
            self._claim_lease = self._full_lease = None
            self._renew(sent)
            answer = self._attempt()
        revision = int(answer["header"]["revision"])
        if answer.get("succeeded"):
            # The key was free, and this transaction created it: the fence is its revision.
            self._watcher.settle(self._name, revision, ranged(answer["responses"][2]))
            return self._took(revision, revision)
        mine = answer["responses"][0]["response_txn"]
        if mine.get("succeeded"):
            # A release handed the key over before this refresh: now on the full lease.
            self._watcher.settle(self._name, revision, ranged(mine["responses"][2]))
            kv = ranged(mine["responses"][1])[0]
            return self._took(fence_of(kv), int(kv["create_revision"]))
        self._watcher.settle(self._name, revision, ranged(mine["responses"][1]))
        with self._events:
            self._joined_at = revision
        return Joined(None)

    def _renew(self, sent: float) -> None:
        """Renew the claim lease and the full one in one keep-alive request; grant what is gone."""
        leases = [lease for lease in (self._claim_lease, self._full_lease) if lease is not None]
        left = self._calls.keepalive(leases, self._within()) if leases else {}
        if self._claim_lease is None or left.get(self._claim_lease, 0) <= 0:
            self._claim_lease = self._calls.grant(self._claim_seconds, self._within())
        if self._full_lease is None or left.get(self._full_lease, 0) < self._seconds:
            self._full_lease = self._calls.grant(self._seconds, self._within())
        self._claim_sent = sent

    def _attempt(self) -> dict[str, Any]:
        """Take the key on the full lease if it is free (leaving the line), or move it there if
        a release handed it over already (then read it), or else put the place in line."""
        assert self._claim_lease is not None and self._full_lease is not None
        name = b64(self._name)
        place = b64(self._place)
        return self._calls.call("/v3/kv/txn", {
            "compare": [{"key": name, "target": "CREATE", "result": "EQUAL", "create_revision": "0"}, self._no_places],
            "success": [
                {"request_put": {"key": name, "value": self._value, "lease": self._full_lease}},
                {"request_delete_range": {"key": place}},
                self._line_range,
            ],
            "failure": [{"request_txn": {
                "compare": token_guard(self._name, self._token),
                "success": [
                    {"request_put": {"key": name, "lease": self._full_lease, "ignore_value": True}},
                    {"request_range": {"key": name}},
                    self._line_range,
                ],
                "failure": [
                    {"request_put": {"key": place, "value": self._value, "lease": self._claim_lease}},
                    self._line_range,
                ],
            }}],
        }, self._within())

    def _took(self, fence: int, create: int) -> Joined:
        assert self._full_lease is not None
        self._calls.note_holding(self._full_lease)
        self._watcher.hold(self._name, self._token, fence, create)
        self._full_lease = None
        return Joined(fence if self._fenced else 0)

    def _block(self, seconds: float) -> Union[Handed, Freed, None]:
        deadline = time.monotonic() + seconds
        with self._events:
            while True:
                handed = self._handed
                if handed is not None and handed[0] > self._joined_at:
                    self._handed = None
                    self._claim_holds_key = True
                    assert self._claim_lease is not None
                    self._calls.note_holding(self._claim_lease)
                    self._watcher.hold(self._name, self._token, handed[1], handed[2])
                    return Handed(handed[1] if self._fenced else 0, self._claim_sent)
                if self._freed_at > self._joined_at:
                    self._freed_at = -math.inf
                    return FREED
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._events.wait(left)

    def _quit(self) -> None:
        if self._unanswered:
            # Another request would hold the waiter up to a request timeout per member past its
            # wait. Its leases go instead, in the background (see _done): the claim lease with
            # the place and any key handed to it, which this waiter gives up.
            self._claim_holds_key = False
            return
        answer = self._calls.call("/v3/kv/txn", {
            "compare": [],
            "success": [
                {"request_delete_range": {"key": b64(self._place)}},
                {"request_range": {"key": b64(self._name)}},
            ],
            "failure": [],
        }, None)
        kvs = answer["responses"][1]["response_range"].get("kvs", [])
        if kvs and holds(kvs[0], self._token):
            # Handed over while the waiter was leaving: on to the next place in line.
            self._calls.release()
            self._claim_holds_key = False

    def _done(self) -> None:
        if self._watching:
            self._watcher.remove(self._name, self)
            self._watcher.forget(self._name, self._place)
            self._watching = False
        claim, self._claim_lease = self._claim_lease, None
        full, self._full_lease = self._full_lease, None
        # A claim lease that holds a key this waiter was granted is its lock's lease now.
        leases = [claim] if claim is not None and not self._claim_holds_key else []
        if full is not None and self._unanswered:
            # The latest join went unanswered: an attempt may have put the key on the full
            # lease, this waiter's though it never heard. As a spare, the next lock's
            # keep-alives would keep that key held as long as that lock; revoked, it gives
            # such a key back, and if the revoke fails too, nothing renews it and it runs out
            # within its length.
            leases.append(full)
        elif full is not None:
            self._calls.keep_spare(self._seconds, full)
        if leases and self._unanswered:
            # Off the waiter's thread: the store did not answer its latest request, and each
            # revoke could hold the waiter a request timeout per member past its wait.
            threading.Thread(target=self._revoke_all, args=(leases,), name="lease-lock-etcd-leave", daemon=True).start()
        elif leases:
            self._revoke_all(leases)

    def _revoke_all(self, leases: list[str]) -> None:
        for lease in leases:
            with contextlib.suppress(Exception):  # best effort: a lease left behind runs out
                self._calls.revoke(lease)
