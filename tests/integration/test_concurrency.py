"""Many threads, one key, real time: fencing and mutual exclusion hold under contention."""

from __future__ import annotations

import threading

from lease_lock import Locker, MemoryBackend, Retry

THREADS = 8
ROUNDS = 200


class FencedResource:
    """A store that refuses writes carrying a fence lower than the highest it has seen, and
    notices two writers inside at once."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self.highest = 0
        self.inside = 0
        self.violations = 0
        self.overlaps = 0
        self.fences: list[int] = []

    def enter(self, fence: int) -> None:
        with self._mutex:
            if fence < self.highest:
                self.violations += 1
            self.highest = max(self.highest, fence)
            self.fences.append(fence)
            self.inside += 1
            if self.inside > 1:
                self.overlaps += 1

    def leave(self) -> None:
        with self._mutex:
            self.inside -= 1


def test_eight_threads_two_hundred_acquisitions_each_on_one_key() -> None:
    backend = MemoryBackend()
    resource = FencedResource()
    failures: list[BaseException] = []
    start = threading.Barrier(THREADS)

    def worker() -> None:
        # One Locker per thread, as separate services would have, sharing one store.
        locker = Locker(backend, fencing=True, ttl=10.0, retry=Retry(timeout=120.0))
        try:
            start.wait(30)
            for _ in range(ROUNDS):
                with locker.lock("shared") as lock:
                    assert lock.fence is not None
                    resource.enter(lock.fence)
                    # Give the other threads a chance to barge in while we are inside.
                    threading.Event().wait(0)
                    resource.leave()
        except BaseException as error:  # noqa: BLE001 - reported to the test thread
            failures.append(error)
        finally:
            locker.close()

    threads = [threading.Thread(target=worker, name=f"worker-{index}") for index in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads)
    assert failures == []
    assert len(resource.fences) == THREADS * ROUNDS
    assert (resource.violations, resource.overlaps) == (0, 0)
    # Every grant had its own, strictly larger fence.
    assert resource.fences == sorted(set(resource.fences))
    assert not backend.inspect("shared").held
