"""Several lockers handing one key round: the shared check of the wake-one hand-off suites."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional

from lease_lock import Locker, Retry
from lease_lock.errors import LockHeldError, LockStateError
from lease_lock.testing import wait_until

__all__ = [
    "WakeCounter", "check_a_waiter_that_times_out_leaves_the_line", "check_closing_the_locker_ends_a_wait_in_line",
    "hand_key_round", "hand_over",
]


class WakeCounter:
    """A hand-off watcher's callback that records each key it was woken for and answers
    ``answer`` (whether someone here wanted the wake)."""

    def __init__(self, answer: bool = True) -> None:
        self.calls: list[str] = []
        self.answer = answer
        self._mutex = threading.Lock()

    def __call__(self, key: str) -> bool:
        with self._mutex:
            self.calls.append(key)
        return self.answer


def hand_over(holder: Locker, waiter: Locker, key: str, rounds: int = 3, pause: float = 0.0) -> None:
    """``holder`` takes ``key`` and releases it to ``waiter``, blocked on its own thread, ``rounds``
    times; every wait must end holding the key without an error.

    ``pause`` seconds pass between starting the waiter and the release. It is not a timing
    assertion: the release must work whether or not the waiter has queued yet; a pause only
    makes the queued case the usual one. The lockers stay open.
    """
    for _ in range(rounds):
        first = holder.acquire(key)
        got: list[Any] = []
        errors: list[BaseException] = []

        def wait(got: list[Any] = got, errors: list[BaseException] = errors) -> None:
            try:
                got.append(waiter.acquire(key, timeout=30))
            except BaseException as error:  # noqa: BLE001 - handed to the test thread
                errors.append(error)

        waiting = threading.Thread(target=wait)
        waiting.start()
        if pause:
            time.sleep(pause)
        first.release()
        waiting.join(60)
        assert errors == [] and len(got) == 1 and got[0].state == "held"
        got[0].release()


def hand_key_round(lockers: list[Locker], key: str, rounds: int) -> None:
    """Each locker, on its own thread, takes ``key`` ``rounds`` times; every take must succeed.

    A release that woke nobody would leave a waiter to run out its retry budget, which shows up
    as an error or a short count. The lockers are closed at the end.
    """
    counts = [0] * len(lockers)
    errors: list[BaseException] = []

    def work(index: int) -> None:
        try:
            for _ in range(rounds):
                with lockers[index].lock(key):
                    counts[index] += 1
        except BaseException as error:  # noqa: BLE001 - handed to the test thread
            errors.append(error)

    threads = [threading.Thread(target=work, args=(index,)) for index in range(len(lockers))]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not errors
        assert counts == [rounds] * len(lockers)
    finally:
        for locker in lockers:
            locker.close()


def contend(url: str, table: str, key: str, rounds: int, hold: float, rest: float) -> None:
    """A process taking ``key`` ``rounds`` times from the PostgreSQL table ``table``: it holds
    each grant ``hold`` seconds and rests ``rest`` seconds after each release, then prints one
    JSON line: its grant and release times and the times a hand-off wake reached a waiter here
    (all ``time.time()``, comparable between the processes of one host). Before that it prints
    ``waiting`` once its first wait has registered for the key's releases."""
    import json
    import time

    from lease_lock.backends.postgres import PostgresBackend

    wakes: list[float] = []
    # Without the direct hand-off a waiter waits through the backend's wake-one listener (the
    # subject here).
    never = threading.Event()
    # A waiter here looks at the key again one second after a failed attempt: the retry delay
    # bounds every wait, so only a wake can hand the key over sooner than that.
    backend = PostgresBackend.from_url(url, table=table)
    said = threading.Event()

    def queued(_name: str) -> None:
        if not said.is_set():
            said.set()
            print("waiting", flush=True)

    note_taken_wakes(backend, lambda _name: wakes.append(time.time()), queued)
    locker = Locker(backend, ttl=30, retry=Retry(delay=1.0), owns_backend=True)
    grants: list[float] = []
    releases: list[float] = []
    try:
        for _ in range(rounds):
            lock = locker.acquire(key, timeout=120, cancel=never)
            grants.append(time.time())
            time.sleep(hold)
            releases.append(time.time())
            lock.release()
            time.sleep(rest)
    finally:
        locker.close()
    print(json.dumps({"grants": grants, "releases": releases, "wakes": wakes}), flush=True)


def wait_forever(url: str, table: str, key: str) -> None:
    """A process waiting for ``key`` (until it is stopped or killed), through its locker's
    wake-one listener (the table has no direct hand-off)."""
    from lease_lock.backends.postgres import PostgresBackend

    locker = Locker(PostgresBackend.from_url(url, table=table), ttl=30)
    locker.acquire(key, timeout=600, cancel=threading.Event())


def note_taken_wakes(
    backend: Any, noted: Callable[[str], None], queued: Optional[Callable[[str], None]] = None
) -> None:
    """Have every wake-one watcher ``backend`` starts call ``noted(key)`` for each wake that a
    waiting thread of this process took, and ``queued(key)`` once the watcher is queued for a
    key's releases: its public ``watch_handoffs``, wrapped on this one instance."""
    start = backend.watch_handoffs

    def watch_handoffs(callback: Callable[[str], bool]) -> Any:
        def deliver(name: str) -> bool:
            taken = callback(name)
            if taken:
                noted(name)
            return taken

        watcher = start(deliver)
        if queued is not None:
            want = watcher.want

            def wanted(name: str) -> Any:
                left = want(name)
                queued(name)
                return left

            watcher.want = wanted
        return watcher

    backend.watch_handoffs = watch_handoffs


if __name__ == "__main__":  # pragma: no cover - run as a child process by the tests
    import sys

    if sys.argv[1] == "contend":
        contend(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), float(sys.argv[6]), float(sys.argv[7]))
    else:
        wait_forever(sys.argv[2], sys.argv[3], sys.argv[4])


def check_a_waiter_that_times_out_leaves_the_line(
    holder: Locker, waiter: Locker, key: str, in_line: Callable[[], int]
) -> None:
    """``waiter`` times out in ``key``'s line behind ``holder`` (``in_line()`` counts the
    key's places in the store): its place goes with it, and the release that follows hands the
    key to nobody."""
    held = holder.acquire(key)
    outcome: list[LockHeldError] = []

    def wait() -> None:
        try:
            waiter.acquire(key, timeout=2)
        except LockHeldError as error:
            outcome.append(error)

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    assert wait_until(lambda: in_line() == 1, 30)
    thread.join(60)
    assert len(outcome) == 1 and outcome[0].reason == "timeout"
    assert in_line() == 0
    held.release()
    # Nobody was handed the key on the way out: it is free.
    assert not holder.backend.inspect(key).held


def check_closing_the_locker_ends_a_wait_in_line(
    holder: Locker, waiter: Locker, key: str, in_line: Callable[[], int]
) -> None:
    """``waiter`` (whose retry delay is far longer than the test) waits in ``key``'s line
    behind ``holder``; closing ``waiter`` ends that wait with ``LockStateError``, and the
    release that follows hands the key to nobody."""
    outcome: list[LockStateError] = []

    def wait() -> None:
        try:
            waiter.acquire(key)
        except LockStateError as error:
            outcome.append(error)

    held = holder.acquire(key)
    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    assert wait_until(lambda: in_line() == 1, 30)
    waiter.close()
    # The retry delay is ten minutes: only the look at the closed Locker ends the wait.
    thread.join(30)
    assert not thread.is_alive() and len(outcome) == 1
    held.release()
    assert not holder.backend.inspect(key).held
