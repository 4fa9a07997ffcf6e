"""Direct hand-off on PostgreSQL: a waiting thread's place in its key's line.

A waiting thread's attempts go through the ``join`` statement (see ``_line_statements`` in
:mod:`._backend`): a free key is granted as by ``acquire``; a held one gives the thread a row in
``<table>_queue``, or refreshes it, naming the channel its listening connection (one of
:class:`ListeningConnections`) hears and a *ticket* new at each refresh. A release that finds a
fresh row hands the key to the oldest one in its own statement, for the claim window, with a new
fence, and NOTIFYs that channel with the ticket and the fence: the waiter wakes up holding the
key, with no attempt of its own. Its heartbeat extends the claim to a full lease a third of the
way into the window; a waiter that died, stopped or left meanwhile loses the key when the window
ends.

Why the waiter may trust the claim from the send of the refresh whose ticket came back: every
statement of the line runs under the key's gate (one after the other, each reading what the one
before committed), so the release read the row that refresh wrote, after the refresh committed,
and the refresh left the waiter before that. A release that ran before a refresh leaves the key
held by the waiter's token, which that refresh answers as a full grant: so only the ticket of
the latest refresh answered "in line" (or of one whose answer was lost) can come back, and a
notification of any other ticket, or of another waiter that used the same connection before, is
ignored. A release inside a holder's burst hands nothing over: it tells the head of the line, by
the same ticket, that the key went free, and the waiter asks for it at once.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import select
import threading
import time
from typing import Any, Callable, NamedTuple, Optional, Union

import psycopg2

from ..base import CALL_MARGIN, CallBudget, LineGrant
from ..line import FREED, Freed, Handed, Joined, LineSlots, RefreshedLine
from ._connections import arm_bound, close_inherited, end_bound, open_connection
from ._errors import is_connect_failure, unavailable
from ._watch import connection_name

__all__ = ["Listening", "ListeningConnections", "PostgresWaitingLine"]

#: What a release that left the key free during a holder's burst sends the head of the line in
#: place of a fence: ``<ticket>|free`` (see ``hand_on`` in :mod:`._backend`).
_FREE = "free"
#: Each waiting connection listens on a channel of its own: this, then 32 random hex digits
#: (48 characters, within PostgreSQL's 63).
CHANNEL_PREFIX = "lease_lock_line_"


class Listening(NamedTuple):
    """A dedicated autocommit connection and the channel it listens on."""

    conn: Any
    channel: str


class ListeningConnections:
    """The listening connections of one backend's waiters in line, kept open between waits.

    ``parameters`` gives the libpq parameters (asked once, at the first connection); ``dsn()``
    (the URL the backend was built from, if any: its password is kept out of errors) and
    ``label`` name the server and table in errors; a connection is opened within the thread's
    ``budget`` (see :func:`._connections.open_connection`). At most as many are open as threads
    may wait in line (see :class:`~lease_lock.backends.line.LineSlots`). A forked child closes
    its copies of the parent's idle connections without ending the parent's sessions.
    """

    def __init__(
        self,
        parameters: Callable[[float], dict[str, str]],
        dsn: Callable[[], Optional[str]],
        label: str,
        budget: CallBudget,
    ) -> None:
        self._parameters_of = parameters
        self._budget = budget
        self._parameters: Optional[dict[str, str]] = None
        self._dsn = dsn
        self._label = label
        self._mutex = threading.Lock()
        self._idle: list[Listening] = []
        self._pid = os.getpid()
        self._closed = False

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran (the backend is closed: no new waiter takes a place)."""
        return self._closed

    def take(self, within: float) -> Listening:
        """An idle listening connection, or a new one. Raises ``BackendUnavailableError`` when
        the server cannot be reached, or does not answer the statements of opening one within
        ``within`` seconds each (the connection itself waits as long as ``connect_timeout``
        and the thread's call budget allow); a refused login passes through as the driver's
        error."""
        with self._mutex:
            if self._pid != os.getpid():
                # The parent's connections: closing them here must not end its sessions.
                for inherited in self._idle:
                    close_inherited(inherited.conn)
                self._idle, self._pid = [], os.getpid()
            if self._idle:
                return self._idle.pop()
        if self._parameters is None:
            parameters = dict(self._parameters_of(within))
            self._parameters = dict(parameters, application_name=connection_name(parameters, "line"))
        channel = CHANNEL_PREFIX + secrets.token_hex(16)
        try:
            conn = open_connection(self._budget.deadline, **self._parameters)
        except psycopg2.Error as exc:
            if is_connect_failure(exc):
                raise unavailable(exc, self._dsn(), self._label) from exc
            raise
        try:
            conn.autocommit = True
            bound = arm_bound(conn, within)
            try:
                with conn.cursor() as cursor:
                    cursor.execute(f'LISTEN "{channel}"')
            finally:
                end_bound(bound)
        except BaseException:
            conn.close()
            raise
        return Listening(conn, channel)

    def give(self, listening: Listening, broken: bool) -> None:
        """Take back a connection from :meth:`take`; a broken one is closed, not kept."""
        conn = listening.conn
        with self._mutex:
            keep = not (broken or self._closed or conn.closed or self._pid != os.getpid())
            if keep:
                # Notifications for the waiter that used it: the next one ignores them anyway.
                conn.notifies.clear()
                self._idle.append(listening)
                return
        if self._pid == os.getpid():
            with contextlib.suppress(psycopg2.Error):
                conn.close()

    def close(self) -> None:
        """Close the idle connections; those in use are closed when given back. Idempotent."""
        with self._mutex:
            self._closed = True
            idle, self._idle = self._idle, []
        if self._pid == os.getpid():
            for listening in idle:
                with contextlib.suppress(psycopg2.Error):
                    listening.conn.close()


