"""The small contract every backend implements.

A backend stores leases and nothing else: it does not retry, wait, time, heartbeat or log.
:class:`~lease_lock.Locker` and :class:`~lease_lock.Lock` own all of that and call the atomic
primitives below. Each primitive is one atomic operation on the server, and expiry is judged on
the server's clock (SQLite, which has no server, documents the one host clock it uses).

A primitive answers ``False`` (or ``None``) when another holder, or nobody, has the key, and
raises only what its driver raises. It never raises :class:`~lease_lock.errors.LockHeldError`
or :class:`~lease_lock.errors.LockLostError`: turning answers into outcomes is the core's job.

Optional capabilities are declared in :class:`Capabilities`, so the core and callers can fail
fast when they ask for something a backend lacks. Duties of the HTTP lock service (shared
counters, request ids) are not part of this contract: they are the optional interfaces of
:mod:`lease_lock.backends.service`.
"""

from __future__ import annotations

import abc
import contextlib
import math
import os
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, ClassVar, ContextManager, Iterator, Mapping, NamedTuple, Optional, Sequence

from ..errors import ValidationError
from ..validation import describe_token, is_secret_option, unknown_option_error

__all__ = [
    "CALL_MARGIN",
    "Backend",
    "CallBudget",
    "Capabilities",
    "ExtendRequest",
    "Holder",
    "LineGrant",
    "LockState",
    "ReleaseWatcher",
    "WaitingLine",
    "limit_mismatch",
    "parse_bool",
    "parse_url_options",
]


@dataclass(frozen=True)
class Holder:
    """One live lease of a key: its holder's ``owner`` label, its ``fence`` (``None`` for an
    unfenced grant), when it ends on the backend's clock (``expires_at``, UTC-aware) and the
    seconds it has left as the backend measured them (``expires_in``)."""

    owner: Optional[str] = None
    fence: Optional[int] = None
    expires_at: Optional[datetime] = None
    expires_in: Optional[float] = field(default=None, compare=False)


@dataclass(frozen=True)
class LockState:
    """What a backend knows about a key, without needing its token.

    ``expires_at`` is a UTC-aware datetime on the backend's clock and ``None`` when the key is
    not held. ``fence`` is the current holder's fencing token, ``None`` when not held or when the
    grant was not fenced. ``owner`` is the holder's label. ``expires_in`` is the holder's
    remaining lease in seconds as the backend measured it (not derived from the local clock).

    ``limit`` is how many leases the key admits at once: 1 for an exclusive lock, N for a
    counting one (``limit=N``), as its live holders were granted; 1 when nobody holds it.
    ``holders`` has one :class:`Holder` per live lease, by fence. For a counting key the
    top-level ``fence``, ``owner``, ``expires_at`` and ``expires_in`` are those of its latest
    grant (the largest fence). A state built with only the top-level fields of a held key gets
    its one holder from them.
    """

    key: str
    held: bool
    expires_at: Optional[datetime] = None
    fence: Optional[int] = None
    owner: Optional[str] = None
    expires_in: Optional[float] = field(default=None, compare=False)
    limit: int = 1
    holders: tuple[Holder, ...] = ()

    def __post_init__(self) -> None:
        if self.held and not self.holders:
            # An exclusive key's one holder is the key's own fields (every backend builds it so).
            holder = Holder(self.owner, self.fence, self.expires_at, self.expires_in)
            object.__setattr__(self, "holders", (holder,))

    @classmethod
    def free(cls, key: str) -> LockState:
        """The state of a key nobody holds."""
        return cls(key=key, held=False)

    @classmethod
    def counting(cls, key: str, limit: int, holders: Sequence[Holder]) -> LockState:
        """The state of a counting key (``limit`` > 1) from its live ``holders`` (any order):
        free when there are none, else held, with the latest grant's fields on top."""
        if not holders:
            return cls.free(key)
        ordered = tuple(sorted(holders, key=lambda holder: holder.fence or 0))
        latest = ordered[-1]
        return cls(
            key=key, held=True, expires_at=latest.expires_at, fence=latest.fence, owner=latest.owner,
            expires_in=latest.expires_in, limit=limit, holders=ordered,
        )


