"""Many auto-extended locks in one process: does every lease survive, and at what cost?

    python -m benchmarks.redis_heartbeat [--url redis://127.0.0.1:6379/0] [--locks 10000]
        [--ttl 3] [--seconds 15] [--peer-locks 500]

lease_lock: one ``Locker`` holds ``--locks`` locks with a ``--ttl`` lease for ``--seconds``
(several lease lengths), its single heartbeat thread extending them. Reported: locks lost (on
the Lock and checked on the server), the extension batches the heartbeat sent (one pipelined
``extend_many`` per batch), and the connections the client opened.

python-redis-lock (if installed): ``--peer-locks`` locks with ``auto_renewal=True`` and the same
lease, one renewal thread per lock, checked the same way. Peers are installed for the
benchmark only: ``pip install python-redis-lock``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import time
import uuid
from collections.abc import Sequence
from typing import Any

import redis
from lease_lock.backends.base import ExtendRequest
from lease_lock.backends.redis import RedisBackend
from lease_lock.locker import Locker

__all__ = ["main"]


class CountingBackend(RedisBackend):
    """A RedisBackend that records the size of every batch the heartbeat sends."""

    def __init__(self, client: Any) -> None:
        super().__init__(client)
        self.batches: list[int] = []
        self.singles = 0

    def extend_many(self, requests: Sequence[ExtendRequest]) -> list[bool]:
        """Record the batch, then extend as usual."""
        self.batches.append(len(requests))
        return super().extend_many(requests)

    def extend(self, key: str, token: str, ttl: float) -> bool:
        """Record a single extension, then extend as usual."""
        self.singles += 1
        return super().extend(key, token, ttl)


class _Count(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


def _connections(observer: Any, name: str) -> int:
    return sum(entry.get("name") == name for entry in observer.client_list())


def _held_on_server(client: Any, keys: list[str], owners: list[bytes]) -> int:
    """How many ``keys`` still hold a value starting with their owner's id, in one pipeline."""
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.get(key)
    return sum(
        isinstance(value, bytes) and value.startswith(owner)
        for value, owner in zip(pipe.execute(), owners)
    )


def run_lease_lock(url: str, count: int, ttl: float, seconds: float, observer: Any) -> None:
    """Hold ``count`` locks for ``seconds`` on one Locker and report what survived."""
    name = f"bench-hb-{uuid.uuid4().hex[:6]}"
    client = redis.Redis.from_url(url, client_name=name)
    backend = CountingBackend(client)
    late = _Count()
    logging.getLogger("lease_lock").addHandler(late)
    locker = Locker(backend, ttl=ttl, max_hold=seconds * 10)
    prefix = f"bench:hb:{uuid.uuid4().hex[:6]}"
    try:
        start = time.perf_counter()
        locks = [locker.acquire(f"{prefix}:{index}") for index in range(count)]
        acquired_in = time.perf_counter() - start
        time.sleep(seconds)
        lost_local = sum(lock.state != "held" for lock in locks)
        held_server = _held_on_server(
            client, [lock.key for lock in locks], [f"{lock.token}|".encode() for lock in locks]
        )
        connections = _connections(observer, name)
        batches = backend.batches
        print(f"\nlease_lock: {count} locks, ttl {ttl}s, held {seconds}s (acquired in {acquired_in:.1f}s)")
        print(f"  lost (Lock.state)          {lost_local}")
        print(f"  lost (checked on server)   {count - held_server}")
        print(f"  extension batches          {len(batches)} (+{backend.singles} single extends)")
        if batches:
            print(f"  batch size mean / max     {sum(batches) / len(batches):.0f} / {max(batches)}")
        print(f"  extensions sent            {sum(batches) + backend.singles}")
        print(f"  client connections         {connections}")
        print(f"  late-beat warnings         {late.count}")
    finally:
        locker.close()
        logging.getLogger("lease_lock").removeHandler(late)
        client.close()


def run_python_redis_lock(url: str, count: int, ttl: float, seconds: float, observer: Any) -> None:
    """The same with python-redis-lock's one-thread-per-lock renewal."""
    try:
        import redis_lock
    except ImportError:
        print("\npython-redis-lock: not installed")
        return
    name = f"bench-prl-{uuid.uuid4().hex[:6]}"
    client = redis.Redis.from_url(url, client_name=name)
    prefix = f"bench:prl:{uuid.uuid4().hex[:6]}"
    locks = []
    try:
        start = time.perf_counter()
        for index in range(count):
            lock = redis_lock.Lock(client, f"{prefix}:{index}", expire=int(ttl), auto_renewal=True)
            lock.acquire()
            locks.append(lock)
        acquired_in = time.perf_counter() - start
        time.sleep(seconds)
        keys = [f"lock:{prefix}:{index}" for index in range(count)]
        held = _held_on_server(client, keys, [lock.id.encode() for lock in locks])
        connections = _connections(observer, name)
        print(f"\npython-redis-lock: {count} locks, ttl {ttl}s, held {seconds}s (acquired in {acquired_in:.1f}s)")
        print(f"  lost (checked on server)   {count - held}")
        print(f"  client connections         {connections}")
    finally:
        for lock in locks:
            # A lost lock refuses its release; keep cleaning up the others.
            with contextlib.suppress(Exception):
                lock.release()
        client.close()


def main(argv: list[str] | None = None) -> None:
    """Run lease_lock, then the peer, and print their reports."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--locks", type=int, default=10_000)
    parser.add_argument("--ttl", type=float, default=3.0)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--peer-locks", type=int, default=500)
    args = parser.parse_args(argv)
    observer = redis.Redis.from_url(args.url)
    info = observer.info("server")
    print(f"redis-server {info['redis_version']} at {args.url}; redis-py {redis.__version__}")
    run_lease_lock(args.url, args.locks, args.ttl, args.seconds, observer)
    if args.peer_locks:
        run_python_redis_lock(args.url, args.peer_locks, args.ttl, args.seconds, observer)
    observer.close()


if __name__ == "__main__":
    main()
