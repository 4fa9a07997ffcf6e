"""Several lockers handing one key round: the shared check of the wake-one hand-off suites."""

from __future__ import annotations

import threading

from lease_lock import Locker

__all__ = ["WakeCounter", "hand_key_round"]


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
