"""The wait extension: a request may ask the server to hold it until a key is free.

A client sends ``Prefer: wait=N`` (RFC 7240; ``N`` in whole seconds, or to the millisecond as
this server announces with ``X-Lease-Lock-Wait-Step``) on ``GET /locks/{key}`` or on an
acquisition. When the key is held, the server keeps the request for up to ``N`` seconds (at most its own
``max_wait``), until the store reports the key released or the holder's lease and grace run out,
whichever comes first, and answers as usual, with ``Preference-Applied: wait=N``. A read reads the
key again at each wake-up; an acquisition tries the grant itself, so that a release becomes its
grant in one store round trip, and its answer says how long it was held
(``X-Lease-Lock-Waited``). The waiting is driven by the store's release notifications when
it has them (memory, Redis, PostgreSQL, etcd); otherwise the request looks again every quarter second
until the holder's lease would end. A release made through the same process wakes its waiter at
once, without waiting for the store's notification.

On a store that offers a waiting line (:meth:`~lease_lock.backends.base.Backend.join_line`), a
waiting acquisition takes a place in the key's line instead (:meth:`WaitRoom.wait_in_line`):
the release hands it the key in the same atomic step as it drops its own lease, so the request
wakes up holding the key, with no store round trip between the release and its grant.

A waiting request is one request for the budgets, however long it waits. Each process lets at
most ``max_waits`` requests wait at once (``serve`` defaults to half its threads), so waiters
cannot take every thread; beyond that a request is answered at once, without the preference.
Every answer announces the extension with ``X-Lease-Lock-Wait: <max_wait>``; clients that do not
know it (the official SDKs) never send the preference and see no difference.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from typing import Callable, Generic, Optional, TypeVar

from ..backends.base import Backend, LineGrant, WaitingLine
from ..backends.line import Announcements

__all__ = ["WAIT_STEP", "InLine", "WaitRoom", "parse_wait_preference"]

_Claimed = TypeVar("_Claimed")

#: The finest wait a ``Prefer: wait=N`` may ask for, in seconds (announced to clients).
WAIT_STEP = 0.001
# Whole seconds (at most nine digits), or seconds with up to three decimals.
_WAIT_SECONDS = re.compile(r"[0-9]{1,9}(?:\.[0-9]{1,3})?")
# Without a flowing notification stream the store is read again this often while waiting.
_UNNOTIFIED_SLICE = 0.25
# A waiting request whose client can be watched looks this often whether the client left.
_GONE_SLICE = 0.25


def parse_wait_preference(header: Optional[str]) -> Optional[float]:
    """The seconds of a ``wait=N`` preference in a ``Prefer`` header, or ``None``.

    ``N`` is whole seconds (RFC 7240) or, as an extension this server announces with
    ``X-Lease-Lock-Wait-Step: 0.001``, seconds with up to three decimals (``wait=0.25``), so
    that a client can keep one acquisition waiting for exactly the pause it would otherwise
    sleep. Preferences are hints (RFC 7240): a malformed one is ignored rather than refused.
    """
    if not header:
        return None
    for preference in header.split(","):
        name, _, value = preference.split(";", 1)[0].strip().partition("=")
        if name.strip().lower() == "wait":
            value = value.strip().strip('"')
            return float(value) if _WAIT_SECONDS.fullmatch(value) else None
    return None


class _Waiter:
    """One waiting request: its wake-up event and where it is (both under the room's mutex).

    ``asleep`` while it waits on ``wake``; ``poked`` when a release through this process came
    while it was awake, so that it reads the store again before sleeping; ``woken_here`` when
    such a release set ``wake`` itself (the store did not).
    """

    __slots__ = ("asleep", "poked", "wake", "woken_here")

    def __init__(self, wake: threading.Event) -> None:
        self.wake = wake
        self.asleep = False
        self.poked = False
        self.woken_here = False


@dataclass(frozen=True)
class InLine(Generic[_Claimed]):
    """What a wait in the store's line came to: the grant claimed, or ``None`` when the wait
    ended (or its client left) without one."""

    claimed: Optional[_Claimed]


class WaitRoom:
    """Holds waiting requests of one server process, at most ``max_waits`` at a time."""

    def __init__(self, backend: Backend, *, max_waits: int, max_wait: float) -> None:
        self.max_waits = max_waits
        self.max_wait = max_wait
        self._slots = threading.BoundedSemaphore(max_waits) if max_waits > 0 else None
        self._dispatcher = Announcements(backend) if backend.capabilities.release_notify else None
        self._mutex = threading.Lock()
        self._waiting = 0
        # store key -> the requests waiting for it here, oldest first.
        self._local: dict[str, list[_Waiter]] = {}

    @property
    def waiting(self) -> int:
        """Requests waiting right now (for the metrics)."""
        return self._waiting

    def wait_until_free(
        self,
        store_key: str,
        held_for: Callable[[], Optional[float]],
        seconds: float,
        *,
        takes: bool = True,
        gone: Optional[Callable[[], bool]] = None,
    ) -> Optional[bool]:
        """Wait up to ``seconds`` until ``store_key`` looks free.

        ``held_for`` reads the store: ``None`` when the key is free, else the seconds until
        another token may take it. ``takes`` says whether ``held_for`` takes the key when it
        finds it free (an acquisition) or only reads it (a read): a store that wakes one waiting
        process per release woke this one for a key it does not take, so a read hands that
        wake on to the next waiter, here or in another process. Returns ``None`` when no
        waiting slot was free (the caller answers at once, without the preference), else
        whether the key was seen free.

        ``gone`` (when the server can tell) says whether the client closed its connection: a
        request nobody will read stops waiting within a quarter second and is never handed
        the key (``held_for`` is not called for it again), so the key stays free for the
        next taker; a wake-one store's wake goes on to the next waiter.
        """
        if self._slots is None or not self._slots.acquire(blocking=False):
            return None
        # Registered before the first read, so a release between the read and the wait is seen.
        try:
            wake = self._dispatcher.register(store_key) if self._dispatcher is not None else threading.Event()
        except BaseException:
            self._slots.release()  # the store could not be watched: the slot is free again
            raise
        waiter = _Waiter(wake)
        with self._mutex:
            self._waiting += 1
            self._local.setdefault(store_key, []).append(waiter)
        try:
            deadline = time.monotonic() + min(seconds, self.max_wait)
            woken_by_store = False
            while True:
                if gone is not None and gone():
                    if woken_by_store:
                        wake.set()  # left set, the unregister below hands the wake on
                    return False
                remaining = held_for()
                if remaining is None:
                    if woken_by_store and not takes:
                        wake.set()  # left set, the unregister below hands the wake on
                    return True
                left = min(deadline - time.monotonic(), remaining + 0.001)
                if left <= 0:
                    return False
                with self._mutex:
                    if waiter.poked:
                        # Released here while this request was reading: read again at once.
                        waiter.poked = False
                        continue
                    waiter.asleep = True
                notified = self._dispatcher is not None and self._dispatcher.active
                woken = self._sleep(wake, left if notified else min(left, _UNNOTIFIED_SLICE), gone)
                with self._mutex:
                    woken_by_store = woken and not waiter.woken_here
                    waiter.asleep = waiter.woken_here = False
                    wake.clear()
        finally:
            if self._dispatcher is not None:
                self._dispatcher.unregister(store_key, wake)
            with self._mutex:
                waiters = self._local[store_key]
                waiters.remove(waiter)
                if not waiters:
                    del self._local[store_key]
                self._waiting -= 1
            self._slots.release()

    def wait_in_line(
        self,
        join: Callable[[], Optional[WaitingLine]],
        claim: Callable[[LineGrant], Optional[_Claimed]],
        seconds: float,
        lease: float,
        *,
        gone: Optional[Callable[[], bool]] = None,
        expires_in: Optional[float] = None,
    ) -> Optional[InLine[_Claimed]]:
        """Wait up to ``seconds`` in the store's line of a key for a grant, and ``claim`` it.

        ``join`` takes a place in the line for a lease of ``lease`` seconds (``None`` when the
        store has none to give); ``claim`` turns a grant into the answer's (``None`` when it
        was lost before). A release hands the key to the first place in line in the same
        atomic step, so the waiting request wakes up holding it, without another request to
        the store. The place is asked for the key once more when ``expires_in`` (the holder's
        lease) has passed and when the wait ends, so that a lease that ran out, which hands
        nothing over, is noticed as the notified wait notices it.

        Returns ``None`` when no waiting slot was free or the store gave no place (the
        caller waits as :meth:`wait_until_free` does, or answers at once). A request whose
        client left stops within a quarter second, and a key handed to it is released to the
        next in line.
        """
        if self._slots is None or not self._slots.acquire(blocking=False):
            return None
        try:
            line = join()
            if line is None:
                return None
            with self._mutex:
                self._waiting += 1
            try:
                return InLine(self._in_line(line, claim, seconds, lease, gone, expires_in))
            finally:
                with self._mutex:
                    self._waiting -= 1
        finally:
            self._slots.release()

    def _in_line(
        self,
        line: WaitingLine,
        claim: Callable[[LineGrant], Optional[_Claimed]],
        seconds: float,
        lease: float,
        gone: Optional[Callable[[], bool]],
        expires_in: Optional[float],
    ) -> Optional[_Claimed]:
        claimed: Optional[_Claimed] = None
        try:
            now = time.monotonic()
            deadline = now + min(seconds, self.max_wait)
            # When the place asks for the key by itself: at the holder's expiry, then at the end.
            ask_at = deadline if expires_in is None else min(deadline, now + expires_in + 0.001)
            while claimed is None:
                if gone is not None and gone():
                    return None
                left = ask_at - time.monotonic()
                if left > 0:
                    grant = line.wait(left if gone is None else min(left, _GONE_SLICE))
                else:
                    sent = time.monotonic()
                    fence = line.ask()
                    grant = None if fence is None else LineGrant(fence, sent, lease, False)
                    if grant is None and ask_at >= deadline:
                        return None
                    ask_at = deadline
                if grant is not None and not (gone is not None and gone()):
                    claimed = claim(grant)
            return claimed
        finally:
            line.leave(claimed is not None)

    @staticmethod
    def _sleep(wake: threading.Event, seconds: float, gone: Optional[Callable[[], bool]]) -> bool:
        """Wait for ``wake`` up to ``seconds``; early, unwoken, once ``gone()`` says so."""
        if gone is None:
            return wake.wait(seconds)
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            if wake.wait(min(max(left, 0.0), _GONE_SLICE)):
                return True
            if left <= _GONE_SLICE or gone():
                return False

    def released(self, store_key: str) -> None:
        """A release of ``store_key`` made through this process: wake its longest-waiting request
        here at once, without waiting for the store's notification (which every process hears,
        a store round trip and a thread later; or never, for a store without notifications)."""
        with self._mutex:
            for waiter in self._local.get(store_key, ()):
                if waiter.poked or waiter.wake.is_set():
                    continue  # woken already: the next one gets this release
                if waiter.asleep:
                    waiter.woken_here = True
                    waiter.wake.set()
                else:
                    # Awake and reading the store: not through the store's event, which the
                    # dispatcher would take, once the request leaves with its grant, for a
                    # store wake-up left unused and send on (a round trip before the answer).
                    waiter.poked = True
                return

    def close(self) -> None:
        """Stop the release notifications."""
        if self._dispatcher is not None:
            self._dispatcher.close()
