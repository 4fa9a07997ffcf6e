"""A ``Locker`` dropped without ``close()`` frees its heartbeat thread and its connection, with a
``ResourceWarning`` like an unclosed file (a held lock dropped before it warns with a
``DroppedLockWarning``).

Regression: 50 dropped SQLite lockers left 50 heartbeat threads and 101 file descriptors behind
(threads 1 -> 51, fds 6 -> 107), for ever.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
import warnings
import weakref
from collections.abc import Iterator
from pathlib import Path

from lease_lock import DroppedLockWarning, Locker, MemoryBackend, connect
from lease_lock.testing import wait_until

DROPPED = 50
DEADLINE = 30.0


@contextlib.contextmanager
def resource_warnings() -> Iterator[list[str]]:
    """Collect the ResourceWarning and DroppedLockWarning messages raised inside the block (from
    any thread), in order."""
    kinds = (ResourceWarning, DroppedLockWarning)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        messages: list[str] = []
        yield messages
    messages.extend(str(item.message) for item in caught if issubclass(item.category, kinds))


def _fds_under(directory: Path) -> int:
    """Descriptors of this process open on files below ``directory``.

    Counted by what they point at, not by number: descriptors that earlier tests left to the
    garbage collector may close meanwhile, which a plain count would read as this test's doing.
    """
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed between the listing and the read
            continue
        count += target.startswith(str(directory))
    return count


def _drop_lockers(url: str, count: int) -> list[weakref.ref[Locker]]:
    refs = []
    for number in range(count):
        locker = connect(url)
        lock = locker.acquire(f"k{number}")  # starts the heartbeat thread
        lock.release()
        refs.append(weakref.ref(locker))
        del lock, locker
    return refs


def test_dropped_sqlite_lockers_return_threads_and_fds_to_baseline(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'locks.db'}"
    connect(url).close()  # the file exists from here on, as in a running system
    gc.collect()
    threads, fds = set(threading.enumerate()), _fds_under(tmp_path)
    with resource_warnings() as messages:
        refs = _drop_lockers(url, DROPPED)
        gc.collect()
        assert wait_until(lambda: all(ref() is None for ref in refs), DEADLINE)
    assert len(messages) == DROPPED
    assert all(message.startswith("unclosed <Locker SqliteBackend") for message in messages)
    # Only the threads this test started count: others of earlier tests may end meanwhile.
    assert wait_until(lambda: not set(threading.enumerate()) - threads, DEADLINE), threading.enumerate()
    gc.collect()
    assert _fds_under(tmp_path) == fds == 0


def test_a_dropped_locker_with_a_held_lock_stops_extending_it() -> None:
    backend = MemoryBackend()
    locker = Locker(backend, ttl=5.0)
    with resource_warnings() as messages:
        # The lock object is dropped at once: nothing can read it any more. The locker goes next.
        locker.acquire("k")
        heartbeat = locker._heartbeat
        thread = heartbeat.thread
        assert thread is not None
        ref = weakref.ref(locker)
        del locker
        gc.collect()
        assert wait_until(lambda: ref() is None, DEADLINE)
    assert len(messages) == 2
    assert messages[0].startswith("the Lock on 'k' that Locker.acquire() returned was dropped while held")
    assert messages[1].startswith("unclosed <Locker MemoryBackend")
    thread.join(DEADLINE)
    assert not thread.is_alive()
    assert heartbeat.pending() == 0
    # Nobody extends the lease any more, and the stopping heartbeat gave the dropped one back.
    assert not backend.inspect("k").held


def test_the_heartbeat_thread_does_not_keep_its_locker_alive() -> None:
    locker = Locker(MemoryBackend())
    lock = locker.acquire("k")
    lock.release()
    ref = weakref.ref(locker)
    with resource_warnings() as messages:
        del lock, locker
        gc.collect()
        assert wait_until(lambda: ref() is None, DEADLINE)
    assert len(messages) == 1


def test_closed_and_idle_lockers_do_not_warn(tmp_path: Path) -> None:
    with resource_warnings() as messages:
        with connect(f"sqlite:///{tmp_path / 'locks.db'}") as locker:
            locker.acquire("k").release()
        closed = connect("memory://")
        closed.close()
        # A locker that never opened anything has nothing to free and nothing to report.
        idle = Locker(MemoryBackend())
        del locker, closed, idle
        gc.collect()
    assert messages == []
