"""Direct hand-off on Redis: a waiting thread's place in its key's line (see JOIN_LINE and
_HAND_ON in :mod:`._scripts`).

A waiting thread refreshes its entry in the key's line and blocks in ``BLPOP`` on a grant list
of its own, on a connection of the client's pool. A release that finds a live entry hands the
key to that waiter in the same script, for a claim window only, and pushes the fence onto the
waiter's grant list: the waiter wakes up holding the key, with no attempt of its own and no
other thread in between. Its heartbeat extends the claim to a full lease a third of the way into
the window; a waiter that died, stopped or left meanwhile loses the key when the window ends.
A holder that was handed the key keeps it through its own releases for :data:`BURST`.

Why the waiter may trust the claim from the send of its latest refresh: the release reads the
entry that refresh wrote, so it ran after the refresh reached Redis, and the refresh left the
waiter before that. A lease of the claim window from the grant therefore runs at least a claim
window from that send, which is how the waiter judges it (and any grant). A release that came
*before* the refresh reached Redis would have left the key held by the waiter's token, which the
refresh itself then answers as a grant (and clears the grant list), so no older grant can be
mistaken for a newer one.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Sequence
from typing import Any, Callable, Optional, TypeVar

from ..handoff import LineGrant, WaitingLine
from ._scripts import JOIN_LINE, LEAVE_LINE

__all__ = ["BURST", "CLAIM_MAX", "FRESH_SHARE", "LINE_WAITERS", "LineSlots", "RedisWaitingLine", "claim_for"]

_log = logging.getLogger("lease_lock")
_Result = TypeVar("_Result")

#: The longest claim window (seconds): what a release hands the next waiter, and so the longest
#: a waiter that died between its last refresh and the grant keeps the key from everyone.
CLAIM_MAX = 6.0
#: A waiter's entry is fresh for this share of its claim window after each refresh (a release
#: skips a stale one), and the waiter refreshes it twice as often.
FRESH_SHARE = 0.5
_REFRESH_SHARE = 0.25
#: A waiter handed the key keeps it through its own releases this long (seconds): a release
#: within its burst leaves the key free (see _HAND_ON in _scripts), and the waiter at the head
#: of the line asks for the key itself when the burst ends.
BURST = 0.002
#: How many threads of one backend may wait in line at once, each blocked on a connection of
#: its own; further waiters wait through the shared hand-off watcher instead.
LINE_WAITERS = 8
#: A BLPOP timeout of zero would block for ever; shorter waits are not sent.
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


def _fence(reply: Any) -> int:
    # Fences travel as text; an unfenced grant's is empty.
    return int(reply) if reply else 0


class RedisWaitingLine(WaitingLine):
    """A waiting thread's place in one key's line (see the module docstring).

    ``commands`` runs the scripts (by hash first), ``client`` blocks in ``BLPOP``; ``join`` and
    ``leave`` are the keys and arguments of JOIN_LINE and LEAVE_LINE; ``granted`` names the
    waiter's grant list; ``translate`` maps a driver error to ``BackendUnavailableError`` (or
    ``None`` for one that passes through); ``block_cap`` bounds one BLPOP below the socket
    timeout; ``slots`` is given back on leaving.
    """

    def __init__(
        self,
        commands: Any,
        client: Any,
        *,
        join: tuple[Sequence[str], Sequence[Any]],
        leave: tuple[Sequence[str], Sequence[Any]],
        granted: str,
        ttl: float,
        claim: float,
        clock: Callable[[], float],
        translate: Callable[[BaseException], Optional[BaseException]],
        block_cap: float,
        slots: LineSlots,
    ) -> None:
        self._commands = commands
        self._client = client
        self._join = join
        self._leave = leave
        self._granted = granted
        self._ttl = ttl
        self._claim = claim
        self._refresh = claim * _REFRESH_SHARE
        self._clock = clock
        self._translate = translate
        self._block_cap = block_cap
        self._slots = slots
        #: When (real time) the entry needs its next refresh; the send of the latest refresh.
        self._refresh_due = -math.inf
        self._sent = 0.0
        self._left = False

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
        keys, argv = self._join
        reply = JOIN_LINE(self._commands, keys, argv)
        self._sent = sent
        if reply is None or isinstance(reply, int):
            # At the head of the line during a holder's burst (``reply`` ms left of it): no
            # release hands the key over before it ends, so ask again then.
            wait = self._refresh if reply is None else min(self._refresh, reply / 1000)
            self._refresh_due = time.monotonic() + wait
            return None
        self._refresh_due = -math.inf  # the place went with the grant
        return _fence(reply)

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
            reply = self._client.blpop([self._granted], timeout=min(block, self._block_cap))
            if reply is not None:
                # The release took the place; a grant the waiter cannot use (it came too late)
                # is released, and the next wait takes a new place.
                self._refresh_due = -math.inf
                return LineGrant(_fence(reply[1]), self._sent, self._claim, True)

    def leave(self, granted: bool) -> None:
        """See :meth:`WaitingLine.leave`."""
        if self._left:
            return
        self._left = True
        self._slots.give()
        if granted:
            return
        keys, argv = self._leave
        try:
            LEAVE_LINE(self._commands, keys, argv)
        except Exception:  # noqa: BLE001 - the entry goes stale and a handed claim lapses
            _log.debug("leaving the line of a lock key failed; its entry goes stale", exc_info=True)
