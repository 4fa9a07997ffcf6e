"""The core on the real clock: the heartbeat's own thread, leases running out, retry delays and
timeouts that pass in real time. Moved out of ``tests/unit``, whose tests move a fake clock.
Waits are on events with generous limits; nothing asserts how fast something happened."""

from __future__ import annotations

import math
import threading
from typing import Callable

import pytest
from lease_lock import BackendUnavailableError, Lock, Locker, LockEvent, LockHeldError, MemoryBackend, Retry
from lease_lock.backends.base import ReleaseWatcher
from lease_lock.heartbeat import ARRIVAL_LEAD
from lease_lock.testing import wait_until

from tests.unit.fakes import RecordingBackend

OTHER = "o" * 32


class WatchlessOnce(MemoryBackend):
    """A memory backend whose first release subscription fails as a store that is down."""

    def __init__(self) -> None:
        super().__init__()
        self.subscriptions = 0

    def watch_releases(self, callback: Callable[[str], None]) -> ReleaseWatcher:
        self.subscriptions += 1
        if self.subscriptions == 1:
            raise BackendUnavailableError("cannot subscribe (test)", backend="memory")
        return super().watch_releases(callback)


def test_real_heartbeat_thread_extends_on_its_own() -> None:
    """Real time: the daemon thread (not run_due) keeps a short lease alive."""
    extended = threading.Event()
    locker = Locker(MemoryBackend(), on_event=lambda event: event.type == "extended" and extended.set())
    lock = locker.acquire("k", ttl=0.6)
    assert extended.wait(10)
    assert lock.state == "held"
    locker.close()


def test_lost_wait_returns_when_the_lease_ends() -> None:
    """Real time: nothing but the lease running out sets the signal."""
    locker = Locker(MemoryBackend())
    lock = locker.acquire("k", ttl=0.3, auto_extend=False)
    assert lock.lost.wait(30)
    assert lock.lost_reason == "expired"
    long_lease: Lock = locker.acquire("other", ttl=60)
    assert long_lease.lost.wait(0.05) is False
    locker.close()


def test_the_thread_takes_arrivals_on_its_own_in_time() -> None:
    """Real time: a lease long enough to go through the arrivals is extended by the thread."""
    extended = threading.Event()
    locker = Locker(MemoryBackend(), on_event=lambda event: event.type == "extended" and extended.set())
    lock = locker.acquire("k", ttl=3 * ARRIVAL_LEAD)
    assert extended.wait(30)
    assert lock.state == "held"
    locker.close()


def test_cancel_wakes_a_real_waiter_promptly() -> None:
    """Real time, release notifications on: a waiter blocked on a busy key leaves on cancel."""
    backend = RecordingBackend()
    backend.acquire("busy", OTHER, 3600.0, "other")
    contended = threading.Event()

    def on_event(event: LockEvent) -> None:
        if event.type == "contended":
            contended.set()

    locker = Locker(backend, on_event=on_event)
    cancel = threading.Event()
    outcome: list[BaseException] = []

    def wait() -> None:
        try:
            locker.acquire("busy", cancel=cancel, timeout=math.inf)
        except BaseException as error:  # noqa: BLE001 - handed to the test thread
            outcome.append(error)

    waiter = threading.Thread(target=wait)
    waiter.start()
    assert contended.wait(10)
    cancel.set()
    waiter.join(10)
    assert not waiter.is_alive()
    assert isinstance(outcome[0], LockHeldError) and outcome[0].reason == "cancelled"
    locker.close()


def test_without_reentrant_a_nested_acquire_contends_and_names_this_thread() -> None:
    backend = MemoryBackend()
    with Locker(backend) as locker, locker.lock("k"):
        assert locker.try_acquire("k") is None
        with pytest.raises(LockHeldError) as raised:
            locker.acquire("k", timeout=0.3)
        error = raised.value
        assert error.reason == "timeout" and error.attempts >= 1, "the blocking acquire spent its budget"
        message = str(error)
        assert "this very thread" in message and threading.current_thread().name in message
        assert "reentrant=True" in message and "elsewhere" not in message
        nested = locker.lock("k", blocking=False)
        assert nested.acquire() is False
        # Held by another holder, the message is the usual one.
        with Locker(backend) as elsewhere, pytest.raises(LockHeldError, match="held elsewhere"):
            elsewhere.acquire("k", blocking=False)


def test_a_failed_subscription_while_waiting_is_retried_not_raised() -> None:
    backend = WatchlessOnce()
    with Locker(backend) as holder, Locker(backend, retry=Retry(delay=0.05)) as waiter:
        held = holder.acquire("k")
        done = threading.Event()
        outcome: dict[str, object] = {}

        def wait() -> None:
            try:
                outcome["lock"] = waiter.acquire("k", timeout=30)
            except Exception as error:  # noqa: BLE001 - handed to the test thread
                outcome["error"] = error
            done.set()

        thread = threading.Thread(target=wait)
        thread.start()
        assert wait_until(lambda: backend.subscriptions >= 2, 30)
        held.release()
        assert done.wait(30)
        thread.join(30)
        assert "error" not in outcome, outcome
        assert getattr(outcome["lock"], "state", None) == "held"
        # Nothing stayed registered for the failed subscription.
        assert backend._announcements._waiters == {}
