"""Release notifications over Redis pub/sub: one subscriber connection per watcher.

Pub/sub channels belong to the whole server, not to a database, so the release scripts publish
on a channel that names the database (``lease_lock:released:<db>``) with the released key as
the message. A watcher subscribes to its own database's channel only.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from typing import Any, Callable, Optional

from redis.exceptions import RedisError

from ..base import ReleaseWatcher
from ..handoff import HandoffWatcher
from ._scripts import MARK_WAITING, PUSH_WAKE, Script

__all__ = [
    "HANDOFF_CONTROL_PREFIX", "OUTSTANDING_MS", "TURN_RETRIES", "TURN_RETRY_MS", "WAKE_MS",
    "RedisHandoffWatcher", "RedisReleaseWatcher", "Turns", "longest_block", "release_channel",
]

_log = logging.getLogger("lease_lock")

# How long one read waits before the thread looks at its stop flag again; close() waits at most
# about this long for the thread.
_POLL = 0.2
_FIRST_RETRY = 0.05
_MAX_RETRY = 1.0


def release_channel(db: int) -> str:
    """The pub/sub channel on which releases of keys in database ``db`` are announced."""
    return f"lease_lock:released:{db}"


def _run_in(client: Any, script: Script, *args: Any) -> Any:
    """Queue (on a pipeline) or run ``script`` with two keys and one argument, by its text:
    a pipeline's reply comes too late for an EVALSHA to fall back on."""
    return client.execute_command("EVAL", script.lua, *script.args(args[:2], args[2:]))


class RedisReleaseWatcher(ReleaseWatcher):
    """A daemon thread holding one pub/sub connection; reconnects when the connection drops.

    ``active`` is ``True`` only between the server's subscribe confirmation and the next
    connection error, so the core knows when to fall back to polling. Releases that happen while
    the watcher reconnects are not replayed.
    """

    def __init__(self, client: Any, channel: str, callback: Callable[[str], None]) -> None:
        self._client = client
        self._channel = channel
        self._callback = callback
        self._stop = threading.Event()
        self._active = False
        self._thread = threading.Thread(
            target=self._run, name="lease-lock-redis-watch", daemon=True
        )
        self._thread.start()

    @property
    def active(self) -> bool:
        """``True`` while subscribed on a live connection."""
        return self._active and not self._stop.is_set()

    @property
    def closed(self) -> bool:
        """``True`` once :meth:`close` was called."""
        return self._stop.is_set()

    def close(self) -> None:
        """Stop the thread and close its connection. Idempotent."""
        self._stop.set()
        self._active = False
        if self._thread is not threading.current_thread():
            self._thread.join(_POLL * 10)

    def _run(self) -> None:
        delay = _FIRST_RETRY
        while not self._stop.is_set():
            pubsub = self._client.pubsub()
            try:
                pubsub.subscribe(self._channel)
                while not self._stop.is_set():
                    if self._handle(pubsub.get_message(timeout=_POLL)):
                        delay = _FIRST_RETRY
            except (RedisError, OSError) as exc:
                if not self._stop.is_set():
                    _log.debug("release watcher lost its connection: %r; reconnecting", exc)
            finally:
                self._active = False
                self._close_quietly(pubsub)
            self._stop.wait(delay)
            delay = min(delay * 2, _MAX_RETRY)

    def _handle(self, message: Optional[dict[str, Any]]) -> bool:
        """Act on one pub/sub message; ``True`` when it confirmed the subscription."""
        if message is None:
            return False
        if message["type"] == "subscribe":
            self._active = True
            return True
        if message["type"] == "message":
            data = message["data"]
            key = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)
            try:
                self._callback(key)
            except Exception:  # noqa: BLE001
                # The callback must not raise; if it does, one lost wake-up is better than a
                # dead watcher (waiters still poll by the lease's end).
                _log.exception("release callback raised")
        return False

    @staticmethod
    def _close_quietly(pubsub: Any) -> None:
        with contextlib.suppress(RedisError, OSError):
            pubsub.close()