class PostgresWaitingLine(RefreshedLine):
    """A waiting thread's place in one key's line (see the module docstring).

    ``join(channel, ticket, within)`` runs one attempt in line (see
    :class:`~lease_lock.backends.line.Joined`); ``leave(conn, within)`` takes the place out and
    releases a key handed over meanwhile, on ``conn`` (the listening connection, ``None`` when
    there is no usable one); each is cut off after ``within`` seconds (see
    :data:`CALL_MARGIN`). ``connections`` lends the listening connection, taken at the first
    attempt and given back on leaving; the rest is
    :class:`~lease_lock.backends.line.RefreshedLine`'s.
    """

    def __init__(
        self,
        *,
        join: Callable[[str, str, float], Joined],
        leave: Callable[[Optional[Any], float], None],
        connections: ListeningConnections,
        dsn: Optional[str],
        label: str,
        ttl: float,
        claim: float,
        clock: Callable[[], float],
        slots: LineSlots,
    ) -> None:
        super().__init__(ttl=ttl, claim=claim, clock=clock, translate=self._unavailable, slots=slots)
        self._join_call = join
        self._leave_call = leave
        self._connections = connections
        self._dsn = dsn
        self._label = label
        self._listening: Optional[Listening] = None
        self._broken = False
        # Tickets name this waiter's refreshes; random, so that no other waiter can match them.
        self._id = secrets.token_hex(8)
        self._count = 0
        #: ticket -> send of its refresh, for the refreshes a release may have read (see the
        #: module docstring): the latest answered "in line", and any sent since.
        self._tickets: dict[str, float] = {}
        #: The end (time.monotonic()) of the wait under way, which bounds its statements.
        self._until: Optional[float] = None

    def wait(self, seconds: float) -> Optional[LineGrant]:
        """See :meth:`WaitingLine.wait`: returns, or raises ``BackendUnavailableError``, within
        ``seconds`` and :data:`CALL_MARGIN`, however silent the server."""
        self._until = time.monotonic() + seconds
        try:
            return super().wait(seconds)
        finally:
            self._until = None

    def _within(self) -> float:
        """How long the statement sent now may wait for its answer: to the end of the wait under
        way, if any, and the margin."""
        until = self._until
        return CALL_MARGIN + (0.0 if until is None else max(until - time.monotonic(), 0.0))

    def _unavailable(self, exc: BaseException) -> Optional[BaseException]:
        # Statements run through the backend, which raises BackendUnavailableError itself; what
        # is left is the listening connection's own failure.
        if isinstance(exc, (psycopg2.OperationalError, psycopg2.InterfaceError, OSError)):
            self._broken = True
            return unavailable(exc, self._dsn, self._label)
        return None

    def _join(self, sent: float) -> Joined:
        if self._listening is None:
            self._listening = self._connections.take(self._within())
        self._count += 1
        ticket = f"{self._id}.{self._count}"
        self._tickets[ticket] = sent
        joined = self._join_call(self._listening.channel, ticket, self._within())
        self._tickets = {} if joined.fence is not None else {ticket: sent}
        return joined

    def _block(self, seconds: float) -> Union[Handed, Freed, None]:
        listening = self._listening
        assert listening is not None  # the first wait joined first
        conn = listening.conn
        deadline = time.monotonic() + seconds
        while True:
            handed = self._handed(conn)
            left = deadline - time.monotonic()
            if handed is not None or left <= 0:
                return handed
            readable, _, _ = select.select([conn], [], [], left)
            if readable:
                conn.poll()

    def _handed(self, conn: Any) -> Union[Handed, Freed, None]:
        """The grant among the notifications received, if one names a ticket of this waiter,
        or :data:`FREED` when one says the key went free during a holder's burst."""
        while conn.notifies:
            ticket, _, fence = conn.notifies.pop(0).payload.partition("|")
            sent = self._tickets.get(ticket)
            if sent is None:
                continue
            if fence == _FREE:
                return FREED  # the place stays, and so does its ticket, until the waiter asks
            self._tickets = {}
            return Handed(int(fence) if fence else 0, sent)
        return None

    def _quit(self) -> None:
        listening = self._listening
        if listening is None:
            return  # no attempt was sent (the first needs the connection): no place to take out
        self._leave_call(None if self._broken else listening.conn, CALL_MARGIN)

    def _done(self) -> None:
        listening, self._listening = self._listening, None
        if listening is not None:
            self._connections.give(listening, self._broken)
