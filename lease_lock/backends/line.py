"""What every backend's waiting line shares (see :meth:`~lease_lock.backends.base.Backend.join_line`).

Two kinds of line serve the core. :class:`AnnouncedLine` adapts a backend's announcements of
releases (a broadcast :class:`~lease_lock.backends.base.ReleaseWatcher`, or a wake-one
:class:`~lease_lock.backends.handoff.HandoffWatcher`) into a line: one watcher per backend,
fanned out to its waiting threads by :class:`Announcements`, and the line's own attempt takes
the key once a release is announced or the holder's lease ends. :class:`RefreshedLine` is a
direct line: a place in the key's line in the store, which a release hands the key to.

The rules of the claim window and of a waiter's place, the bound on the threads of one backend
that wait in line, and :class:`RefreshedLine`: the wait of one thread that keeps its place
fresh and blocks until a release hands it the key. A backend supplies only how one attempt
takes or refreshes the place (:meth:`RefreshedLine._join`), how the thread blocks for a handed
grant (:meth:`RefreshedLine._block`) and how it leaves (:meth:`RefreshedLine._quit`).

Why a handed grant may be judged from the send of the attempt that wrote the place the release
read: that attempt reached the store before the release read its place, and left the waiter
before that. A store's claim of the claim window from the grant therefore runs at least a claim
window from that send, which is how the waiter judges its lease (and any grant).
"""

from __future__ import annotations

import abc
import logging
import math
import os
import threading
import time
from typing import Callable, NamedTuple, Optional, TypeVar, Union

from ..clock import QUIET_PAUSE
from ..errors import RateLimitedError
from .base import Backend, LineGrant, ReleaseWatcher, WaitingLine
from .handoff import HandoffSource, HandoffWatcher

__all__ = [
    "BURST", "CLAIM_MAX", "FREED", "FRESH_SHARE", "LINE_WAITERS", "REFRESH_SHARE", "AnnouncedLine",
    "Announcements", "Freed", "Handed", "Joined", "LineSlots", "RefreshedLine", "claim_for",
]

_log = logging.getLogger("lease_lock")
_Result = TypeVar("_Result")

#: The longest claim window (seconds): what a release hands the next waiter, and so the longest
#: a waiter that died between its last refresh and the grant keeps the key from everyone.
CLAIM_MAX = 6.0
#: A waiter's place is fresh for this share of its claim window after each refresh (a release
#: skips a stale one), and the waiter refreshes it twice as often (REFRESH_SHARE).
FRESH_SHARE = 0.5
REFRESH_SHARE = 0.25
#: A waiter handed the key keeps it through its own releases this long (seconds): a release
#: within its burst hands nothing over and leaves the key free, so that a holder that releases
#: and takes the key straight back is not interrupted by a hand-over (each of which costs a
#: waiter's wake-up) at every release; the waiter at the head of the line, told when the burst
#: ends, asks for the key itself then.
BURST = 0.005
#: How many threads of one backend may wait in line at once, each blocked on a connection of
#: its own; further waiters wait through the backend's shared hand-off watcher instead.
LINE_WAITERS = 8
#: Shorter blocks than this are not worth a call into the store's client.
_SHORTEST_BLOCK = 0.001
#: The least a line waits for a holder's lease end it read (seconds): a lease read as ending
#: now, but still held at the next attempt, is not asked about in a tight loop.
_LEAST_LEASE_WAIT = 0.005
#: How long a line waits for a holder whose lease the store does not tell (seconds).
_UNTOLD_LEASE = 1.0


def claim_for(ttl: float) -> float:
    """The claim window of a waiter asking for a lease of ``ttl`` seconds."""
    return min(ttl, CLAIM_MAX)


class LineSlots:
    """The count of one backend's threads waiting in line, bounded by :data:`LINE_WAITERS`.

    A forked child starts with none: the parent's waiting threads do not exist there."""

    def __init__(self, limit: int = LINE_WAITERS) -> None:
        self._limit = limit
        self._mutex = threading.Lock()
        self._taken = 0
        self._pid = os.getpid()

    def take(self) -> bool:
        """One more waiting thread, or ``False`` when the bound is reached."""
        with self._mutex:
            if self._pid != os.getpid():
                self._pid, self._taken = os.getpid(), 0
            if self._taken >= self._limit:
                return False
            self._taken += 1
            return True

    def give(self) -> None:
        """A waiting thread left the line."""
        with self._mutex:
            if self._pid == os.getpid() and self._taken > 0:
                self._taken -= 1


