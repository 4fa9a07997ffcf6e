"""The LISTEN side of the fast hand-off: one dedicated connection and one daemon thread."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import select
import threading
import time
import zlib
from typing import Any, Callable, Optional

import psycopg2
import psycopg2.extensions

from ..base import ReleaseWatcher
from ..handoff import HandoffWatcher

__all__ = ["TURN_RETRY", "UNANSWERED_WAKE", "PostgresHandoffWatcher", "PostgresReleaseWatcher", "connection_name"]

logger = logging.getLogger("lease_lock")

#: Seconds of silence after which the listener proves its connection with a query, so that a
#: connection that died without closing its socket is noticed and replaced.
_PING_AFTER = 10.0
_FIRST_BACKOFF = 0.05
_MAX_BACKOFF = 2.0


def connection_name(parameters: dict[str, str], role: str = "listener") -> str:
    """``application_name`` of a dedicated connection (``role``: ``listener``, or ``line`` for
    a waiter's, see :mod:`._line`), so operators can tell it apart."""
    given = parameters.get("application_name")
    if given is None and "dsn" in parameters:
        given = psycopg2.extensions.parse_dsn(parameters["dsn"]).get("application_name")
    return f"{given or 'lease_lock'} {role}"


class PostgresReleaseWatcher(ReleaseWatcher):
    """Listens on the table's channel and calls ``callback(key)`` for every release.

    The connection is opened by the watcher itself (from the backend's connection
    parameters) and is never shared. When it breaks (server restart, ``pg_terminate_backend``,
    network loss), ``active`` turns ``False`` and the thread reconnects with a growing pause
    (50 ms up to 2 s); releases that happen in that gap are not reported, which is why waiters
    fall back to the holder's remaining lease while ``active`` is ``False``. The connection's
    ``application_name`` is the backend's own followed by ``listener``.
    """

    def __init__(
        self, parameters: dict[str, str], channel: str, callback: Callable[[str], Any]
    ) -> None:
        self._parameters = dict(parameters, application_name=connection_name(parameters))
        self._channel = channel
        self._callback = callback
        self._stop = threading.Event()
        self._connected = threading.Event()
        self._pid: Optional[int] = None
        # A self-pipe wakes the select() at once when close() is called.
        self._wake_read, self._wake_write = os.pipe()
        self._thread = threading.Thread(
            target=self._run, name=f"lease_lock-listen-{channel}", daemon=True
        )
        self._thread.start()

    @property
    def active(self) -> bool:
        """``True`` while subscribed on a live connection."""
        return self._connected.is_set() and not self._stop.is_set()

    @property
    def backend_pid(self) -> Optional[int]:
        """The server process id of the listening connection; ``None`` while disconnected."""
        return self._pid if self.active else None

    def close(self) -> None:
        """Stop the thread and close the connection. Idempotent."""
        if self._stop.is_set():
            return
        self._stop.set()
        os.write(self._wake_write, b"x")
        if threading.current_thread() is not self._thread:
            self._thread.join(10)
        os.close(self._wake_read)
        os.close(self._wake_write)

    def _run(self) -> None:
        backoff = _FIRST_BACKOFF
        while not self._stop.is_set():
            conn: Optional[Any] = None
            try:
                conn = self._subscribe()
                backoff = _FIRST_BACKOFF
                self._listen(conn)
            except (psycopg2.OperationalError, psycopg2.InterfaceError) as exc:
                if not self._stop.is_set():
                    logger.warning("release listener lost its connection (%s); reconnecting", exc)
            finally:
                self._connected.clear()
                self._lost()
                if conn is not None:
                    conn.close()
            if self._stop.wait(backoff):
                return
            backoff = min(backoff * 2, _MAX_BACKOFF)

    def _lost(self) -> None:
        """The listening connection is gone, and with it every session lock it held."""

    def _channels(self) -> list[str]:
        """The channels the connection listens on."""
        return [self._channel]

    def _subscribe(self) -> Any:
        conn = psycopg2.connect(**self._parameters)
        try:
            conn.autocommit = True
            with conn.cursor() as cursor:
                for channel in self._channels():
                    cursor.execute(f'LISTEN "{channel}"')
        except BaseException:
            conn.close()
            raise
        self._pid = int(conn.info.backend_pid)
        self._connected.set()
        return conn

    def _listen(self, conn: Any) -> None:
        heard = time.monotonic()
        while not self._stop.is_set():
            wait = min(_PING_AFTER, max(0.0, heard + _PING_AFTER - time.monotonic()), self._next_due())
            readable, _, _ = select.select([conn, self._wake_read], [], [], wait)
            if self._stop.is_set():
                return
            if conn in readable:
                heard = time.monotonic()
            elif time.monotonic() - heard >= _PING_AFTER:
                with conn.cursor() as cursor:
                    cursor.execute("SELECT 1")
                heard = time.monotonic()
            if self._wake_read in readable:
                os.read(self._wake_read, 4096)
            conn.poll()
            self._between(conn)
            while conn.notifies:
                notification = conn.notifies.pop(0)
                try:
                    self._deliver(conn, notification.channel, notification.payload, notification.pid)
                except (psycopg2.OperationalError, psycopg2.InterfaceError):
                    raise
                except Exception:
                    # The contract says callbacks do not raise; one that does must not stop
                    # the hand-off for every other waiter of the locker.
                    logger.exception("release callback raised; ignored")

    def _deliver(self, conn: Any, channel: str, key: str, sender: int) -> None:
        """Hand one notification (``sender``: the notifying server process) to the callback."""
        del conn, channel, sender
        self._callback(key)

    def _between(self, conn: Any) -> None:
        """Work queued for the listening connection by other threads or come due (none here)."""

    def _next_due(self) -> float:
        """Seconds until :meth:`_between` has work that comes due by time (never, here)."""
        return _PING_AFTER


#: How long a listener refused a hand-off turn waits before asking again at a release (a turn
#: given up is announced, and answered at once).
TURN_RETRY = 0.1
#: How long a release may go unanswered by the turn's holder before the other waiting processes
#: wake a waiter of their own: the holder says on ``woken_channel`` that it woke one, and a
#: holder that cannot (its process paused: SIGSTOP, a frozen container, a debugger) keeps the
#: turn, since its connection lives on, but holds every later hand-off back by this much at
#: most. The same bound as an outstanding wake on Redis.
UNANSWERED_WAKE = 0.25


def turn_id(label: str, key: str) -> tuple[int, int]:
    """The session advisory lock whose holder is next in line for ``key`` of table ``label``.

    Two ints, like the gates of fenced grants, so that the ``pg_advisory_lock(bigint)`` space
    stays the application's; the first names the table's turns, the second the key.
    """
    digest = hashlib.blake2b(f"{label}\0{key}".encode("utf-8", "surrogatepass"), digest_size=4).digest()
    table = zlib.crc32(f"{label}:turns".encode()) - 2**31
    return table, int.from_bytes(digest, "big", signed=True)


class PostgresHandoffWatcher(PostgresReleaseWatcher, HandoffWatcher):
    """Wake-one hand-off over LISTEN/NOTIFY: only the process next in line reacts to a release.

    Every listener hears every release, but for a key its process waits for, a listener acts
    only while its connection holds the key's *turn*, a session advisory lock taken with
    ``pg_try_advisory_lock`` when a release finds the turn free. The holder keeps the turn
    until its process stops waiting (its waiter got the lease, or left), so after a lost race
    it is first again at the next release, and the other processes stay asleep instead of
    trying and failing. A wake that finds no waiter here gives the turn up and announces the
    release again for the others. ``lease_left`` reads the key once per queueing (through
    ``inspect``) so that a release between a failed attempt and the queueing is not missed.

    A listener that failed to take a turn does not ask again at every release (under
    contention that was one round trip per waiting process per release): a turn given up is
    announced on ``turns_channel``, which the others answer at once, and otherwise a listener
    asks again only :data:`TURN_RETRY` seconds after its last failure (a turn whose holder's
    connection died ends without an announcement).

    A holder whose process is paused keeps the turn (its connection stays open) but can no
    longer act on it. So the holder that woke a waiter says so on ``woken_channel``, and a
    release of a wanted key that nobody answered that way within :data:`UNANSWERED_WAKE`
    wakes a waiter here all the same (the first listener to do so says so in turn).
    """

    def __init__(
        self,
        parameters: dict[str, str],
        channel: str,
        callback: Callable[[str], bool],
        label: str,
        lease_left: Callable[[str], Optional[float]],
        turns_channel: str,
        woken_channel: str,
    ) -> None:
        self._label = label
        self._lease_left = lease_left
        self._turns_channel = turns_channel
        self._woken_channel = woken_channel
        # key -> time.monotonic() by which a release of it, heard while another listener held
        # its turn, must have been answered on woken_channel.
        self._unanswered: dict[str, float] = {}
        self._woken: set[str] = set()  # wakes this listener delivered, to announce
        # key -> time.monotonic() of this listener's last failed try for its turn.
        self._refused: dict[str, float] = {}
        self._mutex = threading.Lock()
        self._wanted: set[str] = set()
        self._turns: set[str] = set()  # keys whose turn this connection holds
        self._give_up: set[str] = set()  # turns to unlock unless wanted again meanwhile
        self._drop: set[str] = set()  # turns to unlock in any case (a wake put back)
        self._announce: set[str] = set()  # releases to announce again
        self._pipe_lock = threading.Lock()
        self._pipe_closed = False
        super().__init__(parameters, channel, callback)

    def want(self, key: str) -> Optional[float]:
        """Act on releases of ``key`` from now on; return its lease left (``0.0``: free)."""
        with self._mutex:
            self._wanted.add(key)
            self._give_up.discard(key)
        left = self._lease_left(key)
        return 0.0 if left is None else max(left, 0.0)

    def unwant(self, key: str) -> None:
        """Stop acting on ``key`` and give its turn to the next process."""
        with self._mutex:
            self._wanted.discard(key)
            self._refused.pop(key, None)
            self._unanswered.pop(key, None)
            self._give_up.add(key)
        self._poke()

    def requeue(self, key: str) -> None:
        """Give up the turn and announce the release again, for another process."""
        with self._mutex:
            self._drop.add(key)
            self._announce.add(key)
        self._poke()

    def _poke(self) -> None:
        # Under the pipe lock: close() shuts the pipe, and its descriptor numbers could be
        # reused by the time a late poke writes.
        with self._pipe_lock:
            if not self._pipe_closed:
                with contextlib.suppress(OSError):
                    os.write(self._wake_write, b"x")

    def close(self) -> None:
        """Stop the thread and close the connection (its turns end with it). Idempotent."""
        with self._pipe_lock:
            self._pipe_closed = True
        super().close()

    def _channels(self) -> list[str]:
        return [self._channel, self._turns_channel, self._woken_channel]

    def _lost(self) -> None:
        with self._mutex:
            self._unanswered.clear()
            self._woken.clear()
            self._refused.clear()
            self._turns.clear()
            self._give_up.clear()
            self._drop.clear()

    def _next_due(self) -> float:
        with self._mutex:
            if not self._unanswered:
                return _PING_AFTER
            return max(0.0, min(self._unanswered.values()) - time.monotonic())

    def _between(self, conn: Any) -> None:
        now = time.monotonic()
        with self._mutex:
            give_up = [
                key for key in self._give_up | self._drop
                if key in self._turns and (key in self._drop or key not in self._wanted)
            ]
            self._turns.difference_update(give_up)
            self._give_up.clear()
            self._drop.clear()
            announce, self._announce = self._announce, set()
            due = [key for key, deadline in self._unanswered.items() if deadline <= now]
            for key in due:
                del self._unanswered[key]
        # Nobody answered these releases in time: the turn's holder is stuck, so a waiter here
        # tries instead (it is announced like any wake, so the others stand down).
        woken = {key for key in due if key in self._wanted and self._callback(key)}
        with self._mutex:
            woken |= self._woken
            self._woken = set()
        if not give_up and not announce and not woken:
            return
        with conn.cursor() as cursor:
            for key in give_up:
                cursor.execute("SELECT pg_advisory_unlock(%s, %s)", turn_id(self._label, key))
                cursor.execute("SELECT pg_notify(%s, %s)", (self._turns_channel, key))
            for key in announce:
                cursor.execute("SELECT pg_notify(%s, %s)", (self._channel, key))
            for key in woken:
                cursor.execute("SELECT pg_notify(%s, %s)", (self._woken_channel, key))

    def _take_turn(self, conn: Any, key: str, *, announced: bool) -> bool:
        """Whether this connection holds ``key``'s turn, asking for it when it was announced
        free or when the last refusal is :data:`TURN_RETRY` old."""
        with self._mutex:
            if key not in self._wanted:
                return False
            if key in self._turns:
                return True
            refused = self._refused.get(key)
        if not announced and refused is not None and time.monotonic() - refused < TURN_RETRY:
            return False
        with conn.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", turn_id(self._label, key))
            row = cursor.fetchone()
        with self._mutex:
            if row and row[0]:
                self._turns.add(key)
                self._refused.pop(key, None)
                return True
            self._refused[key] = time.monotonic()
        return False

    def _deliver(self, conn: Any, channel: str, key: str, sender: int) -> None:
        if sender == self._pid:
            return  # a wake or a turn this listener gave back is for the other processes
        if channel == self._woken_channel:
            with self._mutex:
                self._unanswered.pop(key, None)
            return
        if channel == self._turns_channel:
            # A turn was given up: the key was granted to its waiter or the waiter left (a
            # release it did not use was announced on the release channel), so taking the
            # turn wakes nobody here.
            self._take_turn(conn, key, announced=True)
            return
        if not self._take_turn(conn, key, announced=False):
            with self._mutex:
                if key in self._wanted:
                    # Another process is next in line; it has UNANSWERED_WAKE to say it woke.
                    self._unanswered.setdefault(key, time.monotonic() + UNANSWERED_WAKE)
            return
        if self._callback(key):
            with self._mutex:
                self._woken.add(key)
        else:
            self.requeue(key)
        # Unlock and announce now, in that order, so the others find the turn free; and say
        # that a waiter here was woken, so that the others do not wake one of their own.
        self._between(conn)
