"""Direct hand-off on Redis: a waiting thread's place in its key's line (see JOIN_LINE and
_HAND_ON in :mod:`._scripts`).

A waiting thread refreshes its entry in the key's line and blocks in ``BLPOP`` on a grant list
of its own, on a connection the backend lends it (one it keeps between commands, see
:mod:`._connections`) until it leaves the line. A release
that finds a live entry hands the key to that waiter in the same script, for a claim window
only, and pushes the fence onto the waiter's grant list: the waiter wakes up holding the key,
with no attempt of its own and no other thread in between. Its heartbeat extends the claim to a
full lease a third of the way into the window; a waiter that died, stopped or left meanwhile
loses the key when the window ends. A holder that was handed the key keeps it through its own
releases for :data:`BURST`.

Why the waiter may trust the claim from the send of its latest refresh: the release reads the
entry that refresh wrote, so it ran after the refresh reached Redis, and the refresh left the
waiter before that. A lease of the claim window from the grant therefore runs at least a claim
window from that send, which is how the waiter judges it (and any grant). A release that came
*before* the refresh reached Redis would have left the key held by the waiter's token, which the
refresh itself then answers as a grant (and clears the grant list), so no older grant can be
mistaken for a newer one.

Every command of the place (its attempts, its blocks, its leaving) goes out on that one
connection and waits for its reply no longer than it may block plus :data:`CALL_MARGIN`: a
server that goes silent (frozen, or cut off with the connection still open) ends the wait with
``BackendUnavailableError`` near the time it was given, not after the client's socket timeout
and its retries.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Callable, Optional, Union

from redis.exceptions import ResponseError

from ..base import CALL_MARGIN
from ..line import (
    BURST,
    CLAIM_MAX,
    FREED,
    FRESH_SHARE,
    LINE_WAITERS,
    Freed,
    Handed,
    Joined,
    LineSlots,
    RefreshedLine,
    claim_for,
)
from ._connections import DirectCommands, NoReply
from ._scripts import JOIN_LINE, LEAVE_LINE

__all__ = [
    "BURST", "CLAIM_MAX", "FRESH_SHARE", "LINE_WAITERS", "LineSlots", "RedisWaitingLine", "claim_for",
]

#: Shorter blocks than this are not worth a round trip (BLPOP takes 0 as "for ever").
_SHORTEST_BLOCK = 0.001


def _fence(reply: Any) -> int:
    # Fences travel as text; an unfenced grant's is empty.
    return int(reply) if reply else 0


class _Within:
    """``execute_command`` on a place's connection, each reply awaited at most ``seconds``
    (what :class:`~._scripts.Script` calls)."""

    __slots__ = ("_line", "_seconds")

    def __init__(self, line: RedisWaitingLine, seconds: float) -> None:
        self._line = line
        self._seconds = seconds

    def execute_command(self, *args: Any) -> Any:
        return self._line._run(self._seconds, args)


class RedisWaitingLine(RefreshedLine):
    """A waiting thread's place in one key's line (see the module docstring).

    ``commands`` lends the connection the place sends its commands on (scripts by hash first,
    and the ``BLPOP`` its waits block in); ``join`` and ``leave`` are the keys and arguments of
    JOIN_LINE and LEAVE_LINE; ``granted`` names the waiter's grant list; the rest is
    :class:`~lease_lock.backends.line.RefreshedLine`'s.
    """

    def __init__(
        self,
        commands: DirectCommands,
        *,
        join: tuple[Sequence[str], Sequence[Any]],
        leave: tuple[Sequence[str], Sequence[Any]],
        granted: str,
        ttl: float,
        claim: float,
        clock: Callable[[], float],
        translate: Callable[[BaseException], Optional[BaseException]],
        slots: LineSlots,
    ) -> None:
        super().__init__(ttl=ttl, claim=claim, clock=clock, translate=translate, slots=slots)
        self._commands = commands
        self._join_call = join
        self._leave_call = leave
        self._granted = granted
        self._answers = _Within(self, CALL_MARGIN)
        # The connection the place's commands go out on, from its first command until the
        # thread leaves; its socket timeouts as lent; whether it was dropped since (its next
        # socket then has the bounded timeouts _run sets, see _give_back_connection).
        self._connection: Any = None
        self._timeouts: tuple[Any, Any] = (None, None)
        self._dropped = False

    def _join(self, sent: float) -> Joined:
        keys, argv = self._join_call
        reply = JOIN_LINE(self._answers, keys, argv)
        if reply is None:
            return Joined(None)
        if isinstance(reply, int):
            # At the head of the line during a holder's burst (``reply`` ms left of it): no
            # release hands the key over before it ends, so ask again then.
            return Joined(None, reply / 1000)
        return Joined(_fence(reply))

    def _block(self, seconds: float) -> Union[Handed, Freed, None]:
        # On a connection this place keeps while it waits, sent and read directly: the client's
        # way round every command (a connection from the pool and back, the reply's callback,
        # its bookkeeping) came between the grant's arrival and the waiter holding the key.
        deadline = time.monotonic() + seconds
        reply = self._blpop(seconds)
        if reply is not None and reply[1][:1] == b"!":
            # The key went free without being handed over (released inside its holder's burst,
            # or the waiter ahead left): ask for it when the burst ends, as a release within it
            # hands nothing over, unless a hand-over comes first.
            pause = min(int(reply[1][1:]) / 1000, deadline - time.monotonic())
            reply = self._blpop(pause) if pause >= _SHORTEST_BLOCK else None
            if reply is None or reply[1][:1] == b"!":
                return FREED
        if reply is None:
            return None
        # The release read the entry of the latest refresh (see the module docstring).
        return Handed(_fence(reply[1]), self._sent)

    def _blpop(self, seconds: float) -> Any:
        return self._run(seconds + CALL_MARGIN, ("BLPOP", self._granted, seconds))

    def _run(self, within: float, args: tuple[Any, ...]) -> Any:
        """Send ``args`` on the place's connection and return the reply that came within
        ``within`` seconds (see ``DirectCommands.reply_within``)."""
        connection = self._connection
        if connection is None:
            connection = self._connection = self._commands.lend()
            self._timeouts = (connection.socket_timeout, connection.socket_connect_timeout)
        try:
            return self._commands.reply_within(connection, args, within, self._drop)
        except ResponseError:
            raise  # an error reply, read in full: the connection is sound
        except BaseException as error:
            # The reply may still be on its way: this connection serves no other command.
            self._give_back_connection()
            if isinstance(error, NoReply):
                raise (self._translate(error) or error) from error
            raise

    def _drop(self) -> None:
        self._dropped = True

    def _done(self) -> None:
        self._give_back_connection()

    def _give_back_connection(self) -> None:
        connection, self._connection = self._connection, None
        if connection is None:
            return
        connection.socket_timeout, connection.socket_connect_timeout = self._timeouts
        if self._dropped:
            # Its socket was made with the bounded timeouts of one try: the next command makes
            # one with the client's.
            connection.disconnect()
            self._dropped = False
        self._commands.take_back(connection)

    def _quit(self) -> None:
        keys, argv = self._leave_call
        LEAVE_LINE(self._answers, keys, argv)
