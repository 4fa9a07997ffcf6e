"""One member of a mixed fleet: takes a lock with the original library or with a shim.

Run as ``python -m tests.compat.fleet_worker ROLE LIBRARY IMPL URL NAME [COUNT]``:

- ``LIBRARY`` is ``redis_py`` or ``redis_lock``; ``IMPL`` is ``real`` (the pip package) or
  ``shim`` (lease_lock.compat).
- ``ROLE`` ``loop``: take and give back the lock COUNT times; inside, count the holders with
  ``INCR``/``DECR`` on ``<NAME>:inside`` and record any overlap in ``<NAME>:overlaps``.
- ``ROLE`` ``wait``: print ``waiting``, block in ``acquire()`` (python-redis-lock: no expiry and
  no timeout, so only a wake-up signal can end the wait), print ``acquired <time.time()>``,
  release.
- ``ROLE`` ``hold``: take the lock, print ``held``, give it back when a line arrives on stdin.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import redis


def make_lock(library: str, impl: str, client: Any, name: str) -> Any:
    """A lock on ``name`` from the chosen library and implementation."""
    if library == "redis_py":
        if impl == "real":
            return client.lock(name, sleep=0.02, blocking_timeout=60)
        from lease_lock.compat.redis_py import Lock

        return client.lock(name, lock_class=Lock, sleep=0.02, blocking_timeout=60)
    if impl == "real":
        import redis_lock

        return redis_lock.Lock(client, name)
    from lease_lock.compat import redis_lock as shim

    return shim.Lock(client, name)


def main(argv: list[str]) -> int:
    role, library, impl, url, name = argv[:5]
    client = redis.Redis.from_url(url)
    if role == "loop":
        for _ in range(int(argv[5])):
            lock = make_lock(library, impl, client, name)
            assert lock.acquire()
            if client.incr(f"{name}:inside") != 1:
                client.incr(f"{name}:overlaps")
            time.sleep(0.001)
            client.decr(f"{name}:inside")
            client.incr(f"{name}:total")
            lock.release()
        print("done", flush=True)
        return 0
    lock = make_lock(library, impl, client, name)
    if role == "wait":
        print("waiting", flush=True)
        assert lock.acquire()
        print(f"acquired {time.time()!r}", flush=True)
        lock.release()
        return 0
    assert role == "hold"
    assert lock.acquire()
    print("held", flush=True)
    sys.stdin.readline()
    lock.release()
    print("released", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
