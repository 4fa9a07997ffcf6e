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
never queued may take a free key. A wake that is lost (its process died while first) costs the
others latency, never correctness: their waiters still try again by the retry delay and the
holder's lease end.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ...errors import BackendUnavailableError
from ..handoff import HandoffWatcher
from ._client import CODE_NOT_FOUND, EtcdClient, EtcdError, b64, prefix_end, unb64
from ._watch import RESERVED, WatchStream, lock_key

__all__ = ["QUEUE_KEEPALIVE", "QUEUE_MARK", "QUEUE_TTL", "EtcdHandoffWatcher", "queue_prefix"]

_log = logging.getLogger("lease_lock")

#: What follows the namespace in the name of every queue entry.
QUEUE_MARK = RESERVED + b"queue" + RESERVED
#: Seconds of the lease a watcher's queue entries ride on: how long a waiter that died while
#: first in line can hold the others' wakes back, at most (plus etcd's half-second expiry check).
QUEUE_TTL = 5
#: Seconds between the keep-alives of that lease.
QUEUE_KEEPALIVE = 1.0
# Lines (keys) read per snapshot transaction: two ranges each, below etcd's 128 operations.
_SNAPSHOT_BATCH = 50
_FIRST_RETRY = 0.05
_MAX_RETRY = 1.0


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
    held: bool = True
    #: A waiter here was woken (or told to try) for the key's current free spell.
    woken: bool = False
    #: Events that came before the first snapshot: (revision, is lock key, is put, name, create).
    backlog: list[tuple[int, bool, bool, bytes, int]] = field(default_factory=list)

    def settle(self, revision: int, entries: dict[bytes, int], held: bool, woken: bool) -> None:
        """Take the snapshot read at ``revision`` unless the state is as new already."""
        if revision <= self.seen:
            return
        self.base = self.seen = revision
        self.entries, self.held, self.woken = entries, held, woken
        backlog, self.backlog = self.backlog, []
        for event in backlog:
            self.apply(*event)

    def apply(self, revision: int, lock: bool, put: bool, name: bytes, create: int) -> None:
        """One event of the key or of its queue (several may share a revision: one transaction);
        one the snapshot already has is skipped."""
        if not self.base:
            self.backlog.append((revision, lock, put, name, create))
            return
        if revision <= self.base:
            return
        self.seen = max(self.seen, revision)
        if lock:
            self.held = put
            if put:
                self.woken = False
        elif put:
            self.entries.setdefault(name, create)
        else:
            self.entries.pop(name, None)

    def due(self) -> bool:
        """Whether a waiter here is to be woken now: the entry first, the key free, not woken."""
        if not self.base or self.held or self.woken:
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
        revision, entries, lease = self._read_snapshot(answer, 0)
        with self._mutex:
            # Free: the waiter tries at once on this answer, so no wake is due for this spell.
            line.settle(revision, entries, held=lease is not None, woken=lease is None)
        return 0.0 if lease is None else self._lease_left(lease)

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

    def close(self) -> None:
        """Stop both threads and revoke the lease, which takes this watcher's entries with it."""
        with self._mutex:
            self._stop.set()
            self._work.notify()
        super().close()
        if self._helper is not threading.current_thread():
            self._helper.join(5)
        with self._lease_mutex:
            lease, self._lease = self._lease, None
        if lease is not None:
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

    def _read_snapshot(self, answer: dict[str, Any], index: int) -> tuple[int, dict[bytes, int], Optional[str]]:
        """The revision, the queue's entries and the lock's lease (``None``: free) of the
        ``index``-th key of a snapshot transaction."""
        responses = [item for item in answer.get("responses", []) if "response_range" in item]
        queue = responses[2 * index]["response_range"].get("kvs", [])
        lock = responses[2 * index + 1]["response_range"].get("kvs", [])
        entries = {unb64(kv.get("key")): int(kv.get("create_revision") or 0) for kv in queue}
        lease = str(lock[0].get("lease") or "0") if lock else None
        return int(answer["header"]["revision"]), entries, lease

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
                        revision, entries, lease = self._read_snapshot(answer, index)
                        # What happened in the gap is not known: a release in it is due now.
                        line.settle(revision, entries, held=lease is not None, woken=False)
        self._next_revision = start + 1
        self._wake(keys)

    def _handle(self, events: list[dict[str, Any]]) -> None:
        queue = self._prefix + QUEUE_MARK
        touched: list[bytes] = []
        with self._mutex:
            for event in events:
                kv = event.get("kv", {})
                name = unb64(kv.get("key"))
                key = lock_key(self._prefix, name)
                is_lock = key is not None
                if key is None:
                    if not name.startswith(queue):
                        continue  # a rate counter of the empty namespace
                    key = name[len(queue):].partition(RESERVED)[0]
                line = self._lines.get(key)
                if line is None:
                    continue
                put = event.get("type") != "DELETE"  # etcd's JSON leaves out PUT, the default
                line.apply(int(kv.get("mod_revision") or 0), is_lock, put, name, int(kv.get("create_revision") or 0))
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
                while not (self._deletes or self._puts or self._stop.is_set()) and time.monotonic() < beat:
                    self._work.wait(beat - time.monotonic())
                if self._stop.is_set():
                    return
                deletes, puts = self._deletes, self._puts
                self._deletes, self._puts = [], []
            try:
                self._write(deletes, puts)
                if time.monotonic() >= beat:
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

    def _wanted(self, entry: bytes) -> bool:
        return any(line.entry == entry for line in self._lines.values())

    def _write(self, deletes: list[bytes], puts: list[bytes]) -> None:
        # One name at most once per transaction, or etcd refuses the whole of it.
        gone = [entry for entry in dict.fromkeys(deletes) if entry not in puts]
        if gone or puts:
            self._put_then(puts, [{"request_delete_range": {"key": b64(entry)}} for entry in gone])

    def _keep_alive(self) -> None:
        """Renew the lease; when etcd no longer has it, its entries are gone: put every line's
        entry again, at the back of its queue, on a new lease."""
        with self._lease_mutex:
            lease = self._lease
        if lease is None or self._client.keepalive([lease]).get(lease, 0) > 0:
            return
        self._lost_lease(lease)
        _log.debug("etcd hand-off lease %s ran out; queueing again", lease)
        with self._mutex:
            for line in self._lines.values():
                line.queued = False

    def _queue_again(self) -> None:
        """Queue again, at the back, every key still waited for whose entry is gone (taken by a
        grant to another waiter here, or with a lost lease)."""
        with self._mutex:
            for key, line in self._lines.items():
                if not line.queued:
                    self._to_the_back(key, line)
