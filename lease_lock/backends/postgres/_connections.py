"""Borrowing autocommit connections from a caller's connection or a psycopg2 pool."""

from __future__ import annotations

import contextlib
import functools
import heapq
import itertools
import math
import os
import queue
import socket
import threading
import time
import weakref
from typing import Any, Callable, Iterator, Optional, Union

import psycopg2
import psycopg2.extensions
import psycopg2.pool

from ...errors import ValidationError
from ...validation import redact_url
from ._errors import scrub

__all__ = [
    "ConnectionSource", "KeptCursor", "LazyPool", "arm_bound", "check_dsn", "close_inherited",
    "connect_parameters", "end_bound", "open_connection",
]

_IDLE = psycopg2.extensions.TRANSACTION_STATUS_IDLE

#: Every pool and connection source alive, renewed in a forked child (see ``_after_fork``).
_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()


def _refuse_busy(conn: Any, origin: str) -> None:
    if conn.closed:
        # A closed connection is the driver's business: let psycopg2 raise its own error.
        return
    if conn.get_transaction_status() != _IDLE:
        raise ValidationError(
            f"{origin} is inside a transaction; lease_lock needs an idle connection it can "
            "use in autocommit mode (commit or roll back first, or give it its own connection)"
        )


#: libpq's least ``connect_timeout`` (seconds): it reads a smaller one as this.
_LEAST_CONNECT_TIMEOUT = 2


def open_connection(until: Optional[float], **parameters: Any) -> Any:
    """``psycopg2.connect(**parameters)``, its ``connect_timeout`` cut to what is left before
    ``until`` (on ``time.monotonic()``) when given, but to no less than libpq's least: a
    silent server (one whose host accepts the connection and never answers) is otherwise
    waited for as long as the parameters say, for ever when they say nothing."""
    if until is not None:
        seconds = max(_LEAST_CONNECT_TIMEOUT, math.ceil(until - time.monotonic()))
        given = _connect_timeout(parameters)
        if given <= 0 or seconds < given:
            parameters = dict(parameters, connect_timeout=str(seconds))
    return psycopg2.connect(**parameters)


def _connect_timeout(parameters: dict[str, Any]) -> int:
    """The ``connect_timeout`` of ``parameters`` (a ``dsn`` among them), ``0`` for none."""
    value = parameters.get("connect_timeout")
    if value is None and "dsn" in parameters:
        value = psycopg2.extensions.parse_dsn(parameters["dsn"]).get("connect_timeout")
    try:
        return int(value) if value is not None else 0
    except ValueError:
        return 0


class _Slots:
    """At most ``count`` borrowers at once; the others block until one gives back.

    A queue of ``count`` tokens: taking and giving back are single C calls, where a
    ``threading.BoundedSemaphore`` runs a Python-level ``Condition`` on every statement.
    """

    __slots__ = ("acquire", "release")

    def __init__(self, count: int) -> None:
        tokens: queue.SimpleQueue[None] = queue.SimpleQueue()
        for _ in range(count):
            tokens.put(None)
        self.acquire: Callable[[], None] = tokens.get
        self.release: Callable[[], None] = functools.partial(tokens.put, None)


class KeptCursor(psycopg2.extensions.cursor):  # type: ignore[misc]  # psycopg2 has no types
    """The cursor kept for one connection, knowing which statements its session has prepared.

    ``prepared`` holds the names of the server-side prepared statements this backend made on
    the connection's session; the backend clears it when the server says one is missing.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.prepared: set[str] = set()


class LazyPool:
    """The pool ``connect("postgresql://...")`` builds: opens connections on demand, keeps them.

    psycopg2's own pools close every returned connection beyond ``minconn``, so a burst of
    threads would pay a new server session per statement; this one keeps up to ``maxconn``
    idle connections and opens none before they are needed. It has the psycopg2 pool methods
    the backend uses (``getconn``, ``putconn``, ``closeall``, ``closed``, ``maxconn``) and is
    thread-safe.
    """

    def __init__(self, maxconn: int, dsn: str) -> None:
        self.maxconn = maxconn
        self.dsn = dsn
        self.closed = False
        self._idle: list[Any] = []
        self._lock = threading.Lock()
        _LIVE.add(self)

    def getconn(self, until: Optional[float] = None) -> Any:
        """An idle connection, or a new one (opened by ``until``: see :func:`open_connection`)."""
        with self._lock:
            if self.closed:
                raise psycopg2.pool.PoolError("connection pool is closed")
            if self._idle:
                return self._idle.pop()
        return open_connection(until, dsn=self.dsn)

    def putconn(self, conn: Any, close: bool = False) -> None:
        """Take ``conn`` back; a broken one (or ``close=True``) is closed instead of kept."""
        with self._lock:
            keep = not (close or conn.closed or self.closed) and len(self._idle) < self.maxconn
            if keep:
                self._idle.append(conn)
        if not keep and not conn.closed:
            conn.close()

    def discard_idle(self) -> None:
        """Close every idle connection: one was found broken, and what broke it (a restart, a
        failover, an idle-session kill) most likely broke them all, so the next borrower must
        get a fresh connection rather than draw the dead ones one by one."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _after_fork(self) -> None:
        # Runs in a forked child, single-threaded. The parent's idle connections share their
        # sockets with the parent: using one would interleave the two processes' queries and
        # replies, and closing one as is would send libpq's goodbye on the parent's session
        # and end it. So the child's copy of each socket is first swapped for /dev/null (the
        # parent's stays open), then the connection is closed here, harmlessly. The lock,
        # which another thread may have held at the fork, is replaced.
        idle, self._idle = self._idle, []
        self._lock = threading.Lock()
        for conn in idle:
            close_inherited(conn)

    def closeall(self) -> None:
        """Close every idle connection; connections still lent out close when returned."""
        with self._lock:
            self.closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


