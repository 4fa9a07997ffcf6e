"""Wake-one hand-off on etcd: waiting processes queue in etcd, and a release wakes the first.

While a process waits for ``key``, its watcher keeps an *entry* in the key's queue: the name
``namespace + NUL + "queue" + NUL + key + NUL + id`` (inside the namespace's range, so the
permissions a locker needs cover it; lock keys contain no NUL, so it is never a lock key), on an
etcd lease of the watcher's own that it keeps alive. A dead or frozen process's keep-alives stop
and its entries vanish with its lease. The queue's order is the entries' ``create_revision``.

Each watcher follows one watch stream over the whole namespace (every put and delete) and keeps,
for each key it waits for, the queue's entries and whether the key is held, from a snapshot read
when it queued plus the events after that snapshot. It wakes a waiter of its process when its
entry is first and the key is free, once per free spell: at the release, or when the entry ahead
of it goes while the key is free (its process left, died, or passed on a wake it did not use). A
process whose woken attempt lost to another (one that took the key straight back, or one that
never queued) stays first and is woken by the next release. So each release wakes one process,
and the others stay asleep.

The queue decides only who is woken, never who may take the key: the lock is still the single
key holding the token, taken by whichever attempt's transaction comes first, and a process that
never queued may take a free key.

A counting key (``limit`` > 1) is free while it has fewer places than its limit (each place's
value carries the limit): a place's end starts a free spell as the key's own release does, and
a grant that fills the last place ends it. A wake that is lost (its process died while first) costs the
others latency, never correctness: their waiters still try again by the retry delay and the
holder's lease end.

A woken attempt is one request, not two: the watcher keeps an etcd lease ready for each lease
length its waiters asked for lately (:meth:`EtcdHandoffWatcher.take_lease`), granted and kept
alive by its helper thread off the hand-off's path, so the attempt needs no lease grant of its
own before its transaction. Such a lease runs :data:`READY_MARGIN` seconds longer than the length
asked, and it is handed out only while that margin still covers the time since the request
that last found it alive was sent; so in etcd it runs at least the length asked from the moment
the attempt is made, as a lease granted by the attempt itself would.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Optional

from ...errors import BackendUnavailableError
from ..handoff import HandoffWatcher
from ._client import CODE_NOT_FOUND, EtcdClient, EtcdError, b64, prefix_end, unb64
from ._places import limit_of, places_range
from ._watch import RESERVED, WatchStream, counted_key, lock_key

__all__ = [
    "QUEUE_KEEPALIVE", "QUEUE_MARK", "QUEUE_TTL", "READY_MARGIN", "EtcdHandoffWatcher", "ReadyLease", "queue_prefix",
]

_log = logging.getLogger("lease_lock")

#: What follows the namespace in the name of every queue entry.
QUEUE_MARK = RESERVED + b"queue" + RESERVED
#: Seconds of the lease a watcher's queue entries ride on: how long a waiter that died while
#: first in line can hold the others' wakes back, at most (plus etcd's half-second expiry check).
QUEUE_TTL = 5
#: Seconds between the keep-alives of that lease.
QUEUE_KEEPALIVE = 1.0
# Lines (keys) read per snapshot transaction: three ranges each, below etcd's 128 operations.
_SNAPSHOT_BATCH = 40
_FIRST_RETRY = 0.05
_MAX_RETRY = 1.0
#: Seconds a lease kept ready runs beyond the length asked: the keep-alives come every
#: QUEUE_KEEPALIVE, so a lease refreshed on time is always within its margin.
READY_MARGIN = 2
# A length not asked for in this many seconds has no lease kept ready any more.
_READY_IDLE = 10.0
# At most this many lease lengths are kept ready at once (the most recently asked).
_READY_LENGTHS = 4


class ReadyLease(NamedTuple):
    """A lease kept ready for a waiter's attempt (see :meth:`EtcdHandoffWatcher.take_lease`)."""

    #: etcd's lease ID.
    lease: str
    #: The length asked for; etcd runs the lease READY_MARGIN seconds longer from each renewal.
    seconds: int
    #: ``time.monotonic()`` before the send of the grant or keep-alive that last found it alive.
    fresh: float


def queue_prefix(prefix: bytes, key: bytes) -> bytes:
    """The first bytes of every entry in the queue of lock key ``key`` under ``prefix``."""
    return prefix + QUEUE_MARK + key + RESERVED


