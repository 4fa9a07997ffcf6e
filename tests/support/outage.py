"""A waiting acquire riding out an outage: the checks every backend's outage suite shares.

Each takes the store's URL (and ``connect`` options) plus how to stop and start its server, so
the Redis and lock-service suites say only how their server goes down and comes back.
"""

from __future__ import annotations

import re
import threading
import uuid
from typing import Any, Callable

import pytest
from lease_lock import BackendUnavailableError, LeaseLockError, LockEvent, Retry, connect

__all__ = ["DEADLINE", "Failures", "check_an_outage_past_the_timeout", "check_rides_out_a_restart"]

#: How long a test waits for anything that should happen within a few seconds.
DEADLINE = 60.0


class Failures:
    """An ``on_event`` hook that counts ``attempt_failed`` events and lets a test wait for some."""

    def __init__(self) -> None:
        self.errors: list[BaseException] = []
        self._condition = threading.Condition()

    def __call__(self, event: LockEvent) -> None:
        if event.type == "attempt_failed":
            with self._condition:
                assert event.error is not None
                self.errors.append(event.error)
                self._condition.notify_all()

    def wait_for(self, count: int) -> bool:
        """Whether ``count`` failed attempts were reported within :data:`DEADLINE`."""
        with self._condition:
            return self._condition.wait_for(lambda: len(self.errors) >= count, DEADLINE)


def check_rides_out_a_restart(
    url: str, stop: Callable[[], None], start: Callable[[], None], **options: Any
) -> None:
    """A thread waiting in ``acquire(timeout=30)`` while the store is down acquires once it is back."""
    failures = Failures()
    key = f"outage-{uuid.uuid4().hex}"
    outcome: dict[str, object] = {}
    with connect(url, on_event=failures, retry=Retry(delay=0.2), **options) as locker:

        def wait() -> None:
            try:
                outcome["lock"] = locker.acquire(key, timeout=30)
            except Exception as error:  # noqa: BLE001 - handed to the test thread
                outcome["error"] = error

        locker.get(key)  # connected before the outage, as a running application is
        stop()
        thread = threading.Thread(target=wait)
        thread.start()
        # Down for a few failed attempts (about three seconds with the reconnect waits).
        assert failures.wait_for(3), "the waiter never reported a failed attempt"
        start()
        thread.join(DEADLINE)
        assert not thread.is_alive()
        assert "error" not in outcome, outcome
        assert getattr(outcome["lock"], "state", None) == "held"
        assert all(isinstance(error, BackendUnavailableError) for error in failures.errors)


def check_an_outage_past_the_timeout(url: str, stop: Callable[[], None], **options: Any) -> None:
    """Down past the timeout: the wait raises ``BackendUnavailableError`` (the last attempt could
    not reach the store, so nobody answered that the key is held) saying how many attempts it
    made over how long, with the driver's own error as ``__cause__``; a single attempt raises
    the outage itself."""
    key = f"outage-{uuid.uuid4().hex}"
    with connect(url, retry=Retry(delay=0.2), **options) as locker:
        # Connected (and the store set up) before the outage, as a running application is.
        locker.acquire(f"{key}-before").release()
        stop()
        with pytest.raises(BackendUnavailableError) as caught:
            locker.acquire(key, timeout=2)
        message = str(caught.value)
        assert f"store unreachable while acquiring {key!r}: " in message
        assert re.search(r"\d+ attempt\(s\) over \d+\.\d{3}s, the last one failed: .+", message), message
        cause = caught.value.__cause__
        assert cause is not None and not isinstance(cause, LeaseLockError), repr(cause)
        with pytest.raises(BackendUnavailableError):
            locker.try_acquire(key)