def limit_mismatch(key: str, asked: int, held: int) -> ValidationError:
    """The error of an acquire whose ``limit`` (``asked``) differs from the limit the live
    holders of ``key`` were granted with (``held``; 1 for an exclusive holder). A backend raises
    it from :meth:`Backend.acquire_counted` having written nothing."""
    return ValidationError(
        f"limit={asked} differs from limit={held} of the live holders of {key!r}: every holder of a "
        "key must use the same limit"
    )


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do beyond the required primitives.

    Every field defaults to the weakest claim (nothing offered, no clock named), so a backend
    that forgets to declare something is treated as lacking it: the core refuses what needs it
    instead of trusting a guarantee nobody made. Built-in backends declare every field.

    - ``server_clock``: expiry is judged on a server's clock (not this process's).
    - ``fencing``: ``acquire_fenced`` returns fences: integers that grow with every grant of a key.
    - ``release_notify``: ``watch_releases`` delivers release notifications.
    - ``replica_wait``: writes can wait for replicas (Redis ``wait_for_replicas``).
    - ``scan``: ``scan(prefix)`` lists held keys.
    - ``batch_extend``: ``extend_many`` extends several leases in one round trip.
    - ``counting``: ``acquire_counted`` grants counting leases (``limit`` > 1).
    - ``min_ttl``: the shortest lease the backend grants; the contract suite scales to it.
    - ``clock``: a short description of the clock that judges expiry, for the docs.
    - ``wake``: a short description of how a waiter learns the key is free, for the docs.
    """

    server_clock: bool = False
    fencing: bool = False
    release_notify: bool = False
    replica_wait: bool = False
    scan: bool = False
    batch_extend: bool = False
    counting: bool = False
    min_ttl: float = 0.0
    clock: str = "not declared"
    wake: str = "not declared"


class ExtendRequest(NamedTuple):
    """One item of a batched extension: set ``key``'s lease to ``ttl`` if ``token`` holds it.

    A named tuple, not a dataclass: the heartbeat and ``acquire_many`` build one per lease of a
    batch, and a tuple is made at a fraction of the cost."""

    key: str
    token: str
    ttl: float

    def __repr__(self) -> str:
        return f"ExtendRequest(key={self.key!r}, token={describe_token(self.token)!r}, ttl={self.ttl!r})"


class ReleaseWatcher(abc.ABC):
    """A running subscription to release notifications of one backend.

    Created by :meth:`Backend.watch_releases`. It calls its callback with the full key of every
    released or force-released key it hears about, from a thread of its own; the callback must
    return quickly and must not raise.
    """

    @property
    @abc.abstractmethod
    def active(self) -> bool:
        """``True`` while notifications are flowing (subscribed and connected)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop listening and free the connection. Idempotent."""

    def wanted(self, key: str) -> None:
        """A first thread of this process started waiting for ``key`` (after a refused
        attempt). A watcher that does work per key may start it; the default does nothing."""

    def unwanted(self, key: str) -> None:
        """The last thread of this process waiting for ``key`` stopped waiting (it got the key,
        timed out or was cancelled). A watcher that does work per key may stop it and give
        back what it holds for that wait; the default does nothing."""


class LineGrant(NamedTuple):
    """A grant that reached a waiting thread through its place in line.

    ``fence`` is the grant's fence (``0`` when none was asked for). ``sent`` is when (on the
    clock the line was given) a request left that the store served before it made the grant,
    and ``lease`` the seconds the store's lease runs from the grant at least, so that the waiter
    can judge its lease as it judges any grant: ``sent + lease``, never longer. ``claimed`` is
    ``True`` for a key a release handed over: its lease is the claim window, which the waiter
    must extend to a full lease before it ends; ``False`` for a key the waiter's own request
    took (a full lease of the TTL asked for).
    """

    fence: int
    sent: float
    lease: float
    claimed: bool


class WaitingLine(abc.ABC):
    """One waiting thread's wait for one busy key: the only way the core is woken.

    Made by :meth:`Backend.join_line` once an attempt found the key held, used by that thread
    alone, and left with :meth:`leave`. How the thread is woken stays behind it: a release may
    hand the key over in the store (a direct line), announce itself to one waiting process or to
    all of them, or the line may look at the key itself when the holder's lease ends.
    """

    #: ``True`` for a direct line: the waiter blocks on a connection or request of its own, and
    #: a release grants it the key there, without another attempt (in the store's own step, or
    #: by the lock service). ``False`` for a line woken by a watcher the backend shares, whose
    #: own attempt then takes the key.
    direct: ClassVar[bool] = False

    @abc.abstractmethod
    def ask(self) -> Optional[int]:
        """One attempt at the key, as :meth:`Backend.acquire_fenced` makes it (a line that
        keeps a place in the store keeps it fresh with the same request): the fence (``0``
        when none was asked for) of a full grant, else ``None``. Raises
        ``BackendUnavailableError`` when the store cannot be reached."""

    @abc.abstractmethod
    def wait(self, seconds: float) -> Optional[LineGrant]:
        """Block up to ``seconds`` until the key reaches this waiter: the grant, or ``None``
        when the time ran out first. A line takes the key itself (with :meth:`ask`) when it
        learns that the key went free: a release was announced, or the holder's lease ended.
        It never polls the store more often than the holder's lease requires. Raises
        ``BackendUnavailableError`` when the store cannot be reached."""

    @abc.abstractmethod
    def leave(self, granted: bool) -> None:
        """Stop waiting. Unless ``granted`` (the acquisition holds the key), a key that reached
        this waiter meanwhile goes on to the next one. Best effort: never raises; what the line
        left in the store goes stale on its own."""


#: How much longer than the time a wait has left a bounded store call waits for its answer
#: (seconds) before it calls the store silent. A live store answers within milliseconds (a
#: commit, a script, a blocking pop whose time is up), but on a busy host the caller's own
#: thread may wait a second or more for a CPU, and a live store must never read as unreachable.
CALL_MARGIN = 2.0


class CallBudget(threading.local):
    """The deadline of a thread's store calls inside :meth:`Backend.call_budget` blocks, for a
    backend to bound them by: ``deadline`` is a ``time.monotonic()`` reading (the budget plus
    ``margin``, the backend's allowance for a live store's answer), ``None`` outside every
    block. Reading it is the whole cost on a call outside one."""

    #: ``None`` outside every block (the class attribute: a thread that never entered one).
    deadline: Optional[float] = None

    def __init__(self, margin: float) -> None:
        self.margin = margin

    def block(self, seconds: float) -> ContextManager[None]:
        """What :meth:`Backend.call_budget` returns: ``seconds`` from now (``math.inf``: no bound)."""
        if math.isinf(seconds):
            return contextlib.nullcontext()
        return self._until(time.monotonic() + max(seconds, 0.0) + self.margin)

    @contextlib.contextmanager
    def _until(self, deadline: float) -> Iterator[None]:
        outer = self.deadline
        # A block inside another lends its calls no more time than the outer one has left.
        self.deadline = deadline if outer is None else min(outer, deadline)
        try:
            yield
        finally:
            self.deadline = outer


class Backend(abc.ABC):
    """Base class of every backend. Subclasses implement the abstract primitives.

    Keys arrive with the locker's prefix already applied; tokens are opaque strings; TTLs are
    positive float seconds. A backend must be safe to call from several threads at once (the
    heartbeat thread and the caller's threads share it).
    """

    #: What this backend offers beyond the required primitives.
    capabilities: ClassVar[Capabilities] = Capabilities()
    #: Backend options a URL query string may set, each with the parser of its text form.
    url_options: ClassVar[Mapping[str, Callable[[str], Any]]] = {}

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Backend:
        """Build the backend from a URL; keyword ``options`` override the query string.

        Backends that can be named by URL override this. Unknown options are a
        ``ValidationError``.
        """
        raise ValidationError(f"{cls.__name__} cannot be built from a URL")

    # -- required primitives ------------------------------------------------------------------

    def acquire(self, key: str, token: str, ttl: float, owner: str) -> bool:
        """Grant ``key`` to ``token`` for ``ttl`` seconds if it is free or already ours.

        Returns ``True`` on a grant. A repeated acquire by the token holding the key resets its
        lease to ``ttl`` (an absolute new lease, never added) and returns ``True``.

        The default is a fenced grant with the fence dropped. A backend whose unfenced grant is
        cheaper overrides it; one without fences (whose :meth:`acquire_fenced` refuses) must.
        """
        return self.acquire_fenced(key, token, ttl, owner) is not None

    @abc.abstractmethod
    def acquire_fenced(self, key: str, token: str, ttl: float, owner: str) -> Optional[int]:
        """Like :meth:`acquire` but returns the grant's fence, or ``None`` on contention.

        Fences of one key are positive ints below 2**53, larger for every later grant, kept
        across extensions and same-token re-acquires (which return the same fence). A backend
        without fences (``capabilities.fencing`` off) raises ``NotImplementedError`` here.
        """

    @abc.abstractmethod
    def release(self, key: str, token: str) -> bool:
        """Delete ``key`` if ``token`` holds it; ``True`` when it did."""

    @abc.abstractmethod
    def extend(self, key: str, token: str, ttl: float) -> bool:
        """Replace the lease of ``key`` with ``ttl`` seconds from now if ``token`` holds it."""

    @abc.abstractmethod
    def is_held(self, key: str, token: str) -> bool:
        """``True`` if ``token`` holds a live lease on ``key``."""

    @abc.abstractmethod
    def inspect(self, key: str) -> LockState:
        """The state of ``key`` without a token."""

    @abc.abstractmethod
    def force_release(self, key: str) -> bool:
        """Delete ``key`` whoever holds it; ``True`` when a live lease was dropped."""

    def close(self) -> None:
        """Free what the backend opened itself. A client passed in by the caller stays open."""

    # -- optional capabilities -----------------------------------------------------------------

    def scan(self, prefix: str) -> Iterator[LockState]:
        """Held keys starting with ``prefix`` (``capabilities.scan``)."""
        raise NotImplementedError(f"{type(self).__name__} cannot list keys")

    def acquire_counted(self, key: str, token: str, ttl: float, owner: str, limit: int) -> Optional[int]:
        """Grant ``token`` one of the ``limit`` places (``limit`` >= 2) of the counting key
        ``key`` for ``ttl`` seconds, in one atomic step on the store (``counting``).

        Places whose lease ended are dropped first. A token that holds a place renews it (its
        lease reset to ``ttl``, its fence kept) and gets its fence again; a new place is
        granted while fewer than ``limit`` live places remain, with a fence drawn from the
        key's fence sequence (larger than every earlier grant of the key, exclusive ones
        included); otherwise the answer is ``None``. When the live holders were granted with
        another limit (an exclusive holder counts as limit 1), it raises
        :func:`limit_mismatch`'s error and writes nothing.

        A backend that grants counting leases makes the other primitives work on a place by
        its token: :meth:`extend`, :meth:`release`, :meth:`is_held` and :meth:`extend_many`
        act on the token's own place; an exclusive grant (:meth:`acquire`,
        :meth:`acquire_fenced`, :meth:`adopt`) finds a key with live places held; :meth:`inspect`
        and :meth:`scan` report ``limit`` and every holder (a counting key once, see
        :meth:`LockState.counting`); :meth:`force_release` drops every place; a place's release
        is announced as a key's release is, wherever releases are announced; and
        :meth:`join_line` given ``limit`` offers a line whose :meth:`WaitingLine.ask` asks for
        a place. The default refuses with ``NotImplementedError``.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot grant counting leases (limit > 1)")

    def extend_many(self, requests: Sequence[ExtendRequest]) -> list[bool]:
        """Extend several leases; one answer per request, in order (``batch_extend``).

        The default calls :meth:`extend` once per request; backends that can do it in one
        round trip override it and set ``capabilities.batch_extend``.
        """
        return [self.extend(item.key, item.token, item.ttl) for item in requests]

    def call_budget(self, seconds: float) -> ContextManager[None]:
        """Bound the store calls this thread makes inside the block to about ``seconds`` (plus a
        small margin of the backend's own): a call that gets no answer by then raises
        ``BackendUnavailableError``, so that a store that falls silent (connections open,
        nothing answered) ends a caller's wait at its timeout rather than after the driver's
        own timeouts and retries. The core enters it around every attempt and every wait in
        line of a wait, with the time the wait has left (``math.inf``, which bounds nothing,
        when it has no timeout).

        The default bounds nothing: calls wait as long as the driver's own timeouts say.
        :class:`CallBudget` keeps the deadline of such blocks for a backend that bounds them.
        """
        return contextlib.nullcontext()

    def join_line(
        self, key: str, token: str, ttl: float, owner: str, fenced: bool, clock: Callable[[], float],
        limit: int = 1,
    ) -> Optional[WaitingLine]:
        """A waiting line for a thread that found ``key`` held and waits for it with ``token``
        (a lease of ``ttl`` seconds labelled ``owner``, fenced when ``fenced``), timed on
        ``clock``; asks the store nothing. With ``limit`` > 1 (only for a backend that grants
        counting leases) the thread waits for a place of a counting key, and the line asks
        with :meth:`acquire_counted`.

        The default is ``None``: this store announces nothing, and the waiter sleeps out its
        retry pause between attempts. A backend that announces releases returns a line
        (:class:`~lease_lock.backends.line.AnnouncedLine` adapts a :meth:`watch_releases`
        watcher into one), and one that can hand a released key to the next waiter in the
        store's own step returns a direct line.
        """
        return None

    def watch_releases(self, callback: Callable[[str], None]) -> ReleaseWatcher:
        """Start delivering release notifications to ``callback`` (``release_notify``)."""
        raise NotImplementedError(f"{type(self).__name__} delivers no release notifications")

    def adopt(self, key: str, claim_token: str, token: str, ttl: float, owner: str) -> Optional[int]:
        """Hand ``key`` over from the claim ``claim_token`` to ``token``, in one atomic step.

        When ``key`` is free or held by ``claim_token``, it is granted to ``token`` for ``ttl``
        seconds with ``owner`` as its label. That is a new grant, not a renewal of the claim:
        the claim's token no longer holds the key, and the grant's fence is larger than the
        claim's (as after any change of hands). When ``token`` itself holds the key (the same
        call repeated after its answer was lost), its lease is reset to ``ttl`` and its fence
        kept, as :meth:`acquire_fenced` does. Any other holder leaves the key untouched and the
        answer is ``None``. Returns the fence (``0`` from a backend without fences).

        A claim is adopted at most once: a second adoption of the same claim by another token
        finds the key held by the first adopter and gets ``None``. That is what keeps a
        redelivered queue message, which carries the same job id, from running beside its
        first delivery (see :mod:`lease_lock.contrib.celery`).

        The default refuses with ``NotImplementedError``. A backend that cannot compare and
        replace the holding token in one step must not emulate this with a read and a write:
        two deliveries could then both see the claim and both take the key.
        """
        raise NotImplementedError(
            f"{type(self).__name__} cannot adopt a claim (replace its token in one atomic step), "
            "which lock_on_enqueue and enqueue_once need; implement Backend.adopt"
        )

    # -- validation hooks ----------------------------------------------------------------------

    def check_key(self, key: str) -> None:
        """Raise ``ValidationError`` if ``key`` breaks a rule of this backend stricter than the general key rules
        (non-empty ``str``, at most 1024 UTF-8 bytes, no NUL)."""

    def check_token(self, token: str) -> None:
        """Raise ``ValidationError`` if ``token`` is not a form this backend accepts."""

    def new_token(self) -> str:
        """A fresh random token in the form this backend prefers (16 random bytes as hex)."""
        return os.urandom(16).hex()