#: Inherited connections whose socket could not be swapped out: kept referenced for the
#: child's life, because freeing one would end the parent's session (see ``close_inherited``).
_KEPT_INHERITED: list[Any] = []


def close_inherited(conn: Any) -> None:
    """Close a connection a forked child inherited, without touching the parent's session."""
    if conn.closed:
        return
    try:
        devnull = os.open(os.devnull, os.O_RDWR)
        try:
            os.dup2(devnull, conn.fileno())
        finally:
            os.close(devnull)
    except (OSError, psycopg2.Error):
        _KEPT_INHERITED.append(conn)
        return
    with contextlib.suppress(psycopg2.Error):
        conn.close()


class ConnectionSource:
    """Lends one connection at a time in autocommit mode and takes it back.

    A single connection is guarded by a lock (psycopg2 would serialise its queries anyway,
    but the lock also keeps our autocommit switch atomic). A pool is guarded by a semaphore of
    its ``maxconn`` so that threads wait for a free connection instead of getting
    ``PoolError``; a connection that broke is handed back with ``close=True``, so the next
    borrower gets a fresh one. The caller's autocommit setting is restored on return.

    After ``fork()`` the child renews its locks and semaphore (another thread may have held
    them at the fork). A :class:`LazyPool` closes its copies of the parent's idle connections
    without ending the parent's sessions, and opens its own; a single connection passed in
    belongs to the parent, so the child refuses to use it (``ValidationError``) rather than
    share its socket. A ``psycopg2.pool`` pool is the application's, to be created after the
    fork like any psycopg2 pool.
    """

    def __init__(self, conn_or_pool: Any) -> None:
        if isinstance(conn_or_pool, (psycopg2.pool.AbstractConnectionPool, LazyPool)):
            self.pool: Any = conn_or_pool
            self.connection: Any = None
            self._slots: Union[_Slots, threading.Lock] = _Slots(max(1, int(conn_or_pool.maxconn)))
        elif isinstance(conn_or_pool, psycopg2.extensions.connection):
            _refuse_busy(conn_or_pool, "the connection")
            self.pool = None
            self.connection = conn_or_pool
            # A plain lock: a semaphore of one would cost a Python-level Condition per statement.
            self._slots = threading.Lock()
        else:
            raise ValidationError(
                "conn_or_pool must be a psycopg2 connection or a psycopg2.pool pool, not "
                f"{type(conn_or_pool).__name__} (use lease_lock.connect('postgresql://...') "
                "for a DSN)"
            )
        # SimpleConnectionPool is not thread-safe; a lock of our own makes every pool safe.
        self._pool_lock = threading.Lock()
        #: The cursor kept for each connection (see :meth:`cursor`); a connection is lent to
        #: one borrower at a time, and so is its cursor.
        self.cursors: dict[Any, KeptCursor] = {}
        #: Past this many kept cursors, those of closed connections are dropped.
        self._cursor_limit = 1 if self.pool is None else 2 * max(1, int(self.pool.maxconn))
        #: Serialises the first-use table checks of the backend that owns this source.
        self.ready_lock = threading.Lock()
        #: The process that owns the single connection (None with a pool).
        self._owner_pid = os.getpid() if self.pool is None else None
        #: Set in a forked child (see ``_after_fork``), which must not use a single connection.
        #: A flag rather than a getpid() per statement, which is a system call.
        self._inherited = False
        #: A single connection's lock, the connection and its kept cursor, once the cursor is
        #: made (``None`` before, with a pool and in a forked child): all that a statement on
        #: the idle autocommit connection needs, in one read (see ``PostgresBackend._run``).
        self.lone: Optional[tuple[Union[_Slots, threading.Lock], Any, KeptCursor]] = None
        _LIVE.add(self)

    @property
    def attempts(self) -> int:
        """How many connections one statement may try before its failure is reported.

        A :class:`LazyPool` drops every idle connection when one is found broken, so the
        second try runs on a fresh connection. Any other pool may hand out its dead idle
        connections one after the other: each broken one is closed, so ``maxconn + 1`` tries
        reach a fresh connection. A single connection cannot be replaced: one try.
        """
        if self.pool is None:
            return 1
        if isinstance(self.pool, LazyPool):
            return 2
        return max(1, int(self.pool.maxconn)) + 1

    def discard(self, conn: Any) -> None:
        """``conn`` was found broken: close it, and with a :class:`LazyPool` every idle one."""
        if self.pool is None:
            return
        self.cursors.pop(conn, None)
        with contextlib.suppress(psycopg2.Error):
            conn.close()
        if isinstance(self.pool, LazyPool):
            self.pool.discard_idle()

    def _after_fork(self) -> None:
        # In the forked child: no other thread exists, so every lock is renewed as free.
        if self.pool is None:
            self._slots = threading.Lock()
            self._inherited = True
            self.lone = None
        else:
            self._slots = _Slots(max(1, int(self.pool.maxconn)))
        self._pool_lock = threading.Lock()
        self.ready_lock = threading.Lock()
        # The kept cursors hold the parent's connections; freeing one that is still open would
        # end the parent's session (see close_inherited), so they are kept, never used again.
        _KEPT_INHERITED.extend(self.cursors.values())
        self.cursors = {}

    def cursor(self, conn: Any) -> KeptCursor:
        """A new cursor for ``conn``, kept in :attr:`cursors` for its next loans.

        Callers look in :attr:`cursors` first: a fresh cursor per statement costs more client
        CPU than the rest of what the backend adds to a statement. The cursor is of our own
        class whatever the connection's ``cursor_factory``, so rows are always plain tuples.
        """
        cursor: KeptCursor = conn.cursor(cursor_factory=KeptCursor)
        with self._pool_lock:
            cursors = self.cursors
            if len(cursors) >= self._cursor_limit:
                # Connections a pool closed on its own (beyond its size, or at closeall) are
                # never lent again: their cursors go.
                for kept in [kept for kept in cursors if kept.closed]:
                    del cursors[kept]
            cursors[conn] = cursor
            if self.pool is None and not self._inherited:
                self.lone = (self._slots, conn, cursor)
        return cursor

    def take(self, until: Optional[float] = None) -> tuple[Any, bool]:
        """An idle connection in autocommit mode, lent until :meth:`give_back`; a new one of a
        :class:`LazyPool` is opened by ``until`` (see :func:`open_connection`).

        Returns the connection and whether autocommit was switched on for the loan (to be
        switched off again on return). The hot path calls this pair instead of :meth:`borrow`
        because a generator-based context manager costs more than the bookkeeping itself, and
        the usual case (an idle autocommit connection) is decided inline for the same reason.
        """
        self._slots.acquire()
        try:
            conn = self.connection
            if conn is None or self._inherited:
                conn = self._take(until)
            if conn.closed or (conn.autocommit and conn.get_transaction_status() == _IDLE):
                # A closed connection is the driver's business: its first use raises its error.
                return conn, False
            try:
                _refuse_busy(conn, "the connection" if self.pool is None else "a pooled connection")
                conn.autocommit = True
            except BaseException:
                self._give_back(conn)
                raise
        except BaseException:
            self._slots.release()
            raise
        return conn, True

    def give_back(self, conn: Any, switched: bool) -> None:
        """Return a connection from :meth:`take`, restoring the caller's autocommit setting."""
        try:
            if switched and not conn.closed:
                conn.autocommit = False
            if self.pool is not None:  # a single connection has no pool to go back to
                self._give_back(conn)
        finally:
            self._slots.release()

    @contextlib.contextmanager
    def borrow(self) -> Iterator[Any]:
        """Yield an idle connection in autocommit mode for one statement."""
        conn, switched = self.take()
        try:
            yield conn
        finally:
            self.give_back(conn, switched)

    def _take(self, until: Optional[float]) -> Any:
        if self.pool is None:
            if self._inherited:
                raise ValidationError(
                    f"this PostgreSQL connection was opened by process {self._owner_pid} before "
                    "fork(); a child process must not share its socket: give each process its "
                    "own connection, or use lease_lock.connect('postgresql://...'), whose pool "
                    "reconnects in a child"
                )
            return self.connection
        with self._pool_lock:
            # Another pool opens its connections as its own arguments say.
            return self.pool.getconn(until) if isinstance(self.pool, LazyPool) else self.pool.getconn()

    def _give_back(self, conn: Any) -> None:
        if self.pool is None:
            return
        with self._pool_lock:
            self.pool.putconn(conn, close=bool(conn.closed))

    def parameters(self) -> dict[str, str]:
        """Connection parameters (password included) to open a dedicated connection alike."""
        with self.borrow() as conn:
            return connect_parameters(conn)


