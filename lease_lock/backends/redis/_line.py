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
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Callable, Optional, Union

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
from ._connections import DirectCommands
from ._scripts import JOIN_LINE, LEAVE_LINE

__all__ = ["BURST", "CLAIM_MAX", "FRESH_SHARE", "LINE_WAITERS", "LineSlots", "RedisWaitingLine", "claim_for"]


#: Shorter blocks than this are not worth a round trip (BLPOP takes 0 as "for ever").
_SHORTEST_BLOCK = 0.001


def _fence(reply: Any) -> int:
    # Fences travel as text; an unfenced grant's is empty.
    return int(reply) if reply else 0


class RedisWaitingLine(RefreshedLine):
    """A waiting thread's place in one key's line (see the module docstring).

    ``commands`` runs the scripts (by hash first) and lends the connection the waits block on
    in ``BLPOP``; ``join`` and
    ``leave`` are the keys and arguments of JOIN_LINE and LEAVE_LINE; ``granted`` names the
    waiter's grant list; ``block_cap`` bounds one BLPOP below the socket timeout; the rest is
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
        block_cap: float,
        slots: LineSlots,
    ) -> None:
        super().__init__(ttl=ttl, claim=claim, clock=clock, translate=translate, slots=slots)
        self._commands = commands
        self._join_call = join
        self._leave_call = leave
        self._granted = granted
        self._block_cap = block_cap
        # The connection the waits block on, from the first wait until the thread leaves.
        self._connection: Any = None

    def _join(self, sent: float) -> Joined:
        keys, argv = self._join_call
        reply = JOIN_LINE(self._commands, keys, argv)
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
        # A connection error is retried as the client's own commands are, by the connection's
        # retry policy, on a new connection.
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
        connection = self._connection
        if connection is None:
            connection = self._connection = self._commands.lend()
        timeout = min(seconds, self._block_cap)

        def blpop() -> Any:
            connection.send_command("BLPOP", self._granted, timeout)
            return connection.read_response()

        try:
            return connection.retry.call_with_retry(blpop, lambda _error: connection.disconnect())
        except BaseException:
            # The reply may still be on its way: this connection serves no other command.
            connection.disconnect()
            self._give_back_connection()
            raise

    def _done(self) -> None:
        self._give_back_connection()

    def _give_back_connection(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            self._commands.take_back(connection)

    def _quit(self) -> None:
        keys, argv = self._leave_call
        LEAVE_LINE(self._commands, keys, argv)