class Joined(NamedTuple):
    """What one attempt in line came to: ``fence`` (``0`` when none was asked for) of a full
    grant, or ``None`` with the place taken or refreshed; ``ask_in``, when not ``None``, the
    seconds after which the waiter should ask again, sooner than its usual refresh."""

    fence: Optional[int]
    ask_in: Optional[float] = None


class Handed(NamedTuple):
    """A grant a release handed the waiter: its ``fence`` (``0`` when unfenced) and ``sent``,
    the send (on the line's clock) of an attempt whose place the release read."""

    fence: int
    sent: float


class Freed(NamedTuple):
    """What a block answers when the key went free without being handed over (it ran out, was
    force-released, or a release found no place in line to hand it to): the waiter asks at once."""


#: The one :class:`Freed` answer.
FREED = Freed()


class RefreshedLine(WaitingLine):
    """A waiting thread's place in one key's line, refreshed while it waits (see the module
    docstring). ``ttl`` is the lease asked for, ``claim`` the claim window a release hands
    over, ``clock`` the line's clock; ``translate`` maps a store client's error to
    ``BackendUnavailableError`` (``None`` for one that passes through); ``slots`` is given
    back on leaving."""

    direct = True

    def __init__(
        self,
        *,
        ttl: float,
        claim: float,
        clock: Callable[[], float],
        translate: Callable[[BaseException], Optional[BaseException]],
        slots: LineSlots,
    ) -> None:
        self._ttl = ttl
        self._claim = claim
        self._refresh = claim * REFRESH_SHARE
        self._clock = clock
        self._translate = translate
        self._slots = slots
        #: When (real time) the place needs its next refresh; the send of the latest attempt.
        self._refresh_due = -math.inf
        self._sent = 0.0
        self._left = False
        #: Reads the holder's remaining lease (see :meth:`watch_lease`), and when (real time)
        #: the lease read last ends.
        self._read_lease: Optional[Callable[[], Optional[float]]] = None
        self._holder_end = -math.inf
        #: Whether a block for a handed grant failed: the store may have fallen silent.
        self._silent = False

    def watch_lease(self, read: Callable[[], Optional[float]]) -> None:
        """Ask for the key when the holder's lease ends, read with ``read`` (seconds left,
        ``None`` when the key is free) once per lease: a lease that runs out hands nothing over,
        and a store that does not tell its line of it would otherwise keep the waiter until its
        next refresh."""
        self._read_lease = read

    @abc.abstractmethod
    def _join(self, sent: float) -> Joined:
        """One attempt that grants a free key (or the waiter's own) in full and otherwise takes
        or refreshes the place; ``sent`` is when it left (on the line's clock)."""

    @abc.abstractmethod
    def _block(self, seconds: float) -> Union[Handed, Freed, None]:
        """Block up to ``seconds`` for a grant a release hands over; ``None`` when none came.
        A store that sees the key go free may answer :data:`FREED` (the waiter then asks)."""

    @abc.abstractmethod
    def _quit(self) -> None:
        """Take the place out of the line and release a key handed over meanwhile (to the next
        waiter). May raise: :meth:`leave` logs and swallows it."""

    def ask(self) -> Optional[int]:
        """See :meth:`WaitingLine.ask`."""
        return self._translated(self._ask)

    def wait(self, seconds: float) -> Optional[LineGrant]:
        """See :meth:`WaitingLine.wait`."""
        return self._translated(lambda: self._wait(seconds))

    def _translated(self, call: Callable[[], _Result]) -> _Result:
        try:
            return call()
        except Exception as exc:
            translated = self._translate(exc)
            if translated is None:
                raise
            raise translated from exc

    def _ask(self) -> Optional[int]:
        sent = self._clock()
        joined = self._join(sent)
        self._sent = sent
        if joined.fence is None:
            wait = self._refresh if joined.ask_in is None else min(self._refresh, joined.ask_in)
            holder = self._holder_left()
            if holder is not None:
                wait = min(wait, holder)
            self._refresh_due = time.monotonic() + wait
            return None
        self._refresh_due = -math.inf  # the place went with the grant
        return joined.fence

    def _holder_left(self) -> Optional[float]:
        """Seconds until the holder's lease ends, read once per lease; ``None`` when unknown."""
        read = self._read_lease
        if read is None:
            return None
        now = time.monotonic()
        if now < self._holder_end:
            return self._holder_end - now
        left = read()
        if left is None:
            return None  # free already: the burst's end (ask_in) or the next refresh asks
        left = max(left, _LEAST_LEASE_WAIT)
        self._holder_end = now + left
        return left

    def _wait(self, seconds: float) -> Optional[LineGrant]:
        deadline = time.monotonic() + seconds
        while True:
            if time.monotonic() >= self._refresh_due:
                fence = self._ask()
                if fence is not None:
                    return LineGrant(fence, self._sent, self._ttl, False)
            now = time.monotonic()
            if deadline - now < _SHORTEST_BLOCK:
                return None
            block = min(deadline, self._refresh_due) - now
            if block < _SHORTEST_BLOCK:
                continue  # the refresh is due
            try:
                handed = self._block(block)
            except Exception:
                self._silent = True
                raise
            if isinstance(handed, Freed):
                self._refresh_due = -math.inf
                continue
            if handed is not None:
                # The release took the place; a grant the waiter cannot use (it came too late)
                # is released, and the next wait takes a new place.
                self._refresh_due = -math.inf
                return LineGrant(handed.fence, handed.sent, self._claim, True)

    def leave(self, granted: bool) -> None:
        """See :meth:`WaitingLine.leave`."""
        if self._left:
            return
        self._left = True
        self._slots.give()
        if granted:
            self._done()
            return
        if self._silent:
            # The store stopped answering while the waiter blocked: quitting would block the
            # caller for the client's timeouts again, past the wait's own timeout. The place
            # goes stale, and a claim handed over meanwhile lapses within its claim window.
            self._done()
            return
        try:
            self._quit()
        except Exception:  # noqa: BLE001 - the place goes stale and a handed claim lapses
            _log.debug("leaving the line of a lock key failed; its place goes stale", exc_info=True)
        finally:
            self._done()

    def _done(self) -> None:
        """The thread left the line (after :meth:`_quit`, if it ran): free what it blocked on."""