#: The names of the watchers' private control lists start with this.
HANDOFF_CONTROL_PREFIX = "lease_lock:handoff:"
#: How long a waiting marker lives without a refresh; the watcher refreshes it every
#: ``_MARKER_REFRESH`` seconds while it waits for the key.
_MARKER_MS = 5000
_MARKER_REFRESH = 1.0
#: How long a wake (or a control message) stays in its list when nobody takes it.
WAKE_MS = 10000
#: How long a pushed wake counts as outstanding at most: releases in that time push no other
#: wake unless the woken process has tried the key since (see the release scripts). Longer
#: than a woken waiter needs to try; if it died instead, the next release after this wakes
#: another.
OUTSTANDING_MS = 250
#: A woken attempt that loses its race (the releasing process took the key straight back)
#: keeps the waiter's turn: it tries again on its own after TURN_RETRY_MS, then after twice
#: that, TURN_RETRIES times in all, while releases wake nobody else; a loss after the last
#: retry gives the turn up, and the next release wakes a waiter again. So a holder that
#: releases and re-takes in a loop meets one waiter at a time instead of a wake-up chain per
#: release, and a key freed during a kept turn waits at most the turn's current pause.
TURN_RETRY_MS = 2
TURN_RETRIES = 3
_TURN_NOTES_LIMIT = 10_000
#: The longest one BLPOP blocks: close() and keys whose waiters left are noticed this often.
_BLOCK = 1.0


def longest_block(client: Any) -> float:
    """The longest one ``BLPOP`` on ``client`` may block: :data:`_BLOCK`, or half the client's
    socket timeout when that is shorter, since a BLPOP must return before the socket timeout
    would call the connection dead."""
    timeout = client.connection_pool.connection_kwargs.get("socket_timeout")
    return _BLOCK if not timeout else max(0.01, min(_BLOCK, timeout / 2))


class Turns:
    """The keys whose wake a waiter of this process took, and the turns its lost attempts keep.

    Shared by a backend (which builds each attempt and learns its outcome) and its hand-off
    watcher (which delivers the wakes and tells the waiter when a kept turn is due), and called
    from the watcher's thread and from acquiring threads. Each step is one or two dict operations,
    each atomic under the interpreter lock, and no mutex: a fork can never copy one held. Two
    threads racing on one key cost at most a wake answered twice or a turn given up early.
    """

    def __init__(self) -> None:
        #: Keys woken here and not tried since -> how many times that wake's turn was lost.
        self._woken: dict[str, int] = {}
        #: Keys whose attempt answering a wake is in flight -> the same count.
        self._trying: dict[str, int] = {}
        #: Keys whose kept turn is due -> when (monotonic seconds).
        self._due: dict[str, float] = {}

    def woken(self, key: str) -> None:
        """A wake for ``key`` reached a waiter here: its next attempt answers it."""
        if len(self._woken) >= _TURN_NOTES_LIMIT:
            # Notes of waiters that left without trying; each costs one more wake.
            self._woken.clear()
            self._due.clear()
        self._woken[key] = 0

    def unwoken(self, key: str) -> None:
        """Nobody here took the wake for ``key``."""
        self._woken.pop(key, None)

    def answering(self, key: str, keep_turn: bool = True) -> Optional[int]:
        """An attempt at ``key`` is being built: ``None`` when it answers no wake; else the
        milliseconds the store is to keep the turn if it loses (``0``: the turn is given up,
        always so without ``keep_turn``). A kept turn waits for :meth:`answered`."""
        if not self._woken:
            return None  # the usual case
        losses = self._woken.pop(key, None)
        if losses is None:
            return None
        if not keep_turn or losses >= TURN_RETRIES:
            return 0
        self._trying[key] = losses
        return TURN_RETRY_MS << losses

    def answered(self, key: str, lost: bool) -> None:
        """The attempt whose turn is kept came back: ``lost`` when another token held the key,
        so the waiter's next attempt answers the same wake, due when the turn's pause ends;
        otherwise (it won, or failed without an answer) the turn is over."""
        losses = self._trying.pop(key, None)
        if losses is None or not lost:
            return
        self._due[key] = time.monotonic() + (TURN_RETRY_MS << losses) / 1000
        self._woken[key] = losses + 1

    def give_up(self, key: str) -> bool:
        """The waiters here for ``key`` left: forget its wake; ``True`` when a turn was kept."""
        losses = self._woken.pop(key, 0)
        due = self._due.pop(key, None)
        return losses > 0 or due is not None

    def kept_turn(self, key: str) -> Optional[float]:
        """Seconds until the kept turn for ``key`` is due, once; ``None`` when none is kept."""
        if not self._due:
            return None
        due = self._due.pop(key, None)
        return None if due is None else max(0.0, due - time.monotonic())