class _Cutter:
    """One thread that cuts the connections whose statements outlast their bound (see
    :func:`arm_bound`). libpq waits for a statement's answer without a timeout of its own, and a
    silent server (stopped, or behind a network that holds every byte back) is still
    acknowledged by its host's TCP stack, so neither keepalives nor ``tcp_user_timeout`` end
    that wait: shutting the socket down does, at once, with the driver's "server closed the
    connection" error. A forked child starts a thread of its own at its first bound."""

    def __init__(self) -> None:
        self._start()

    def _start(self) -> None:
        """Empty, without a thread (one starts at the first bound); also in a forked child,
        where the parent's thread does not exist and may have held the lock at the fork."""
        self._changed = threading.Condition(threading.Lock())
        #: (deadline on time.monotonic(), order, socket descriptor, entry): entry[0] is
        #: "armed" until the statement ends ("done") or the socket is cut ("cut").
        self._due: list[tuple[float, int, int, list[str]]] = []
        self._order = itertools.count()
        self._pid = 0

    def arm(self, fd: int, seconds: float) -> list[str]:
        entry = ["armed"]
        with self._changed:
            if self._pid != os.getpid():
                self._pid, self._due = os.getpid(), []
                threading.Thread(target=self._run, name="lease-lock-postgres-bounds", daemon=True).start()
            heapq.heappush(self._due, (time.monotonic() + seconds, next(self._order), fd, entry))
            if self._due[0][3] is entry:
                self._changed.notify()
        return entry

    def disarm(self, entry: list[str]) -> bool:
        """End the bound of ``entry``; ``True`` when its socket was cut."""
        with self._changed:
            cut = entry[0] == "cut"
            entry[0] = "done"
        return cut

    def _run(self) -> None:
        pid = os.getpid()
        with self._changed:
            while self._pid == pid:
                while self._due and self._due[0][3][0] == "done":
                    heapq.heappop(self._due)
                if not self._due:
                    self._changed.wait()
                    continue
                deadline, _, fd, entry = self._due[0]
                left = deadline - time.monotonic()
                if left > 0:
                    self._changed.wait(left)
                    continue
                heapq.heappop(self._due)
                entry[0] = "cut"
                # Under the lock: the statement's thread cannot end its bound, give the
                # connection back and let its descriptor be reused meanwhile.
                with contextlib.suppress(OSError), socket.socket(fileno=os.dup(fd)) as duplicate:
                    duplicate.shutdown(socket.SHUT_RDWR)