class Announcements:
    """One backend's announcements of releases, fanned out to the threads waiting for keys.

    The backend's watcher is started when a first thread waits and shared by every waiting
    thread of the backend. A backend that can queue waiters in the store
    (:class:`~lease_lock.backends.handoff.HandoffSource`) wakes one waiting process per
    release, and this wakes that process's longest-waiting thread: the others stay asleep
    instead of all trying and all but one failing. Otherwise every release wakes every thread
    waiting for the key. A forked child starts with no watcher and no waiters.
    """

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._mutex = threading.Lock()
        # Insertion-ordered: a wake-one hand-off goes to the thread that has waited longest.
        self._waiters: dict[str, dict[threading.Event, None]] = {}
        self._watcher: Union[ReleaseWatcher, HandoffWatcher, None] = None
        # key -> when (time.monotonic) its holder's lease ends, as read while queueing for it.
        self._lease_ends: dict[str, float] = {}
        self._closed = False
        self._pid = os.getpid()

    @property
    def _handoffs(self) -> Optional[HandoffSource]:
        backend = self._backend
        return backend if isinstance(backend, HandoffSource) and backend.handoff_ready else None

    @property
    def available(self) -> bool:
        """Whether the backend announces releases at all."""
        return self._backend.capabilities.release_notify or self._handoffs is not None

    @property
    def watching(self) -> bool:
        """``True`` once a watcher was started (until :meth:`close`)."""
        return self._watcher is not None

    @property
    def active(self) -> bool:
        """``True`` while announcements are flowing."""
        watcher = self._watcher
        return watcher is not None and watcher.active

    def register(self, key: str) -> threading.Event:
        """An event that is set when a release of ``key`` is announced; starts the watcher if
        needed. What starting the watcher raises (``BackendUnavailableError`` for a store that
        is down) propagates, and nothing stays registered."""
        event = threading.Event()
        with self._mutex:
            if self._pid != os.getpid():
                # A forked child: the parent's watcher thread is gone, its connection the parent's.
                self._pid, self._watcher, self._waiters, self._lease_ends = os.getpid(), None, {}, {}
            if self._closed:
                return event  # never set: the waiter looks at the key at its quiet pace
            start = self._watcher is None
            if start:
                handoffs = self._handoffs
                if handoffs is not None:
                    self._watcher = handoffs.watch_handoffs(self._on_handoff)
                else:
                    self._watcher = self._backend.watch_releases(self._on_release)
            watcher = self._watcher
            events = self._waiters.setdefault(key, {})
            first = not events
            events[event] = None
        if start:
            _log.debug("release watcher started for %s", type(self._backend).__name__)
        if first and isinstance(watcher, ReleaseWatcher):
            watcher.wanted(key)
        if first and isinstance(watcher, HandoffWatcher):
            try:
                # Outside the mutex: a round trip to the store.
                left = watcher.want(key)
            except BaseException:
                self.unregister(key, event)
                raise
            if left is not None:
                with self._mutex:
                    self._lease_ends[key] = time.monotonic() + left
            if left == 0.0:
                # Released between the failed attempt and the queueing: try again at once.
                event.set()
        return event

    def lease_left(self, key: str) -> Optional[float]:
        """Seconds until a waiter for ``key`` should look at it again when the wake-one watcher
        knows without asking the store (a kept turn, or the lease read while queueing, which
        serves the first wait after it only); ``None`` when unknown."""
        watcher = self._watcher
        if not isinstance(watcher, HandoffWatcher):
            return None
        kept = watcher.kept_turn(key)
        if kept is not None:
            # This process's woken attempt lost, and the store keeps its turn: try again then.
            return kept
        with self._mutex:
            end = self._lease_ends.pop(key, None)
        return None if end is None else max(0.0, end - time.monotonic())

    def unregister(self, key: str, event: threading.Event) -> None:
        """Stop waking ``event`` for ``key``.

        A wake-one hand-off that reached ``event`` but was not used (the waiter left on a
        timeout, or won by its own attempt) goes on to the next waiter, here or in another
        process, so that no release is swallowed.
        """
        with self._mutex:
            events = self._waiters.get(key)
            if events is None or event not in events:
                return
            del events[event]
            if not events:
                del self._waiters[key]
                self._lease_ends.pop(key, None)
            watcher = self._watcher
            handed_on = not isinstance(watcher, HandoffWatcher) or not event.is_set()
            if not handed_on and events:
                # Another thread here takes it (or is about to try anyway).
                self._wake_one(events)
                handed_on = True
        if not events and isinstance(watcher, ReleaseWatcher):
            watcher.unwanted(key)
        if isinstance(watcher, HandoffWatcher):
            if not events:
                watcher.unwant(key)
            if not handed_on:
                watcher.requeue(key)

    @staticmethod
    def _wake_one(events: dict[threading.Event, None]) -> None:
        for waiting in events:
            if not waiting.is_set():
                waiting.set()
                return

    def _on_handoff(self, key: str) -> bool:
        # Taken when some thread here waits for the key: the longest-waiting one not woken yet
        # is woken; when all were woken already they are about to try anyway.
        with self._mutex:
            events = self._waiters.get(key)
            if not events:
                return False
            self._wake_one(events)
            return True

    def _on_release(self, key: str) -> None:
        with self._mutex:
            events = list(self._waiters.get(key, ()))
        for event in events:
            event.set()

    def close(self) -> None:
        """Stop the watcher and wake every waiting thread (its next attempt finds the backend
        closed). Idempotent."""
        with self._mutex:
            self._closed = True
            watcher, self._watcher = self._watcher, None
            waiting = [event for events in self._waiters.values() for event in events]
            self._waiters.clear()
            self._lease_ends.clear()
        for event in waiting:
            event.set()
        if watcher is not None and self._pid == os.getpid():
            watcher.close()


