"""A real ``os.fork()``: the child's copies of held locks read lost ("forked") and are never
extended or released by the child; a locker used in the child gets its own heartbeat."""

from __future__ import annotations

import json
import os
import select
import signal
import threading
import time
from typing import Any, Callable

import pytest
from lease_lock import Locker, LockEvent, MemoryBackend


def run_in_child(body: Callable[[], dict[str, Any]], timeout: float = 30.0) -> dict[str, Any]:
    """Fork, run ``body`` in the child and return what it reported through a pipe."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child, reported through the pipe
        status = 1
        try:
            os.close(read_end)
            try:
                report = body()
            except BaseException as error:  # noqa: BLE001 - every failure goes to the parent
                report = {"error": repr(error)}
            os.write(write_end, json.dumps(report).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([read_end], [], [], max(left, 0))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                pytest.fail("the forked child did not answer in time")
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    report: dict[str, Any] = json.loads(b"".join(chunks) or b"{}")
    assert "error" not in report, report["error"]
    return report


def test_child_copies_read_lost_forked_and_the_child_locker_works() -> None:
    backend = MemoryBackend()
    events: list[LockEvent] = []
    locker = Locker(backend, on_event=events.append)
    parent_lock = locker.acquire("parent-key", ttl=30.0)
    parent_thread = locker._heartbeat.thread

    def child() -> dict[str, Any]:
        events.clear()
        report: dict[str, Any] = {
            "state": parent_lock.state,
            "reason": parent_lock.lost_reason,
            "lost_set": parent_lock.lost.is_set(),
            "release": parent_lock.release(),
        }
        # The child never gave the parent's key back, nor extended it.
        report["still_held"] = backend.is_held("parent-key", parent_lock.token)
        extended = threading.Event()
        child_events: list[str] = []

        def watch(event: LockEvent) -> None:
            child_events.append(event.type)
            if event.type == "extended":
                extended.set()

        locker._acquisition.on_event = watch
        own = locker.acquire("child-key", ttl=0.6)
        report["extended"] = extended.wait(15)
        report["own_state"] = own.state
        report["own_release"] = own.release()
        report["new_thread"] = locker._heartbeat.thread is not parent_thread
        report["thread_alive"] = bool(locker._heartbeat.thread and locker._heartbeat.thread.is_alive())
        report["parent_events"] = [event.type for event in events if event.key == "parent-key"]
        report["child_events"] = child_events
        report["owner_pid"] = locker.owner.rsplit(":", 1)[1]
        locker.close()
        return report

    report = run_in_child(child)
    assert (report["state"], report["reason"], report["lost_set"]) == ("lost", "forked", True)
    assert report["release"] is False
    assert report["still_held"] is True
    assert report["extended"] is True and report["own_state"] == "held" and report["own_release"] is True
    assert report["new_thread"] is True and report["thread_alive"] is True
    assert report["parent_events"] == [], "the child reports nothing about the parent's locks"
    assert report["child_events"][0] == "acquired" and report["child_events"][-1] == "released"
    assert report["owner_pid"] != str(os.getpid())
    # The parent is untouched: still held, still extended by its own thread.
    assert parent_lock.state == "held"
    assert backend.is_held("parent-key", parent_lock.token)
    assert parent_lock.release() is True
    locker.close()


def test_fork_while_a_parent_thread_holds_the_heartbeat_and_clock_locks() -> None:
    """A parent thread may be inside the heartbeat or the clock at the moment of the fork; the
    child's fork handling must not wait for locks that thread will never release there."""
    locker = Locker(MemoryBackend())
    lock = locker.acquire("k", ttl=30.0)
    holding = threading.Event()
    done = threading.Event()

    def hold() -> None:
        with locker._heartbeat._condition, locker._clock._mutex:  # type: ignore[attr-defined]
            holding.set()
            done.wait(60)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(10)
        report = run_in_child(
            lambda: {"reason": lock.lost_reason, "other": locker.acquire("other").release()}, timeout=20
        )
    finally:
        done.set()
        holder.join(10)
    assert report == {"reason": "forked", "other": True}
    assert lock.release() is True
    locker.close()
