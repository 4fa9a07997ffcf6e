"""What every backend's line of waiters shares (see :class:`~lease_lock.backends.handoff.LineSource`).

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

from .handoff import LineGrant, WaitingLine

__all__ = [
    "BURST", "CLAIM_MAX", "FREED", "FRESH_SHARE", "LINE_WAITERS", "REFRESH_SHARE", "Freed", "Handed", "Joined",
    "LineSlots", "RefreshedLine", "claim_for",
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
            self._refresh_due = time.monotonic() + wait
            return None
        self._refresh_due = -math.inf  # the place went with the grant
        return joined.fence

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
            handed = self._block(block)
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
        try:
            self._quit()
        except Exception:  # noqa: BLE001 - the place goes stale and a handed claim lapses
            _log.debug("leaving the line of a lock key failed; its place goes stale", exc_info=True)
        finally:
            self._done()

    def _done(self) -> None:
        """The thread left the line (after :meth:`_quit`, if it ran): free what it blocked on."""
