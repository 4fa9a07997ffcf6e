"""A backend wrapper that logs every lease-changing primitive with its send and receive times.

The checker judges the backend by these records, not by what the core believed: a call that
left at ``t0`` and was answered at ``t1`` was applied by the server somewhere in between. Tokens
are never logged; each is replaced by the id of the hold it belongs to (``holds`` maps them).
"""

from __future__ import annotations

from typing import Callable, ContextManager, Iterator, Optional, Sequence, TypeVar

from lease_lock.backends.base import Backend, ExtendRequest, LockState, ReleaseWatcher, WaitingLine
from lease_lock.backends.line import AnnouncedLine, Announcements

from .eventlog import EventLog, host_now

__all__ = ["RecordingBackend"]

_Answer = TypeVar("_Answer")


class RecordingBackend(Backend):
    """Delegates to ``inner``; logs acquire/extend/release calls as ``call`` events."""

    def __init__(self, inner: Backend, log: EventLog, holds: dict[str, str]) -> None:
        self.inner = inner
        self._log = log
        self._holds = holds
        # The core reads capabilities from the backend object, so the wrapper must show the
        # wrapped backend's (batch extension, release notification, fencing).
        self.capabilities = inner.capabilities  # type: ignore[misc]
        # Waiters are woken by the wrapped backend's release notifications, and every attempt
        # of theirs goes through this wrapper, so that it is logged (the wrapped backend's own
        # line would ask the store behind the log's back).
        self._announcements = Announcements(self)

    def _call(self, op: str, key: str, token: str, ttl: Optional[float], run: Callable[[], _Answer]) -> _Answer:
        hold = self._holds.get(token, "?")
        t0 = host_now()
        try:
            answer = run()
        except Exception as error:
            self._log.write("call", op=op, key=key, hold=hold, ttl=ttl, t0=t0, t1=host_now(), error=repr(error))
            raise
        self._log.write("call", op=op, key=key, hold=hold, ttl=ttl, t0=t0, t1=host_now(), result=answer)
        return answer

    def acquire(self, key: str, token: str, ttl: float, owner: str) -> bool:
        """Logged ``acquire``."""
        return self._call("acquire", key, token, ttl, lambda: self.inner.acquire(key, token, ttl, owner))

    def acquire_fenced(self, key: str, token: str, ttl: float, owner: str) -> Optional[int]:
        """Logged ``acquire_fenced``."""
        return self._call("acquire_fenced", key, token, ttl, lambda: self.inner.acquire_fenced(key, token, ttl, owner))

    def release(self, key: str, token: str) -> bool:
        """Logged ``release``."""
        return self._call("release", key, token, None, lambda: self.inner.release(key, token))

    def extend(self, key: str, token: str, ttl: float) -> bool:
        """Logged ``extend``."""
        return self._call("extend", key, token, ttl, lambda: self.inner.extend(key, token, ttl))

    def extend_many(self, requests: Sequence[ExtendRequest]) -> list[bool]:
        """Logged as one ``extend`` record per request, all with the batch's times."""
        t0 = host_now()
        try:
            answers = self.inner.extend_many(requests)
        except Exception as error:
            t1 = host_now()
            for item in requests:
                self._log.write("call", op="extend", key=item.key, hold=self._holds.get(item.token, "?"),
                                ttl=item.ttl, t0=t0, t1=t1, error=repr(error))
            raise
        t1 = host_now()
        for item, answer in zip(requests, answers):
            self._log.write("call", op="extend", key=item.key, hold=self._holds.get(item.token, "?"),
                            ttl=item.ttl, t0=t0, t1=t1, result=answer)
        return answers

    def is_held(self, key: str, token: str) -> bool:
        """Passed through."""
        return self.inner.is_held(key, token)

    def inspect(self, key: str) -> LockState:
        """Passed through."""
        return self.inner.inspect(key)

    def force_release(self, key: str) -> bool:
        """Logged ``force_release`` (the harness never calls it; a record would be a surprise)."""
        return self._call("force_release", key, "", None, lambda: self.inner.force_release(key))

    def close(self) -> None:
        """Closes the wrapped backend."""
        self._announcements.close()
        self.inner.close()

    def scan(self, prefix: str) -> Iterator[LockState]:
        """Passed through."""
        return self.inner.scan(prefix)

    def watch_releases(self, callback: Callable[[str], None]) -> ReleaseWatcher:
        """Passed through."""
        return self.inner.watch_releases(callback)

    def join_line(
        self, key: str, token: str, ttl: float, owner: str, fenced: bool, clock: Callable[[], float]
    ) -> Optional[WaitingLine]:
        """A line woken by the wrapped backend's release notifications, asking through this
        wrapper; none for a backend without them."""
        if not self.capabilities.release_notify:
            return None
        return AnnouncedLine(self._announcements, self, key, token, ttl, owner, fenced, clock)

    def check_key(self, key: str) -> None:
        """Passed through."""
        self.inner.check_key(key)

    def check_token(self, token: str) -> None:
        """Passed through."""
        self.inner.check_token(token)

    def request_id_scope(self, request_id: Optional[str]) -> ContextManager[None]:
        """Passed through."""
        return self.inner.request_id_scope(request_id)

    def new_token(self) -> str:
        """Passed through."""
        return self.inner.new_token()
