"""Two etcd namespaces, one inside the other, with waiters queued and in line in the inner one.

``nested_namespaces(cluster)`` yields the outer namespace (``nest-<id>/``); inside it, the
namespace ``eu/`` holds the keys ``a`` and ``b``, each with a waiter of another locker: one in
``a``'s line of direct hand-off, one in ``b``'s wake-one queue (or whatever the backend writes
for a waiter without ``direct_handoff``). Those waiters' names lie inside the outer namespace's
range, yet are no lock keys of it.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import lease_lock

from tests.support.etcd_server import EtcdCluster, line_places, queue_entries
from tests.support.polling import wait_until

__all__ = ["INNER", "nested_namespaces"]

#: The inner namespace, relative to the outer one.
INNER = "eu/"


@contextlib.contextmanager
def nested_namespaces(cluster: EtcdCluster) -> Iterator[str]:
    """The outer namespace, while its inner one holds ``a`` and ``b`` with a waiter for each."""
    outer = f"nest-{uuid.uuid4().hex[:8]}/"
    inner = outer + INNER
    direct = f"{cluster.url}?namespace={inner}&direct_handoff=true"
    plain = f"{cluster.url}?namespace={inner}"
    holders = [lease_lock.connect(direct, ttl=30), lease_lock.connect(plain, ttl=30)]
    waiters = [lease_lock.connect(direct, ttl=30), lease_lock.connect(plain, ttl=30)]
    outcomes: list[Any] = []
    threads: list[threading.Thread] = []
    try:
        held = [holders[0].acquire("a"), holders[1].acquire("b")]
        for waiter, key in zip(waiters, ("a", "b")):

            def wait(locker: lease_lock.Locker = waiter, name: str = key) -> None:
                try:
                    lock = locker.acquire(name, timeout=60)
                    outcomes.append(lock)
                    lock.release()
                except BaseException as error:  # noqa: BLE001 - handed to the test thread
                    outcomes.append(error)

            threads.append(threading.Thread(target=wait, daemon=True))
            threads[-1].start()
        wait_until(lambda: bool(line_places(cluster, "a", inner)), "a place in a's line", 30)
        wait_until(lambda: bool(queue_entries(cluster, "b", inner)), "an entry in b's queue", 30)
        yield outer
        for lock in held:
            with contextlib.suppress(Exception):
                lock.release()
        for thread in threads:
            thread.join(60)
        assert all(isinstance(outcome, lease_lock.Lock) for outcome in outcomes), outcomes
    finally:
        for locker in holders + waiters:
            locker.close()
