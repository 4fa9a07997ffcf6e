"""A wait whose store falls silent (connections open, nothing answered): it must end at its
timeout as ``BackendUnavailableError``, shared by the backends' tests."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from lease_lock import Locker
from lease_lock.backends.base import Backend, WaitingLine
from lease_lock.errors import BackendUnavailableError

from tests.support.events import Recorder

__all__ = ["check_a_silent_line_ends_its_wait_as_an_outage", "check_a_silent_store_ends_a_wait_as_an_outage"]

#: The waiter's timeout, and how far past it the wait may end before it counts as blocked (a
#: liveness bound, far above the backend's own margin).
TIMEOUT = 3.0
LIVENESS = 3.0


def check_a_silent_store_ends_a_wait_as_an_outage(
    holder: Backend, waiter: Backend, key: str, silence: Callable[[], None], speak: Callable[[], None],
    cause: type[BaseException],
) -> None:
    """``holder`` holds ``key`` for 2 s, without a heartbeat; a Locker on ``waiter`` waits for it
    (``timeout=3``), and once the wait is under way ``silence()`` makes the waiter's store
    silent. The lease runs out within the wait, so the waiter asks the silent store: the wait
    must end as ``BackendUnavailableError`` from a ``cause`` of the driver, not block for the
    driver's own timeouts. ``speak()`` ends the silence (at the end, whatever happened)."""
    assert holder.acquire(key, holder.new_token(), 2, "holder")
    events = Recorder()
    locker = Locker(waiter, on_event=events)
    outcome: list[Any] = []

    def wait() -> None:
        try:
            outcome.append(locker.acquire(key, timeout=TIMEOUT))
        except BaseException as error:  # noqa: BLE001 - the test reads it
            outcome.append(error)

    thread = threading.Thread(target=wait, daemon=True)
    started = time.monotonic()
    thread.start()
    try:
        assert events.wait_for("contended"), "the waiter never found the key held"
        silence()
        thread.join(max(started + TIMEOUT + LIVENESS - time.monotonic(), 0.0))
        assert not thread.is_alive(), "the wait blocked on the silent store past its timeout"
    finally:
        speak()
        thread.join(60)
        locker.close()
    [error] = outcome
    assert isinstance(error, BackendUnavailableError), error
    assert isinstance(error.__cause__, cause), repr(error.__cause__)


def check_a_silent_line_ends_its_wait_as_an_outage(line: WaitingLine, cause: type[BaseException]) -> None:
    """``line``'s store is silent already: a wait of 3 s in it must end as
    ``BackendUnavailableError`` from a ``cause`` of the driver (not block for the driver's own
    timeouts), and leaving the line afterwards must return too."""
    outcome: list[Any] = []

    def wait() -> None:
        try:
            outcome.append(line.wait(3))
        except BackendUnavailableError as error:
            outcome.append(error)
        line.leave(False)
        outcome.append("left")

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "the wait in line blocked on the silent network"
    [error, left] = outcome
    assert isinstance(error, BackendUnavailableError) and isinstance(error.__cause__, cause), repr(error)
    assert left == "left"