class AnnouncedLine(WaitingLine):
    """A waiting thread's line on a backend that announces releases through ``announcements``.

    Its :meth:`wait` blocks until a release of the key is announced, or until the holder's
    lease ends (read once per lease, as the wake-one watcher saw it or with ``inspect``), and
    then takes the key with an ordinary attempt; it never polls while announcements flow.
    While the watcher is down it looks at the key every :data:`~lease_lock.clock.QUIET_PAUSE` instead.
    """

    def __init__(
        self,
        announcements: Announcements,
        backend: Backend,
        key: str,
        token: str,
        ttl: float,
        owner: str,
        fenced: bool,
        clock: Callable[[], float],
        limit: int = 1,
    ) -> None:
        self._announcements = announcements
        self._backend = backend
        self._key = key
        self._token = token
        self._ttl = ttl
        self._owner = owner
        self._fenced = fenced
        self._clock = clock
        #: Above 1, the line waits for a place of a counting key (see Backend.acquire_counted).
        self._limit = limit
        self._wake: Optional[threading.Event] = None
        #: When (real time) the holder's lease ends as last read; ``None`` to read it again.
        self._holder_end: Optional[float] = None
        #: Whether releases were announced when the key was last read: a release before the
        #: watcher heard anything is nobody's wake, so the key is read again once it hears.
        self._read_heard = False
        #: Whether a wait returned a grant its own attempt won (leaving unused gives it back).
        self._handed = False

    def ask(self) -> Optional[int]:
        """See :meth:`WaitingLine.ask`."""
        if self._wake is not None:
            # An announcement from now on is one this attempt did not see.
            self._wake.clear()
        self._holder_end = None
        if self._limit > 1:
            return self._backend.acquire_counted(self._key, self._token, self._ttl, self._owner, self._limit)
        if self._fenced:
            return self._backend.acquire_fenced(self._key, self._token, self._ttl, self._owner)
        return 0 if self._backend.acquire(self._key, self._token, self._ttl, self._owner) else None

    def wait(self, seconds: float) -> Optional[LineGrant]:
        """See :meth:`WaitingLine.wait`."""
        deadline = time.monotonic() + seconds
        if self._wake is None:
            # Registered before the lease is read, so a release in between is not missed.
            self._wake = self._announcements.register(self._key)
        wake = self._wake
        while True:
            now = time.monotonic()
            look_at = self._lease_end(now)
            if not self._announcements.active:
                look_at = min(look_at, now + QUIET_PAUSE)
            block = min(deadline, look_at) - now
            announced = wake.is_set() or (block > 0 and wake.wait(block))
            if not announced and (now := time.monotonic()) < look_at:
                if now >= deadline:
                    return None  # the time ran out first
                continue  # a timed wait may end a hair early: not yet the time to look
            sent = self._clock()
            try:
                fence = self.ask()
            except RateLimitedError:
                return None  # the caller's own attempt hears the store's pause
            if fence is not None:
                self._handed = True
                return LineGrant(fence, sent, self._ttl, False)
            if time.monotonic() >= deadline:
                return None

    def _lease_end(self, now: float) -> float:
        """When (real time) to look at the key unless a release is announced first."""
        end = self._holder_end
        heard = self._announcements.active
        if end is None or (heard and not self._read_heard):
            # Read after the look at the watcher: a release from then on is heard, or seen here.
            self._read_heard = heard
            left = self._announcements.lease_left(self._key) if self._limit == 1 else None
            if left is None:
                state = self._backend.inspect(self._key)
                # A counting key frees a place when its first lease ends.
                ends = [holder.expires_in for holder in state.holders if holder.expires_in is not None]
                if len(state.holders) < state.limit:
                    # Released (or a place of it freed) before the watcher heard: ask (almost) at once.
                    left = _LEAST_LEASE_WAIT
                else:
                    left = _UNTOLD_LEASE if not ends else max(min(ends), _LEAST_LEASE_WAIT)
            end = self._holder_end = now + left
        return end

    def leave(self, granted: bool) -> None:
        """See :meth:`WaitingLine.leave`: a key a wait took and the waiter did not hold is
        released (to the next waiter)."""
        wake, self._wake = self._wake, None
        if wake is not None:
            self._announcements.unregister(self._key, wake)
        if self._handed and not granted:
            self._handed = False
            try:
                self._backend.release(self._key, self._token)
            except Exception:  # noqa: BLE001 - best effort: the lease runs out on its own
                _log.debug("giving back a key a waiting line took failed; it runs out", exc_info=True)