_CUTTER = _Cutter()


def arm_bound(conn: Any, seconds: float) -> list[str]:
    """Bound what runs on ``conn`` from now on to ``seconds``: a statement still waiting for
    its answer then fails as on a connection the server closed, and the connection is dead.
    :func:`end_bound` ends the bound."""
    return _CUTTER.arm(conn.fileno(), seconds)


def end_bound(bound: list[str]) -> bool:
    """End a bound from :func:`arm_bound`; ``True`` when it cut the connection (which must then
    be closed, even if its statement did answer)."""
    return _CUTTER.disarm(bound)


def _after_fork_in_child() -> None:
    _CUTTER._start()
    for item in list(_LIVE):
        item._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


def connect_parameters(conn: Any) -> dict[str, str]:
    """The libpq parameters of an open connection, password included, empty ones left out."""
    parameters = {name: value for name, value in conn.info.dsn_parameters.items() if value}
    if conn.info.password:
        parameters["password"] = conn.info.password
    return parameters


def check_dsn(dsn: str) -> None:
    """Raise ``ValidationError`` if libpq cannot parse ``dsn`` (nothing is contacted)."""
    try:
        psycopg2.extensions.parse_dsn(dsn)
    except psycopg2.ProgrammingError as exc:
        detail = scrub(" ".join(str(exc).split()), dsn)
    else:
        return
    # libpq quotes the offending part, which may be the password itself ("invalid
    # percent-encoded token"): the message is scrubbed, and raised outside the handler so
    # that the driver's error, which carries the same text, is neither cause nor context.
    raise ValidationError(f"invalid PostgreSQL DSN {redact_url(dsn)}: {detail}".strip())
