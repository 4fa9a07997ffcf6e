"""``os.fork()`` while other threads are inside backend calls: the child must not inherit a
mutex that is locked for ever. Real forks, real threads, real SQLite and memory stores; every
child is bounded by a deadline and killed if it hangs, so a regression fails instead of hanging.

Regression: 10 of 10 children forked while a thread was extending on SQLite hung on the
backend's copied mutex.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lease_lock import Locker, connect

from .test_fork import run_in_child

CHILDREN = 10


@pytest.fixture(params=["memory", "sqlite"])
def busy_locker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Locker]:
    """A locker whose backend two threads keep calling (reads and writes) until the test ends."""
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 'locks.db'}"
    locker = connect(url, ttl=2.0)
    held = locker.acquire("held")
    stop = threading.Event()

    def hammer() -> None:
        while not stop.is_set():
            locker.get("held")
            locker.backend.extend("held", held.token, 2.0)

    threads = [threading.Thread(target=hammer, daemon=True) for _ in range(2)]
    for thread in threads:
        thread.start()
    yield locker
    stop.set()
    for thread in threads:
        thread.join(30)
    locker.close()


def test_children_forked_during_backend_calls_can_use_the_backend(busy_locker: Locker) -> None:
    for number in range(CHILDREN):

        def child(number: int = number) -> dict[str, Any]:
            lock = busy_locker.acquire(f"child-{number}", timeout=10)
            state = busy_locker.get(f"child-{number}")
            released = lock.release()
            return {"held": state.held, "released": released}

        assert run_in_child(child, timeout=30) == {"held": True, "released": True}
    # The parent kept working all along.
    assert busy_locker.get("held").held
