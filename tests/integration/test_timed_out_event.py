"""The ``timed_out`` event: one per wait that ran out of time, never for other failures."""

from __future__ import annotations

import threading

import pytest
from lease_lock import Locker, LockEvent, LockHeldError
from lease_lock.backends.memory import MemoryBackend


def test_a_wait_that_runs_out_reports_timed_out_once() -> None:
    backend = MemoryBackend()
    seen: list[LockEvent] = []
    with Locker(backend, owner="holder") as holder, Locker(backend, on_event=seen.append) as waiter:
        held = holder.acquire("k")
        with pytest.raises(LockHeldError) as caught:
            waiter.acquire("k", timeout=0.2)
        assert caught.value.reason == "timeout"
        (event,) = [event for event in seen if event.type == "timed_out"]
        assert event.attempts == caught.value.attempts and event.attempts >= 1
        assert event.elapsed is not None and event.elapsed >= 0.2
        assert seen[-1] is event, "it ends the wait's events"

        seen.clear()
        assert waiter.try_acquire("k") is None
        cancel = threading.Event()
        cancel.set()
        with pytest.raises(LockHeldError, match="cancelled"):
            waiter.acquire("k", timeout=5, cancel=cancel)
        assert "timed_out" not in [event.type for event in seen]
        assert held.state == "held"
