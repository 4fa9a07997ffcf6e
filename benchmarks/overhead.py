"""The core's own cost per lock cycle, against the backend's bare calls.

    python -m benchmarks.overhead [--cycles 20000] [--repeat 5] [--cpu]

Each row runs ``--cycles`` acquire+release cycles on one key of a ``MemoryBackend`` and keeps
the best of ``--repeat`` runs. ``--cpu`` times this thread's CPU time instead of the wall
clock, which is steadier on a machine busy with other work (time spent switched out does not
count). The floor is the backend's ``acquire``/``release`` called
directly; the other rows go through a ``Locker`` (validation, token, clock, heartbeat timer,
events). Reported: cycles per second, microseconds per cycle, and the ratio to the floor.
"""

from __future__ import annotations

import argparse
import secrets
import time
from collections.abc import Sequence
from typing import Callable

from lease_lock import Locker, MemoryBackend

__all__ = ["main"]

Cycle = Callable[[], None]


def bare(backend: MemoryBackend) -> Cycle:
    """The floor: the backend's own primitives, with a token made once."""
    token = secrets.token_hex(16)

    def cycle() -> None:
        backend.acquire("bench", token, 30.0, "bench")
        backend.release("bench", token)

    return cycle


def bare_fresh_token(backend: MemoryBackend) -> Cycle:
    """The floor plus a fresh random token per cycle, as every real lock needs."""

    def cycle() -> None:
        token = backend.new_token()
        backend.acquire("bench", token, 30.0, "bench")
        backend.release("bench", token)

    return cycle


def locker_acquire(locker: Locker) -> Cycle:
    """``locker.acquire()`` then ``lock.release()``."""

    def cycle() -> None:
        locker.acquire("bench").release()

    return cycle


def locker_with(locker: Locker) -> Cycle:
    """``with locker.lock(key):``."""

    def cycle() -> None:
        with locker.lock("bench"):
            pass

    return cycle


def locker_no_extend(locker: Locker) -> Cycle:
    """``locker.acquire(auto_extend=False)`` then release: no heartbeat timer."""

    def cycle() -> None:
        locker.acquire("bench", auto_extend=False).release()

    return cycle


def locker_try(locker: Locker) -> Cycle:
    """``locker.try_acquire()`` then release."""

    def cycle() -> None:
        lock = locker.try_acquire("bench")
        assert lock is not None
        lock.release()

    return cycle


def measure(cycle: Cycle, cycles: int, repeat: int, timer: Callable[[], float] = time.perf_counter) -> float:
    """Best seconds per cycle over ``repeat`` runs of ``cycles`` cycles, timed by ``timer``."""
    for _ in range(min(cycles, 1000)):  # warm up caches and the heartbeat thread
        cycle()
    best = float("inf")
    for _ in range(repeat):
        start = timer()
        for _ in range(cycles):
            cycle()
        best = min(best, (timer() - start) / cycles)
    return best


def main(argv: Sequence[str] | None = None) -> None:
    """Run every row and print one table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--cpu", action="store_true", help="time this thread's CPU time, not the wall clock")
    args = parser.parse_args(argv)
    timer = time.thread_time if args.cpu else time.perf_counter
    backend = MemoryBackend()
    locker = Locker(backend)
    fenced = Locker(MemoryBackend(), fencing=True)
    rows: list[tuple[str, Cycle]] = [
        ("backend.acquire + release (floor)", bare(backend)),
        ("  same, fresh token per cycle", bare_fresh_token(backend)),
        ("locker.acquire + lock.release", locker_acquire(locker)),
        ("with locker.lock(key)", locker_with(locker)),
        ("locker.try_acquire + release", locker_try(locker)),
        ("acquire(auto_extend=False) + release", locker_no_extend(locker)),
        ("fencing=True: acquire + release", locker_acquire(fenced)),
    ]
    results = [(name, measure(cycle, args.cycles, args.repeat, timer)) for name, cycle in rows]
    floor = results[0][1]
    clock = "thread CPU time" if args.cpu else "wall clock"
    print(f"MemoryBackend, {args.cycles} cycles per run, best of {args.repeat}, {clock}")
    header = f"{'cycle':<40} {'cycles/s':>10} {'us/cycle':>9} {'x floor':>8}"
    print(header)
    print("-" * len(header))
    for name, seconds in results:
        print(f"{name:<40} {1 / seconds:>10.0f} {seconds * 1e6:>9.2f} {seconds / floor:>8.1f}")
    locker.close()
    fenced.close()


if __name__ == "__main__":
    main()
