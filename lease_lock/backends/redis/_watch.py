"""Release notifications over Redis pub/sub: one subscriber connection per watcher.

Pub/sub channels belong to the whole server, not to a database, so the release scripts publish
on a channel that names the database (``lease_lock:released:<db>``) with the released key as
the message. A watcher subscribes to its own database's channel only.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any, Callable, Optional

from redis.exceptions import RedisError

from ..base import ReleaseWatcher

__all__ = ["RedisReleaseWatcher", "release_channel"]

_log = logging.getLogger("lease_lock")

# How long one read waits before the thread looks at its stop flag again; close() waits at most
# about this long for the thread.
_POLL = 0.2
_FIRST_RETRY = 0.05
_MAX_RETRY = 1.0


def release_channel(db: int) -> str:
    """The pub/sub channel on which releases of keys in database ``db`` are announced."""
    return f"lease_lock:released:{db}"


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