@dataclass
class _Line:
    """The queue of one key this watcher waits for, as the watcher knows it."""

    #: This watcher's entry in the queue.
    entry: bytes
    #: Whether ``entry`` is in etcd or on its way (not after the grant that deleted it).
    queued: bool = True
    #: The revision of the snapshot the state starts from (0: none yet; events wait in
    #: ``backlog``): events up to it are in the snapshot already.
    base: int = 0
    #: The latest revision in the state (the snapshot's, or the latest event's).
    seen: int = 0
    #: The queue's entries -> their create_revision.
    entries: dict[bytes, int] = field(default_factory=dict)
    #: Whether the lock key exists (an exclusive holder).
    held: bool = True
    #: The places of a counting key -> the limit each was granted with.
    places: dict[bytes, int] = field(default_factory=dict)
    #: A waiter here was woken (or told to try) for the key's current free spell.
    woken: bool = False
    #: Events that came before the first snapshot: (revision, kind, is put, name, create, limit).
    backlog: list[tuple[int, str, bool, bytes, int, int]] = field(default_factory=list)

    @property
    def busy(self) -> bool:
        """Whether the key has no room: held by an exclusive holder, or every place taken."""
        return self.held or (bool(self.places) and len(self.places) >= max(self.places.values()))

    def settle(
        self, revision: int, entries: dict[bytes, int], held: bool, woken: bool, places: dict[bytes, int]
    ) -> None:
        """Take the snapshot read at ``revision`` unless the state is as new already."""
        if revision <= self.seen:
            return
        self.base = self.seen = revision
        self.entries, self.held, self.woken, self.places = entries, held, woken, places
        backlog, self.backlog = self.backlog, []
        for event in backlog:
            self.apply(*event)

    def apply(self, revision: int, kind: str, put: bool, name: bytes, create: int, limit: int) -> None:
        """One event of the key (``kind`` "lock"), of one of its places ("place", with the
        place's ``limit``) or of its queue ("queue"); several may share a revision (one
        transaction); one the snapshot already has is skipped."""
        if not self.base:
            self.backlog.append((revision, kind, put, name, create, limit))
            return
        if revision <= self.base:
            return
        self.seen = max(self.seen, revision)
        if kind == "lock":
            self.held = put
            if put:
                self.woken = False
        elif kind == "place":
            if put:
                self.places[name] = limit
                # A grant that took the last place: the next place's end is a new free spell.
                self.woken = self.woken and not self.busy
            else:
                self.places.pop(name, None)
        elif put:
            self.entries.setdefault(name, create)
        else:
            self.entries.pop(name, None)

    def due(self) -> bool:
        """Whether a waiter here is to be woken now: the entry first, the key free, not woken."""
        if not self.base or self.busy or self.woken:
            return False
        mine = self.entries.get(self.entry)
        return mine is not None and mine == min(self.entries.values())


