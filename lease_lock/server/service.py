"""The lock service's rules, kept on top of any lease_lock backend.

The hosted "project locks" API promises more than a bare lease: a takeover grace of one second
after expiry, an absolute 90-day deadline per acquisition, renewals that must arrive more than a
second before expiry, and fences that rise on every change of hands. :class:`LockService`
implements those promises with nothing but the primitives of a
:class:`~lease_lock.backends.service.ServiceStore`, so that every server process sharing one
store agrees without talking to the others.

How the extra data is stored
----------------------------
- **Grace.** The backend lease is always one second longer than the service lease. The key is
  therefore unavailable to others exactly until expiry + grace, judged on the store's clock by
  the store itself, and the service expiry is the backend's remaining lease minus the grace.
- **Deadline and holder.** The backend's owner label carries ``svc1|<deadline>|<digest>|<owner>``:
  the acquisition's absolute deadline (Unix seconds on the granting server's wall clock), a
  short SHA-256 digest of the holder's token, and the operator-visible owner label. The label is
  written only by an acquisition; ``extend`` leaves it alone, so renewals cannot move the
  deadline, and a same-token re-acquire writes back the deadline it read.
- **Fences** are the backend's own fences, which already rise on every grant and survive
  release, expiry and force release.

Every decision is taken from a fresh read of the store followed by a token-checked atomic write,
so when two server processes race, the store's atomic primitive decides and the loser gets a
conflict, never a second holder. An acquisition first asks the store to grant the key only if
no lease holds it (``grant_if_free``): a free key needs no earlier read, since a fresh grant
takes a fresh deadline, and a held key comes back with the state the rules need. The remaining
windows are documented where they are handled.

Counting keys
-------------
An acquisition with a ``limit`` (N >= 2) asks for one of the key's N places
(:meth:`~lease_lock.backends.base.Backend.acquire_counted`). Each place is a lease of its own
in the store, with its own label (so its own deadline and token digest), lease and fence, and
the rules above hold for each place as for an exclusive key: the grace second, the 90-day
deadline, the renewal margin. Renewals and releases find the token's place by the digest in
its label.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable, Iterator, Optional, Union

from ..backends.base import Holder as StoreHolder
from ..backends.base import LineGrant, LockState, WaitingLine, limit_mismatch
from ..backends.service import ServiceStore
from ..errors import ValidationError
from ..wire import MAX_LIFETIME, RENEW_MARGIN, TAKEOVER_GRACE

__all__ = ["Conflict", "Grant", "Holder", "LockService", "Place", "ReservedKeyError"]

_LABEL_TAG = "svc1"
# How many accepted keys a service remembers (see LockService.store_key).
_KNOWN_KEYS = 4096


class ReservedKeyError(ValidationError):
    """A key whose name in the store the backend keeps for a structure of its own (the wire
    error ``invalid_key``, 400)."""


class Conflict(Exception):
    """The request lost to the lock's state; ``code`` is the wire error code (409).

    ``takeover_in``, on a ``lock_held`` conflict when the state was read, is the seconds until
    another token could take the key (what a waiting acquisition may sleep at most).
    """

    def __init__(self, code: str, message: str, takeover_in: Optional[float] = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.takeover_in = takeover_in


def _held_conflict(takeover_in: Optional[float] = None) -> Conflict:
    return Conflict("lock_held", "the lock is held by another owner", takeover_in)


def _lost_conflict(message: str) -> Conflict:
    return Conflict("lock_ownership_lost", message)


def _mismatch_conflict(key: str, asked: int, held: int) -> Conflict:
    # The message the store's own refusal carries, naming the key as the client knows it.
    return Conflict("limit_mismatch", str(limit_mismatch(key, asked, held)))


@dataclass(frozen=True)
class Grant:
    """A granted or renewed lease: its expiry (Unix seconds) and fence."""

    expires_at: float
    fence: int


@dataclass(frozen=True)
class Place:
    """One live lease of a key: its service expiry (Unix seconds), fence, owner label and the
    seconds until another token could take it (the remaining lease plus the grace)."""

    expires_at: float
    fence: int
    owner: Optional[str]
    takeover_in: float


@dataclass(frozen=True)
class Holder:
    """What a read reports about one key.

    ``expires_at`` is the service expiry in Unix seconds; ``takeover_in`` is the seconds until
    another token could take the key (the remaining lease plus the grace). For a counting key
    (``limit`` > 1) these, the fence and the owner are those of its latest grant; ``places``
    has every live lease, by fence (the one lease of an exclusive key).
    """

    key: str
    held: bool
    expires_at: Optional[float] = None
    fence: Optional[int] = None
    owner: Optional[str] = None
    takeover_in: Optional[float] = None
    limit: int = 1
    places: tuple[Place, ...] = ()


@dataclass(frozen=True)
class _Label:
    deadline: float
    digest: str
    owner: str

    @classmethod
    def parse(cls, text: Optional[str]) -> Optional[_Label]:
        """The label a server wrote, or ``None`` for a lease someone else wrote."""
        parts = (text or "").split("|", 3)
        if len(parts) != 4 or parts[0] != _LABEL_TAG:
            return None
        try:
            deadline = float(parts[1])
        except ValueError:
            return None
        return cls(deadline, parts[2], parts[3])


def _label_text(deadline: float, digest: str, owner: str) -> str:
    """The owner label a grant writes, which :meth:`_Label.parse` reads."""
    return f"{_LABEL_TAG}|{deadline:.3f}|{digest}|{owner}"


def _digest(token: str) -> str:
    # Enough bits to tell holders apart; the token itself never reaches the store's labels.
    return hashlib.sha256(token.encode("ascii")).hexdigest()[:24]


class LockService:
    """Project-scoped locks with the service's rules, over one backend.

    ``clock`` returns Unix seconds; it dates grants and deadlines, while expiry itself is always
    judged by the backend. Backend errors propagate untouched: the WSGI layer turns them into
    503 (fail closed).
    """

    def __init__(
        self,
        backend: ServiceStore,
        *,
        key_prefix: str = "locks/",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.backend = backend
        self._prefix = key_prefix
        self._clock = clock
        # (project, key) -> its backend key, for the keys the backend accepted: every request
        # names one, and a client uses the same few again and again.
        self._store_keys: dict[tuple[str, str], str] = {}

    def store_key(self, project: str, key: str) -> str:
        """The backend key of ``key`` in ``project`` (the ``/`` cannot occur in either).

        Raises :class:`ReservedKeyError` when the backend keeps that name for itself (with a
        key prefix that has a Redis hash tag, ``<key>:fence`` is the fence counter of
        ``<key>``), before anything is written.
        """
        known = self._store_keys.get((project, key))
        if known is not None:
            return known
        store_key = f"{self._prefix}{project}/{key}"
        try:
            self.backend.check_key(store_key)
        except ValidationError as exc:
            raise ReservedKeyError(f"key {key!r} of project {project!r}: {exc}") from None
        if len(self._store_keys) >= _KNOWN_KEYS:
            self._store_keys.clear()  # bounded: a burst of new names only costs their checks again
        self._store_keys[(project, key)] = store_key
        return store_key

    @staticmethod
    def _takeover_in(state: Union[LockState, StoreHolder]) -> float:
        """Seconds until the backend lease (service lease + grace) of a key or of one of its
        places ends, on the store's clock."""
        if state.expires_in is not None:
            return state.expires_in
        if state.expires_at is None:
            return 0.0
        return (state.expires_at - datetime.now(timezone.utc)).total_seconds()

    @staticmethod
    def _own(state: LockState, digest: str) -> Optional[tuple[StoreHolder, _Label]]:
        """The live lease of the token with ``digest`` on a key (its place on a counting key)
        and its label, or ``None`` when the token holds none."""
        if not state.held:
            return None
        for holder in state.holders:
            label = _Label.parse(holder.owner)
            if label is not None and label.digest == digest:
                return holder, label
        return None

    def acquire(self, project: str, key: str, token: str, ttl: int, owner: str) -> Grant:
        """Grant ``key`` to ``token`` or repeat a live grant (resetting it to ``ttl``).

        Raises :class:`Conflict` ``lock_held`` when another token holds the key (its grace
        second included) and ``lock_ownership_lost`` when this token's own lease lapsed and the
        grace second has not passed yet.
        """
        store_key = self.store_key(project, key)
        digest = _digest(token)
        now = self._clock()
        fresh = min(float(ttl), MAX_LIFETIME)
        answer = self.backend.grant_if_free(
            store_key, token, self.store_lease(ttl), _label_text(now + MAX_LIFETIME, digest, owner)
        )
        if isinstance(answer, int):
            return Grant(now + fresh, answer)
        # Held (or released again in between): decide from the state the store answered with.
        state = answer
        if state.held:
            label = _Label.parse(state.owner)
            if label is None or label.digest != digest or state.limit != 1:
                # A counting key is held for an exclusive grant while any of its places lives.
                raise _held_conflict(max(0.0, max(self._takeover_in(holder) for holder in state.holders)))
            if self._takeover_in(state) - TAKEOVER_GRACE <= 0:
                raise _lost_conflict("the lease of this token lapsed; retry after the grace second")
            deadline = label.deadline
        else:
            deadline = now + MAX_LIFETIME
        granted = min(float(ttl), deadline - now)
        if granted <= 0:
            raise _lost_conflict("the acquisition reached its 90-day deadline")
        # If this token's lease ran out completely between the read and this write, the store
        # grants a fresh lease carrying the old, earlier deadline: the safe direction.
        fence = self.backend.acquire_fenced(
            store_key, token, granted + TAKEOVER_GRACE, _label_text(deadline, digest, owner)
        )
        if fence is None:
            raise _held_conflict()
        return Grant(now + granted, fence)

    def acquire_counted(self, project: str, key: str, token: str, ttl: int, owner: str, limit: int) -> Grant:
        """Grant ``token`` one of the ``limit`` places of ``key`` or repeat its live grant
        (resetting it to ``ttl``, its deadline and fence kept).

        Raises :class:`Conflict` ``lock_held`` when every place is taken by other tokens,
        ``lock_ownership_lost`` as :meth:`acquire` does for the token's own place, and
        ``limit_mismatch`` when the key's live holders were granted another limit (an
        exclusive holder counts as 1), having written nothing. A store that grants no counting
        leases raises ``NotImplementedError`` naming it.
        """
        if not self.backend.capabilities.counting:
            raise NotImplementedError(
                f"the lock store ({type(self.backend).__name__}) grants no counting leases: "
                "limit needs a store that does (memory, for one)"
            )
        store_key = self.store_key(project, key)
        digest = _digest(token)
        # One read first: a repeat keeps the deadline its place's label carries, and a full key
        # or another limit is answered without a write.
        state = self.backend.inspect(store_key)
        now = self._clock()
        if state.held and state.limit != limit:
            raise _mismatch_conflict(key, limit, state.limit)
        own = self._own(state, digest)
        if own is None:
            if state.held and len(state.holders) >= limit:
                raise _held_conflict(self._next_place_in(state))
            deadline = now + MAX_LIFETIME
        else:
            if self._takeover_in(own[0]) - TAKEOVER_GRACE <= 0:
                raise _lost_conflict("the lease of this token lapsed; retry after the grace second")
            deadline = own[1].deadline
        granted = min(float(ttl), deadline - now)
        if granted <= 0:
            raise _lost_conflict("the acquisition reached its 90-day deadline")
        try:
            fence = self.backend.acquire_counted(
                store_key, token, granted + TAKEOVER_GRACE, _label_text(deadline, digest, owner), limit
            )
        except ValidationError:
            # The holders changed since the read (the store's message names the store key,
            # which stays here): read the limit they hold now.
            raise _mismatch_conflict(key, limit, self.backend.inspect(store_key).limit) from None
        if fence is None:
            raise _held_conflict()
        return Grant(now + granted, fence)

    def _next_place_in(self, state: LockState) -> float:
        """Seconds until the first place of a full counting key could be taken by another token."""
        return max(0.0, min(self._takeover_in(holder) for holder in state.holders))

    def join_line(self, project: str, key: str, token: str, ttl: int, owner: str) -> Optional[WaitingLine]:
        """A place in the store's line of ``key`` for an acquisition that waits for it, or
        ``None`` when the store keeps no line (or has no place free now).

        A release then hands the key to the first acquisition in line in the same atomic step
        as it drops its own lease (see :meth:`claim`). The place carries the label a grant
        writes, with a deadline counted from now: the deadline of a handed grant is at most
        a wait earlier than a grant made after the wait would have, the safe direction.
        """
        label = _label_text(self._clock() + MAX_LIFETIME, _digest(token), owner)
        line = self.backend.join_line(
            self.store_key(project, key), token, self.store_lease(ttl), label, True, time.monotonic
        )
        if line is not None and not line.direct:
            # Only a direct line is one here: the service's own wait room hears announced
            # releases for every waiting request of the process at once.
            line.leave(False)
            return None
        return line

    @staticmethod
    def store_lease(ttl: int) -> float:
        """Seconds of the store's lease behind a service lease of ``ttl``: the grace second on top."""
        return min(float(ttl), MAX_LIFETIME) + TAKEOVER_GRACE

    def claim(self, project: str, key: str, token: str, ttl: int, grant: LineGrant) -> Optional[Grant]:
        """The lease of ``ttl`` seconds that a place in line brought ``token``, or ``None``
        when the key was lost before it could be claimed.

        A key its own attempt took in line holds a full lease from that attempt. A key that a
        release handed over holds only a short claim window, which is extended to the full
        lease here, token-checked, before the grant is reported.
        """
        fresh = min(float(ttl), MAX_LIFETIME)
        if not grant.claimed:
            # Dated from the attempt's send, as :meth:`acquire` dates a grant from before its call.
            return Grant(self._clock() - (time.monotonic() - grant.sent) + fresh, grant.fence)
        now = self._clock()
        lease = self.store_lease(ttl)
        if grant.lease < lease and not self.backend.extend(self.store_key(project, key), token, lease):
            return None
        return Grant(now + fresh, grant.fence)

    def adopt(self, project: str, key: str, claim_token: str, token: str, ttl: int, owner: str) -> Grant:
        """Grant ``key`` to ``token`` when it is free or held by ``claim_token``, replacing that
        claim: a new grant, with a fresh deadline and a new fence (the store's
        :meth:`~lease_lock.backends.base.Backend.adopt`).

        A repeat by the token that already holds the key is an acquisition (its deadline is
        kept). Raises :class:`Conflict` ``lock_held`` when another token holds the key.
        """
        store_key = self.store_key(project, key)
        digest = _digest(token)
        label = _Label.parse(self.backend.inspect(store_key).owner)
        if label is not None and label.digest == digest:
            return self.acquire(project, key, token, ttl, owner)
        now = self._clock()
        fresh = min(float(ttl), MAX_LIFETIME)
        fence = self.backend.adopt(
            store_key, claim_token, token, self.store_lease(ttl), _label_text(now + MAX_LIFETIME, digest, owner)
        )
        if fence is None:
            raise _held_conflict(max(0.0, self._takeover_in(self.backend.inspect(store_key))))
        return Grant(now + fresh, fence)

    def renew(self, project: str, key: str, token: str, ttl: int) -> Grant:
        """Set the lease of ``token`` to ``ttl`` seconds from now, capped by its deadline.

        Raises :class:`Conflict` ``lock_ownership_lost`` unless ``token`` holds the key (a place
        of a counting key) and the request arrived more than one second before the lease's
        expiry.
        """
        store_key = self.store_key(project, key)
        state = self.backend.inspect(store_key)
        now = self._clock()
        own = self._own(state, _digest(token))
        lease, label = own if own is not None else (None, None)
        if lease is None or label is None or lease.fence is None:
            raise _lost_conflict("this token does not hold the lock")
        if self._takeover_in(lease) - TAKEOVER_GRACE <= RENEW_MARGIN:
            raise _lost_conflict("renewal arrived less than one second before expiry")
        granted = min(float(ttl), label.deadline - now)
        # ``extend`` is token-checked and atomic (on the token's place of a counting key); it
        # leaves the label (and so the deadline) as the acquisition wrote it.
        if granted <= 0 or not self.backend.extend(store_key, token, granted + TAKEOVER_GRACE):
            raise _lost_conflict("this token does not hold the lock")
        return Grant(now + granted, lease.fence)

    def release(self, project: str, key: str, token: str) -> bool:
        """Drop the lease of ``token`` (its place of a counting key); ``True`` when one was
        dropped, ``False`` when absent.

        Raises :class:`Conflict` ``lock_ownership_lost`` when another token holds the key, which
        is left as it is.
        """
        store_key = self.store_key(project, key)
        if self.backend.release(store_key, token):
            return True
        state = self.backend.inspect(store_key)
        if state.held and self._own(state, _digest(token)) is None:
            raise _lost_conflict("another token holds the lock")
        return False

    def force_release(self, project: str, key: str) -> bool:
        """Drop whatever lease holds ``key``; ``True`` when one was dropped."""
        return self.backend.force_release(self.store_key(project, key))

    def read(self, project: str, key: str) -> Holder:
        """The state of ``key``; held during the grace second as well (``takeover_in`` > 0)."""
        return self._holder(key, self.backend.inspect(self.store_key(project, key)))

    def list(self, project: str, prefix: str) -> Iterator[Holder]:
        """Held keys of ``project`` starting with ``prefix`` (needs ``capabilities.scan``)."""
        project_prefix = f"{self._prefix}{project}/"
        for state in self.backend.scan(project_prefix + prefix):
            if state.held:
                yield self._holder(state.key[len(project_prefix) :], state)

    def _holder(self, key: str, state: LockState) -> Holder:
        if not state.held:
            return Holder(key=key, held=False)
        now = self._clock()
        places = tuple(self._place(holder, now) for holder in state.holders)
        latest = places[-1]  # the state's top-level fields are its latest grant's
        return Holder(
            key=key,
            held=True,
            expires_at=latest.expires_at,
            fence=latest.fence,
            owner=latest.owner,
            takeover_in=latest.takeover_in,
            limit=state.limit,
            places=places,
        )

    def _place(self, holder: StoreHolder, now: float) -> Place:
        takeover_in = max(0.0, self._takeover_in(holder))
        label = _Label.parse(holder.owner)
        return Place(
            expires_at=now + takeover_in - TAKEOVER_GRACE,
            # A lease written around the service (no fence) still reads as held; 0 is below
            # every real fence, so a fencing check never trusts it.
            fence=holder.fence if holder.fence is not None else 0,
            owner=label.owner if label is not None else holder.owner,
            takeover_in=takeover_in,
        )
