"""A process queued for one etcd key through a wake-one hand-off watcher, until it is killed.

    python -m tests.support.etcd_waiter URL KEY

It prints ``queued`` once its entry is in the key's queue, then waits; every wake it gets is
taken (answered ``True``) and printed as ``woken``, so a test can kill it while it is first in
line and holds the turn.
"""

from __future__ import annotations

import sys
import threading

from lease_lock.backends.etcd import EtcdBackend


def main(url: str, key: str) -> None:
    """Queue for ``key`` on the cluster at ``url`` and wait forever."""
    backend = EtcdBackend.from_url(url)

    def woken(name: str) -> bool:
        print("woken", name, flush=True)
        return True

    watcher = backend.watch_handoffs(woken)
    watcher.want(key)
    print("queued", flush=True)
    threading.Event().wait()


if __name__ == "__main__":  # pragma: no cover - run as a child process by the tests
    main(sys.argv[1], sys.argv[2])