class EtcdHandoffWatcher(WatchStream, HandoffWatcher):
    """Queue entries on a lease of this watcher's own, and one watch stream over the namespace
    that wakes ``callback(key)`` when this watcher's entry is first and the key is free.

    Two daemon threads: the stream's, which runs the callback, and a helper's, which keeps the
    lease alive and sends the queue's writes that nobody waits for (an entry given up, an entry
    moved to the back).
    """

    _thread_name = "lease-lock-etcd-handoff"

    def __init__(self, client: EtcdClient, prefix: bytes, callback: Callable[[str], bool]) -> None:
        super().__init__(client, prefix)
        self._callback = callback
        self._id = uuid.uuid4().hex[:16].encode()
        self._numbers = itertools.count()
        self._mutex = threading.Lock()
        self._lines: dict[bytes, _Line] = {}
        self._lease: Optional[str] = None
        self._lease_mutex = threading.Lock()
        #: Entries to delete and entries to put, for the helper thread.
        self._deletes: list[bytes] = []
        self._puts: list[bytes] = []
        #: Leases kept ready, by the length asked; when each length was last asked for; leases
        #: to revoke (stale, or of a length nobody asks for any more).
        self._ready: dict[int, list[ReadyLease]] = {}
        self._asked: dict[int, float] = {}
        self._retired: list[str] = []
        #: Lengths to make a lease ready for before the next keep-alive round.
        self._refill: set[int] = set()
        self._work = threading.Condition(self._mutex)
        self._helper = threading.Thread(target=self._help, name="lease-lock-etcd-queue", daemon=True)
        self._start()
        self._helper.start()

    # -- the HandoffWatcher interface ------------------------------------------------------------

    def want(self, key: str) -> Optional[float]:
        """Put an entry at the back of ``key``'s queue and read the queue and the key in the same
        transaction; the seconds left of the key's lease (``0.0``: free)."""
        name = key.encode()
        with self._mutex:
            if name in self._lines:
                return None
            line = self._lines[name] = _Line(self._new_entry(name))
        try:
            answer = self._snapshot_txn([name], [line.entry])
        except BaseException:
            with self._mutex:
                if self._lines.get(name) is line:
                    del self._lines[name]
                    self._drop(line.entry)
            raise
        revision, entries, lease, places = self._read_snapshot(answer, 0)
        with self._mutex:
            line.settle(revision, entries, held=lease is not None, woken=False, places=places)
            # Free: the waiter tries at once on this answer, so no wake is due for this spell.
            line.woken = not line.busy
            first = lease if lease is not None else self._first_lease(answer, 0) if line.busy else None
        return 0.0 if first is None else self._lease_left(first)

    def unwant(self, key: str) -> None:
        """Leave ``key``'s queue; a free key's turn passes to the next entry as this one goes."""
        with self._mutex:
            line = self._lines.pop(key.encode(), None)
            if line is not None and line.queued:
                self._drop(line.entry)

    def requeue(self, key: str) -> None:
        """Pass a wake nobody here used on: this watcher's entry moves to the back of the queue
        (when it still waits for the key; else its entry is going already)."""
        with self._mutex:
            line = self._lines.get(key.encode())
            if line is not None:
                self._to_the_back(key.encode(), line)

    def entry_for(self, key: str) -> Optional[bytes]:
        """This watcher's queue entry for ``key`` while a waiter here is queued for it: an
        attempt at the key deletes it in the transaction that takes the key, so that the next
        entry is first as the key is taken, without a write of its own (see :meth:`granted`)."""
        with self._mutex:
            line = self._lines.get(key.encode())
            return line.entry if line is not None and line.queued else None

    def granted(self, key: str, entry: bytes) -> None:
        """The attempt that deleted ``entry`` took ``key``. The waiter that made it leaves the
        queue next (nothing more to delete); another waiter here for the key, if any, queues
        again at the back within a keep-alive period."""
        with self._mutex:
            line = self._lines.get(key.encode())
            if line is not None and line.entry == entry:
                line.queued = False

    def take_lease(self, seconds: int) -> Optional[ReadyLease]:
        """A lease kept ready for an attempt of a waiter here that asks for ``seconds``: etcd
        runs it at least ``seconds`` from now, so the attempt needs no grant of its own. ``None``
        when none is ready; the length is noted either way, and the helper keeps one ready for
        it from then on. The lease is the caller's: it goes back with :meth:`keep_lease` when
        the attempt put no key on it, and is never handed out twice."""
        now = time.monotonic()
        with self._mutex:
            # Not granted at once when none is ready: this attempt is in flight, and the helper's
            # grant would compete with it. The next keep-alive round makes one ready.
            self._want_length(seconds, now)
            ready = self._ready.get(seconds, [])
            while ready:
                lease = ready.pop()
                # The lease ends in etcd no sooner than `seconds + READY_MARGIN` after `fresh`.
                if now <= lease.fresh + READY_MARGIN:
                    return lease
                self._retired.append(lease.lease)
        return None

    def expect_lease(self, seconds: int) -> None:
        """A waiter here is about to wait for a key with leases of ``seconds``: keep one ready
        for its woken attempt."""
        with self._mutex:
            self._want_length(seconds, time.monotonic())
            # The waiter sleeps now: the helper's grant competes with nothing of it.
            self._refill.add(seconds)
            self._work.notify()

    def keep_lease(self, lease: ReadyLease) -> None:
        """Take back a lease from :meth:`take_lease` that holds no key (the attempt lost)."""
        with self._mutex:
            if self._stop.is_set():
                self._retired.append(lease.lease)
            else:
                self._ready.setdefault(lease.seconds, []).append(lease)

    def close(self) -> None:
        """Stop both threads and revoke the leases, the queue's (which takes this watcher's
        entries with it) and the ones kept ready."""
        with self._mutex:
            self._stop.set()
            self._work.notify()
        super().close()
        if self._helper is not threading.current_thread():
            self._helper.join(5)
        with self._lease_mutex:
            lease, self._lease = self._lease, None
        with self._mutex:
            leases = [lease, *self._retired, *(item.lease for ready in self._ready.values() for item in ready)]
            self._ready, self._retired = {}, []
        self._revoke([item for item in leases if item is not None])

    def _revoke(self, leases: list[str]) -> None:
        # Best effort: a lease left behind runs out by itself.
        for lease in leases:
            with contextlib.suppress(BackendUnavailableError, EtcdError):
                self._client.call("/v3/lease/revoke", {"ID": lease})

    # -- store requests ----------------------------------------------------------------------

    def _new_entry(self, key: bytes) -> bytes:
        return queue_prefix(self._prefix, key) + self._id + b"-%d" % next(self._numbers)

    def _drop(self, entry: bytes) -> None:
        """Have the helper delete ``entry`` (under the mutex); one whose put is still pending is
        simply not put (a transaction may not both put and delete one name)."""
        if entry in self._puts:
            self._puts.remove(entry)
        else:
            self._deletes.append(entry)
        self._work.notify()

    def _to_the_back(self, key: bytes, line: _Line) -> None:
        """Give ``line`` a new entry, at the back of its queue (under the mutex)."""
        if line.queued:
            self._drop(line.entry)
        line.entry, line.queued, line.woken = self._new_entry(key), True, False
        self._puts.append(line.entry)
        self._work.notify()

    def _lease_id(self) -> str:
        """The lease of this watcher's entries, granted on first need."""
        with self._lease_mutex:
            if self._lease is None:
                self._lease = str(self._client.call("/v3/lease/grant", {"TTL": QUEUE_TTL})["ID"])
            return self._lease

    def _snapshot_txn(self, keys: list[bytes], puts: list[bytes]) -> dict[str, Any]:
        """One transaction: put ``puts`` on the lease, then read the queue and the lock of each
        of ``keys`` (two ranges per key, after the puts). A lease etcd no longer has (it ran
        out while this process was paused) is replaced once."""
        reads: list[dict[str, Any]] = []
        for key in keys:
            start = queue_prefix(self._prefix, key)
            reads.append({"request_range": {"key": b64(start), "range_end": b64(prefix_end(start)), "keys_only": True}})
            reads.append({"request_range": {"key": b64(self._prefix + key), "keys_only": True}})
            reads.append(places_range(self._prefix, key))
        try:
            return self._put_then(puts, reads)
        except EtcdError as error:
            if error.code != CODE_NOT_FOUND or not puts:
                raise
        return self._put_then(puts, reads)

    def _put_then(self, puts: list[bytes], operations: list[dict[str, Any]]) -> dict[str, Any]:
        """A transaction of the puts of ``puts`` on the lease, then ``operations``; a lease
        etcd says it no longer has is forgotten (the next call grants another)."""
        lease = self._lease_id() if puts else None
        writes = [{"request_put": {"key": b64(entry), "value": "", "lease": lease}} for entry in puts]
        try:
            return self._client.call("/v3/kv/txn", {"compare": [], "success": writes + operations, "failure": []})
        except EtcdError as error:
            if error.code == CODE_NOT_FOUND:
                self._lost_lease(lease)
            raise

    def _read_snapshot(
        self, answer: dict[str, Any], index: int
    ) -> tuple[int, dict[bytes, int], Optional[str], dict[bytes, int]]:
        """The revision, the queue's entries, the lock's lease (``None``: no lock key) and the
        places (each with its limit) of the ``index``-th key of a snapshot transaction."""
        responses = [item for item in answer.get("responses", []) if "response_range" in item]
        queue = responses[3 * index]["response_range"].get("kvs", [])
        lock = responses[3 * index + 1]["response_range"].get("kvs", [])
        places = responses[3 * index + 2]["response_range"].get("kvs", [])
        entries = {unb64(kv.get("key")): int(kv.get("create_revision") or 0) for kv in queue}
        lease = str(lock[0].get("lease") or "0") if lock else None
        return int(answer["header"]["revision"]), entries, lease, {unb64(kv.get("key")): limit_of(kv) for kv in places}

    def _first_lease(self, answer: dict[str, Any], index: int) -> Optional[str]:
        """The lease of the oldest place of the ``index``-th key of a snapshot transaction."""
        responses = [item for item in answer.get("responses", []) if "response_range" in item]
        places = responses[3 * index + 2]["response_range"].get("kvs", [])
        oldest = min(places, key=lambda kv: int(kv.get("create_revision") or 0), default=None)
        return None if oldest is None else str(oldest.get("lease") or "0")

    def _want_length(self, seconds: int, now: float) -> None:
        """Note that a waiter here asked for leases of ``seconds`` (under the mutex); the
        lengths asked longest ago beyond the bound are dropped."""
        self._asked.pop(seconds, None)
        self._asked[seconds] = now
        while len(self._asked) > _READY_LENGTHS:
            self._drop_length(next(iter(self._asked)))

    def _drop_length(self, seconds: int) -> None:
        """Keep no lease ready for ``seconds`` any more (under the mutex)."""
        del self._asked[seconds]
        self._refill.discard(seconds)
        self._retired += [item.lease for item in self._ready.pop(seconds, [])]
        self._work.notify()

    def _short(self) -> list[int]:
        """The lengths asked for lately that have no lease ready (under the mutex)."""
        return [seconds for seconds in self._asked if not self._ready.get(seconds)]

    def _lease_left(self, lease: str) -> float:
        if lease == "0":
            return float("inf")  # a key without a lease ends only by a release
        answer = self._client.call("/v3/lease/timetolive", {"ID": lease})
        return float(max(0, int(answer.get("TTL") or 0)))

    def _lost_lease(self, lease: Optional[str]) -> None:
        """The lease is gone (its keep-alives came too late): a new one for the next puts."""
        with self._lease_mutex:
            if self._lease == lease:
                self._lease = None

    # -- the stream's thread -----------------------------------------------------------------

    def _prepare(self) -> None:
        """Before a stream that cannot resume (the first, or after a compaction): read every
        line again, and start the stream after a revision read before the lines were listed,
        so that no event a line's snapshot lacks is missed."""
        if self._next_revision:
            return
        empty = self._client.call("/v3/kv/txn", {"compare": [], "success": [], "failure": []})
        start = int(empty["header"]["revision"])
        with self._mutex:
            keys = list(self._lines)
        for batch in range(0, len(keys), _SNAPSHOT_BATCH):
            chunk = keys[batch:batch + _SNAPSHOT_BATCH]
            answer = self._snapshot_txn(chunk, [])
            with self._mutex:
                for index, key in enumerate(chunk):
                    line = self._lines.get(key)
                    if line is not None:
                        revision, entries, lease, places = self._read_snapshot(answer, index)
                        # What happened in the gap is not known: a release in it is due now.
                        line.settle(revision, entries, held=lease is not None, woken=False, places=places)
        self._next_revision = start + 1
        self._wake(keys)

    def _handle(self, events: list[dict[str, Any]]) -> None:
        queue = self._prefix + QUEUE_MARK
        touched: list[bytes] = []
        with self._mutex:
            for event in events:
                kv = event.get("kv", {})
                name = unb64(kv.get("key"))
                put = event.get("type") != "DELETE"  # etcd's JSON leaves out PUT, the default
                key, kind, limit = lock_key(self._prefix, name), "lock", 0
                if key is None:
                    key, kind = counted_key(self._prefix, name), "place"
                    limit = limit_of(kv) if key is not None and put else 0
                if key is None:
                    if not name.startswith(queue):
                        continue  # a place in a direct line, or a rate counter of the empty namespace
                    key, kind = name[len(queue):].partition(RESERVED)[0], "queue"
                line = self._lines.get(key)
                if line is None:
                    continue
                line.apply(
                    int(kv.get("mod_revision") or 0), kind, put, name, int(kv.get("create_revision") or 0), limit
                )
                touched.append(key)
        self._wake(touched)

    def _wake(self, keys: list[bytes]) -> None:
        """Wake a waiter here for each of ``keys`` whose line is due; a wake nobody here takes
        is passed on."""
        with self._mutex:
            due = [key for key in dict.fromkeys(keys) if key in self._lines and self._lines[key].due()]
            for key in due:
                self._lines[key].woken = True
        for key in due:
            text = key.decode("utf-8", "replace")
            try:
                taken = self._callback(text)
            except Exception:  # noqa: BLE001 - one lost wake is better than a dead stream
                _log.exception("hand-off callback raised")
                taken = False
            if not taken:
                self.requeue(text)

    # -- the helper's thread -----------------------------------------------------------------

    def _help(self) -> None:
        """Send the queue's pending writes as they come, and keep the lease alive."""
        delay = _FIRST_RETRY
        beat = time.monotonic() + QUEUE_KEEPALIVE
        while True:
            with self._mutex:
                while not self._helper_due() and time.monotonic() < beat:
                    self._work.wait(beat - time.monotonic())
                if self._stop.is_set():
                    return
                deletes, puts, retired = self._deletes, self._puts, self._retired
                self._deletes, self._puts, self._retired = [], [], []
                beating = time.monotonic() >= beat
                short = self._short() if beating else [item for item in self._short() if item in self._refill]
                self._refill.clear()
            try:
                self._write(deletes, puts)
                self._make_ready(short)
                if beating:
                    self._keep_alive()
                    self._queue_again()
                    beat = time.monotonic() + QUEUE_KEEPALIVE
                delay = _FIRST_RETRY
            except Exception as error:  # noqa: BLE001 - the helper must outlive any failure
                _log.debug("etcd hand-off queue write failed: %s", error)
                with self._mutex:
                    # Deletes are safe to repeat, and so are puts of entries still wanted.
                    self._deletes[:0] = deletes
                    self._puts[:0] = [entry for entry in puts if self._wanted(entry)]
                self._stop.wait(delay)
                delay = min(delay * 2, _MAX_RETRY)
            # Best effort, once: a lease left behind runs out by itself.
            self._revoke(retired)

    def _helper_due(self) -> bool:
        """Whether the helper has work before its next keep-alive (under the mutex)."""
        return bool(self._deletes or self._puts or self._retired or self._refill or self._stop.is_set())

    def _make_ready(self, lengths: list[int]) -> None:
        """Grant a lease for each of ``lengths``, READY_MARGIN seconds longer, kept ready."""
        for seconds in lengths:
            sent = time.monotonic()
            answer = self._client.call("/v3/lease/grant", {"TTL": seconds + READY_MARGIN})
            lease = ReadyLease(str(answer["ID"]), seconds, sent)
            with self._mutex:
                closed = self._stop.is_set()
                if not closed:
                    self._ready.setdefault(seconds, []).append(lease)
            if closed:
                self._revoke([lease.lease])

    def _wanted(self, entry: bytes) -> bool:
        return any(line.entry == entry for line in self._lines.values())

    def _write(self, deletes: list[bytes], puts: list[bytes]) -> None:
        # One name at most once per transaction, or etcd refuses the whole of it.
        gone = [entry for entry in dict.fromkeys(deletes) if entry not in puts]
        if gone or puts:
            self._put_then(puts, [{"request_delete_range": {"key": b64(entry)}} for entry in gone])

    def _keep_alive(self) -> None:
        """Renew the queue's lease and the leases kept ready, in one request (a length nobody
        asked for lately loses its lease first). When etcd no longer has the queue's lease, its
        entries are gone: put every line's entry again, at the back of its queue, on a new lease."""
        with self._lease_mutex:
            lease = self._lease
        now = time.monotonic()
        with self._mutex:
            for seconds in [item for item, asked in self._asked.items() if now - asked > _READY_IDLE]:
                self._drop_length(seconds)
            ready = [item.lease for items in self._ready.values() for item in items]
        leases = ([lease] if lease is not None else []) + ready
        if not leases:
            return
        left = self._client.keepalive(leases)
        self._refresh_ready(left, now)
        if lease is None or left.get(lease, 0) > 0:
            return
        self._lost_lease(lease)
        _log.debug("etcd hand-off lease %s ran out; queueing again", lease)
        with self._mutex:
            for line in self._lines.values():
                line.queued = False

    def _refresh_ready(self, left: dict[str, int], sent: float) -> None:
        """After a keep-alive sent at ``sent``: the ready leases it found alive are fresh from
        then; the ones etcd no longer has are forgotten. A lease taken meanwhile keeps the
        time it was handed out with (an earlier one, which is on the safe side)."""
        with self._mutex:
            for seconds, items in self._ready.items():
                self._ready[seconds] = [
                    ReadyLease(item.lease, seconds, max(item.fresh, sent)) if item.lease in left else item
                    for item in items
                    if left.get(item.lease, 1) > 0
                ]

    def _queue_again(self) -> None:
        """Queue again, at the back, every key still waited for whose entry is gone (taken by a
        grant to another waiter here, or with a lost lease)."""
        with self._mutex:
            for key, line in self._lines.items():
                if not line.queued:
                    self._to_the_back(key, line)