class RedisHandoffWatcher(HandoffWatcher):
    """Wake-one hand-off over Redis lists: a daemon thread blocked in ``BLPOP``.

    While a process waits for ``key`` its watcher keeps a marker (a small hash, ``names(key)[0]``)
    alive; a release that finds the marker pushes one wake onto the key's wake list
    (``names(key)[1]``), which Redis hands to the watcher that has been blocked on it longest.
    Wakes are single elements (a release replaces any unclaimed one), so a burst of releases
    nobody took leaves one wake, not a backlog. A private control list interrupts the ``BLPOP``
    when a new key is wanted. ``turns`` (shared with the backend) says when a turn its waiters
    lost is due again (:meth:`kept_turn`).
    """

    def __init__(
        self,
        client: Any,
        names: Callable[[str], tuple[str, str]],
        callback: Callable[[str], bool],
        translate: Callable[[BaseException], Optional[BaseException]],
        turns: Optional[Turns] = None,
    ) -> None:
        self._client = client
        self._names = names
        self._callback = callback
        self._translate = translate
        self._turns = turns
        self._control = f"{HANDOFF_CONTROL_PREFIX}{uuid.uuid4().hex}"
        self._mutex = threading.Lock()
        self._wanted: dict[str, str] = {}  # wake list -> key
        self._refreshed = 0.0
        self._blocking: frozenset[str] = frozenset()  # the wake lists of the running BLPOP
        self._stop = threading.Event()
        self._active = False
        self._block = longest_block(client)
        self._thread = threading.Thread(target=self._run, name="lease-lock-redis-handoff", daemon=True)
        self._thread.start()

    @property
    def active(self) -> bool:
        """``True`` while the thread's last call to Redis succeeded."""
        return self._active and not self._stop.is_set()

    @property
    def closed(self) -> bool:
        """``True`` once :meth:`close` was called."""
        return self._stop.is_set()

    def want(self, key: str) -> Optional[float]:
        """Set the key's waiting marker and make the thread block on its wake list too; read
        the key's remaining lease in the same round trip."""
        marker, wake = self._names(key)
        with self._mutex:
            self._wanted[wake] = key
            # Wanted a moment ago and still in the running BLPOP with a fresh marker (the usual
            # case of a process contending again right after its own turn): nothing to send.
            if wake in self._blocking and time.monotonic() - self._refreshed < _MARKER_REFRESH:
                return None
        pipe = self._client.pipeline(transaction=False)
        _run_in(pipe, MARK_WAITING, marker, wake, _MARKER_MS)
        pipe.lpush(self._control, "1")
        pipe.pexpire(self._control, WAKE_MS)
        pipe.pttl(key)
        try:
            replies = pipe.execute()
        except Exception as exc:
            translated = self._translate(exc)
            if translated is None:
                raise
            raise translated from exc
        if not replies[0]:
            # A hand-off name of the key holds something else (a lease written through the bare
            # backend API): no wake can come, so the waiter polls, and BLPOP leaves the name be.
            self._unusable(key)
        left_ms = int(replies[-1])
        # PTTL: -2 for a missing key (released before the marker was up), -1 for no expiry.
        if left_ms == -2:
            return 0.0
        return None if left_ms < 0 else left_ms / 1000

    def kept_turn(self, key: str) -> Optional[float]:
        """Seconds until a waiter here whose woken attempt at ``key`` lost tries again (its
        turn kept, see :data:`TURN_RETRY_MS`), once; ``None`` when no turn is kept."""
        return None if self._turns is None else self._turns.kept_turn(key)

    def unwant(self, key: str) -> None:
        """Forget ``key``; the thread drops its wake list at its next turn. A turn kept for a
        waiter here is passed on with a wake, since a release during it woke nobody."""
        _, wake = self._names(key)
        with self._mutex:
            self._wanted.pop(wake, None)
        if self._turns is not None and self._turns.give_up(key):
            self.requeue(key)

    def requeue(self, key: str) -> None:
        """Push a wake back for another watcher."""
        marker, wake = self._names(key)
        with contextlib.suppress(RedisError, OSError):
            _run_in(self._client, PUSH_WAKE, marker, wake, WAKE_MS)

    def close(self) -> None:
        """Stop the thread (it notices within one ``BLPOP`` block). Idempotent."""
        self._stop.set()
        self._active = False
        with contextlib.suppress(RedisError, OSError):
            self._client.lpush(self._control, "1")
            self._client.pexpire(self._control, WAKE_MS)
        if self._thread is not threading.current_thread():
            self._thread.join(self._block * 5 + _POLL)

    def _mark(self, wanted: dict[str, str]) -> None:
        """Refresh the markers of ``wanted`` (wake list -> key) in one round trip; a key whose
        hand-off names hold something else leaves ``wanted`` and the keys blocked on."""
        keys = list(wanted.values())
        pipe = self._client.pipeline(transaction=False)
        for key in keys:
            _run_in(pipe, MARK_WAITING, *self._names(key), _MARKER_MS)
        for key, marked in zip(keys, pipe.execute()):
            if not marked:
                self._unusable(key)
                wanted.pop(self._names(key)[1], None)

    def _unusable(self, key: str) -> None:
        """Stop blocking on ``key``'s wake list, whose name holds something else."""
        _, wake = self._names(key)
        with self._mutex:
            self._wanted.pop(wake, None)
        _log.warning(
            "a hand-off name of lock key %r holds something else; its waiters poll instead", key
        )

    def _run(self) -> None:
        delay = _FIRST_RETRY
        while not self._stop.is_set():
            try:
                self._turn()
                delay = _FIRST_RETRY
            except (RedisError, OSError) as exc:
                self._active = False
                if self._stop.is_set():
                    return
                _log.debug("hand-off watcher lost its connection: %r; reconnecting", exc)
                self._stop.wait(delay)
                delay = min(delay * 2, _MAX_RETRY)
        with contextlib.suppress(RedisError, OSError):
            self._client.delete(self._control)

    def _turn(self) -> None:
        with self._mutex:
            wanted = dict(self._wanted)
            self._blocking = frozenset()
        now = time.monotonic()
        if wanted and now - self._refreshed >= _MARKER_REFRESH:
            self._mark(wanted)
            self._refreshed = now
        self._active = True
        with self._mutex:
            self._blocking = frozenset(wanted)
        # A lease written under a wake list's name since the last refresh fails this BLPOP
        # (WRONGTYPE) like a lost connection; the next refresh, within a second, drops it.
        reply = self._client.blpop([self._control, *wanted], timeout=self._block)
        if reply is None or self._stop.is_set():
            return
        name = reply[0].decode("utf-8", "replace") if isinstance(reply[0], bytes) else str(reply[0])
        if name == self._control:
            return
        key = wanted[name]
        try:
            taken = self._callback(key)
        except Exception:  # noqa: BLE001
            _log.exception("hand-off callback raised")
            taken = False
        if not taken:
            self.requeue(key)