def parse_bool(text: str) -> bool:
    """A URL option's yes or no: ``1``/``true``/``yes``/``on`` or ``0``/``false``/``no``/``off``
    (any case); anything else raises ``ValueError``, which :func:`parse_url_options` reports."""
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


def parse_url_options(
    url: str,
    table: Mapping[str, Callable[[str], Any]],
    overrides: Mapping[str, Any],
    *,
    backend: str,
) -> dict[str, Any]:
    """Merge a URL's query-string options with keyword overrides through one parser table.

    Every name must be in ``table``; query values are parsed with its parser (a parser error
    becomes a ``ValidationError`` naming the option); keyword values override the query and are
    taken as they are.
    """
    query = urllib.parse.urlsplit(url).query
    options: dict[str, Any] = {}
    for name, text in urllib.parse.parse_qsl(query, keep_blank_values=True):
        if name not in table:
            raise unknown_option_error(f"{backend} URL", [name], table)
        try:
            options[name] = table[name](text)
        except ValidationError:
            raise
        except (TypeError, ValueError) as exc:
            if is_secret_option(name):
                # Neither the value nor the parser's words about it may reach a message.
                raise ValidationError(f"{backend} URL option {name} is malformed") from None
            raise ValidationError(f"{backend} URL option {name}={text!r}: {exc}") from exc
    for name, value in overrides.items():
        if name not in table:
            raise unknown_option_error(backend, [name], table)
        options[name] = value
    return options
