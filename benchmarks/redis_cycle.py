"""Uncontended acquire+release cycles and hand-off latency on Redis, side by side in one run.

    python -m benchmarks.redis_cycle [--url redis://127.0.0.1:6379/0] [--seconds 2] [--handoffs 200]

Contestants (all on the same server with the same client settings; each one alternates with
the floor one cycle at a time and is judged on the median cycle time, see ``measure.py``):

- ``floor``: raw redis-py, ``SET NX PX`` then a token-checked delete (one Lua EVALSHA): the
  two-round-trip floor any correct Redis lock pays.
- ``same on one held connection``: the floor's two commands sent on one connection held for
  the whole run, skipping redis-py's per-command pool checkout; the lease_lock backend keeps
  its connections between calls the same way, which is why it can beat the floor.
- ``lease_lock backend``: ``RedisBackend.acquire_fenced`` + ``release`` (fencing included).
- ``lease_lock Locker``: ``with locker.lock(key):`` and ``locker.acquire(key).release()`` with
  default options (the default heartbeat included), and ``locker.acquire(key).release()`` with
  ``fencing=True`` (the whole public path: validation, clock, events).
- ``redis-py Lock``, ``python-redis-lock``, ``pottery Redlock`` (one master), ``sherlock
  RedisLock`` and ``tooz`` (its redis driver): each library's non-blocking acquire and its
  release. Peers that are not installed are named as missing at the top of the output.

The Locker against the backend alone: the same alternation with the backend's own
``acquire``/``release`` (and ``acquire_fenced``) as the floor, each with a fresh token per
cycle as every lock needs, so that the ratio is the core's own share of a cycle on this store,
measured in the same run as the rest.

A counting key against an exclusive one: ``with locker.lock(key, limit=4):`` alternating with
``with locker.lock(key):`` (each on a key of its own, same Locker options), so that the ratio
is what a place of a counting key costs over an exclusive lease.

Hand-off latency: a waiter blocks in each library's own blocking acquire while another client
holds the key; the time from the start of the holder's release to the waiter holding the lock
is recorded (p50/p99), next to a bare ``BLPOP`` wake-up (``LPUSH`` to a blocked ``BLPOP``).

Peers are installed for the benchmark only: ``pip install -e '.[bench]'``.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis
from lease_lock.backends.redis import RedisBackend
from lease_lock.locker import Locker

from benchmarks.floor_lock import floor_cycle
from benchmarks.measure import add_json_argument, paired, percentile, write_json

__all__ = ["UNLOCK", "main"]

TTL = 30.0
_PEER_MODULES = ("redis_lock", "pottery", "sherlock", "tooz")
#: The raw floor's release: the token-checked delete every Redis lock library sends.
UNLOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


def _key(label: str) -> str:
    return f"bench:{label}:{uuid.uuid4().hex[:8]}"


def cycle_contestants(client: Any) -> dict[str, Callable[[], None]]:
    """One uncontended acquire+release cycle per call, for every contestant available here."""
    contestants: dict[str, Callable[[], None]] = {}

    floor_key = _key("floor")
    unlock = client.register_script(UNLOCK)
    unlock([floor_key], ["warm"])

    def floor() -> None:
        token = uuid.uuid4().hex
        if not client.set(floor_key, token, nx=True, px=int(TTL * 1000)):
            raise RuntimeError("floor: uncontended SET NX failed")
        unlock([floor_key], [token])

    contestants["floor (SET NX PX + checked DEL)"] = floor

    # The same two commands on one connection held for the whole run: what redis-py costs
    # without its per-command pool checkout, which the lease_lock backend also skips (it keeps
    # its connections between calls). Shown so that a ratio above 1 is read for what it is.
    held_key = _key("held-connection")
    connection = client.connection_pool.get_connection()

    def held_connection_floor() -> None:
        token = uuid.uuid4().hex
        connection.send_command("SET", held_key, token, "NX", "PX", int(TTL * 1000))
        if connection.read_response() is None:
            raise RuntimeError("held-connection floor: uncontended SET NX failed")
        connection.send_command("EVALSHA", unlock.sha, 1, held_key, token)
        connection.read_response()

    unlock([held_key], ["warm"])
    contestants["same on one held connection"] = held_connection_floor

    backend = RedisBackend(client)
    backend_key = _key("backend")

    def backend_cycle() -> None:
        token = backend.new_token()
        if backend.acquire_fenced(backend_key, token, TTL, "bench") is None:
            raise RuntimeError("backend: uncontended acquire failed")
        backend.release(backend_key, token)

    contestants["lease_lock backend (fenced)"] = backend_cycle

    plain = Locker(RedisBackend(client), ttl=TTL)
    with_key = _key("locker-with")

    def with_cycle() -> None:
        with plain.lock(with_key):
            pass

    contestants["lease_lock Locker: with lock()"] = with_cycle

    plain_key = _key("locker")

    def plain_cycle() -> None:
        plain.acquire(plain_key).release()

    contestants["lease_lock Locker: acquire().release()"] = plain_cycle

    locker = Locker(RedisBackend(client), fencing=True, ttl=TTL)
    locker_key = _key("locker-fenced")

    def locker_cycle() -> None:
        locker.acquire(locker_key).release()

    contestants["lease_lock Locker (fenced)"] = locker_cycle

    redis_py_key = _key("redis-py")

    def redis_py_cycle() -> None:
        lock = client.lock(redis_py_key, timeout=TTL)
        if not lock.acquire(blocking=False):
            raise RuntimeError("redis-py: uncontended acquire failed")
        lock.release()

    contestants["redis-py Lock"] = redis_py_cycle

    try:
        import redis_lock
    except ImportError:
        pass
    else:
        prl_key = _key("python-redis-lock")

        def prl_cycle() -> None:
            lock = redis_lock.Lock(client, prl_key, expire=int(TTL))
            if not lock.acquire(blocking=False):
                raise RuntimeError("python-redis-lock: uncontended acquire failed")
            lock.release()

        contestants["python-redis-lock"] = prl_cycle

    try:
        from pottery import Redlock
    except ImportError:
        pass
    else:
        pottery_key = _key("pottery")

        def pottery_cycle() -> None:
            lock = Redlock(key=pottery_key, masters={client}, auto_release_time=TTL)
            if not lock.acquire(blocking=False):
                raise RuntimeError("pottery: uncontended acquire failed")
            lock.release()

        contestants["pottery Redlock"] = pottery_cycle

    try:
        import sherlock
    except ImportError:
        pass
    else:
        sherlock_key = _key("sherlock")

        def sherlock_cycle() -> None:
            lock = sherlock.RedisLock(sherlock_key, client=client, expire=int(TTL))
            if not lock.acquire(blocking=False):
                raise RuntimeError("sherlock: uncontended acquire failed")
            lock.release()

        contestants["sherlock RedisLock"] = sherlock_cycle

    coordinator = _tooz_coordinator(client)
    if coordinator is not None:
        tooz_key = _key("tooz").encode()

        def tooz_cycle() -> None:
            lock = coordinator.get_lock(tooz_key)
            if not lock.acquire(blocking=False):
                raise RuntimeError("tooz: uncontended acquire failed")
            lock.release()

        contestants["tooz (redis driver)"] = tooz_cycle
    return contestants


def _tooz_coordinator(client: Any) -> Any:
    """A started tooz coordinator on the same server as ``client``, or ``None`` without tooz."""
    try:
        from tooz import coordination
    except ImportError:
        return None
    options = client.connection_pool.connection_kwargs
    url = f"redis://{options.get('host', '127.0.0.1')}:{options.get('port', 6379)}?db={options.get('db', 0)}"
    coordinator = coordination.get_coordinator(url, f"bench-{uuid.uuid4().hex[:8]}".encode())
    coordinator.start()
    return coordinator


def versus_backend(client: Any) -> list[tuple[str, Callable[[], None], Callable[[], None]]]:
    """``(name, backend alone, Locker)``: one cycle each of the Locker with default options and
    of the bare backend calls it makes, plain and fenced, each on its own backend and key; first
    the floor lock (:mod:`benchmarks.floor_lock`), the lease rules alone, in the Locker's place."""

    def backend_alone(fencing: bool) -> Callable[[], None]:
        backend = RedisBackend(client)
        key = _key("backend-alone")
        grant = backend.acquire_fenced if fencing else backend.acquire

        def cycle() -> None:
            token = backend.new_token()
            answer = grant(key, token, TTL, "bench")
            if answer is None or answer is False:
                raise RuntimeError("backend alone: uncontended acquire failed")
            backend.release(key, token)

        return cycle

    plain = Locker(RedisBackend(client), ttl=TTL)
    fenced = Locker(RedisBackend(client), fencing=True, ttl=TTL)
    with_key, plain_key, fenced_key = _key("vs-with"), _key("vs-acquire"), _key("vs-fenced")

    def with_cycle() -> None:
        with plain.lock(with_key):
            pass

    def plain_cycle() -> None:
        plain.acquire(plain_key).release()

    def fenced_cycle() -> None:
        fenced.acquire(fenced_key).release()

    return [
        ("floor lock vs backend (rules alone)", backend_alone(False),
         floor_cycle(RedisBackend(client), _key("vs-floor"), TTL)),
        ("Locker vs backend: with lock()", backend_alone(False), with_cycle),
        ("Locker vs backend: acquire().release()", backend_alone(False), plain_cycle),
        ("Locker vs backend: fenced", backend_alone(True), fenced_cycle),
    ]


def counting_versus_exclusive(client: Any) -> list[tuple[str, Callable[[], None], Callable[[], None]]]:
    """``(name, exclusive cycle, counting cycle)``: ``with locker.lock(key)`` against
    ``with locker.lock(key, limit=4)``, on one Locker with default options, keys of their own."""
    locker = Locker(RedisBackend(client), ttl=TTL)
    exclusive_key, counting_key = _key("exclusive"), _key("counting")

    def exclusive_cycle() -> None:
        with locker.lock(exclusive_key):
            pass

    def counting_cycle() -> None:
        with locker.lock(counting_key, limit=4):
            pass

    return [("Locker limit=4 vs exclusive", exclusive_cycle, counting_cycle)]


# -- hand-off ---------------------------------------------------------------------------------


Release = Callable[[], Any]


def _handoff_samples(
    hold: Callable[[], Release], wait: Callable[[], Release], samples: int
) -> list[float]:
    """Seconds from the start of each release to the waiter holding the lock.

    ``hold()`` takes the lock and returns its release; ``wait()`` blocks until it acquires and
    returns its own release, called once the time is taken.
    """
    def waiter_body(acquired: list[float]) -> None:
        give_back = wait()
        acquired.append(time.perf_counter())
        give_back()

    results: list[float] = []
    for _ in range(samples):
        release = hold()
        acquired: list[float] = []
        waiter = threading.Thread(target=waiter_body, args=(acquired,))
        waiter.start()
        # Let the waiter try, fail and settle into its blocking wait.
        time.sleep(0.02)
        released = time.perf_counter()
        release()
        waiter.join(30)
        if not acquired:
            raise RuntimeError("hand-off: the waiter never acquired")
        results.append(acquired[0] - released)
    return results


def handoff_contestants(url: str) -> dict[str, tuple[Callable[[], Release], Callable[[], Release]]]:
    """``name -> (hold, wait)`` for every contestant available here."""
    holder_client = redis.Redis.from_url(url)
    waiter_client = redis.Redis.from_url(url)
    out: dict[str, tuple[Callable[[], Release], Callable[[], Release]]] = {}

    blpop_key = _key("blpop")
    out["bare BLPOP wake-up"] = (
        lambda: lambda: holder_client.lpush(blpop_key, 1),
        lambda: (waiter_client.blpop([blpop_key], timeout=10), lambda: None)[1],
    )

    key = _key("locker")
    holder = Locker(RedisBackend(holder_client), ttl=TTL)
    waiter = Locker(RedisBackend(waiter_client), ttl=TTL)

    def locker_hold() -> Release:
        return holder.acquire(key).release

    def locker_wait() -> Release:
        return waiter.acquire(key, timeout=10).release

    out["lease_lock Locker"] = (locker_hold, locker_wait)

    rp_key = _key("redis-py")

    def rp_hold() -> Release:
        lock = holder_client.lock(rp_key, timeout=TTL)
        lock.acquire()
        return lock.release

    def rp_wait() -> Release:
        lock = waiter_client.lock(rp_key, timeout=TTL, blocking_timeout=10)
        lock.acquire()
        return lock.release

    out["redis-py Lock"] = (rp_hold, rp_wait)

    try:
        import redis_lock
    except ImportError:
        pass
    else:
        prl_key = _key("python-redis-lock")

        def prl_hold() -> Release:
            lock = redis_lock.Lock(holder_client, prl_key, expire=int(TTL))
            lock.acquire()
            return lock.release

        def prl_wait() -> Release:
            lock = redis_lock.Lock(waiter_client, prl_key, expire=int(TTL))
            lock.acquire(timeout=10)
            return lock.release

        out["python-redis-lock"] = (prl_hold, prl_wait)

    try:
        from pottery import Redlock
    except ImportError:
        pass
    else:
        pot_key = _key("pottery")

        def pot_hold() -> Release:
            lock = Redlock(key=pot_key, masters={holder_client}, auto_release_time=TTL)
            lock.acquire()
            return lock.release

        def pot_wait() -> Release:
            lock = Redlock(key=pot_key, masters={waiter_client}, auto_release_time=TTL)
            lock.acquire(timeout=10)
            return lock.release

        out["pottery Redlock"] = (pot_hold, pot_wait)

    try:
        import sherlock
    except ImportError:
        pass
    else:
        sherlock_key = _key("sherlock")

        def sherlock_hold() -> Release:
            lock = sherlock.RedisLock(sherlock_key, client=holder_client, expire=int(TTL))
            lock.acquire()
            return lock.release

        def sherlock_wait() -> Release:
            lock = sherlock.RedisLock(sherlock_key, client=waiter_client, expire=int(TTL), timeout=10)
            lock.acquire()
            return lock.release

        out["sherlock RedisLock (polls)"] = (sherlock_hold, sherlock_wait)

    holder_coordinator = _tooz_coordinator(holder_client)
    waiter_coordinator = _tooz_coordinator(waiter_client)
    if holder_coordinator is not None and waiter_coordinator is not None:
        tooz_key = _key("tooz").encode()

        def tooz_hold() -> Release:
            lock = holder_coordinator.get_lock(tooz_key)
            lock.acquire()
            return lock.release

        def tooz_wait() -> Release:
            lock = waiter_coordinator.get_lock(tooz_key)
            lock.acquire(blocking=10)
            return lock.release

        out["tooz (redis driver)"] = (tooz_hold, tooz_wait)
    return out


def _paired_table(
    title: str, base: str, rows: list[tuple[str, Callable[[], None], Callable[[], None]]], seconds: float
) -> list[dict[str, Any]]:
    """Run each ``(name, base cycle, contestant)`` alternately for ``seconds``, print the table
    under ``title`` (``base`` names the base cycle's column) and return its rows for the JSON."""
    print(title)
    print(f"{'contestant':<40} {'cycles/s':>10} {base + '/s':>11} {'vs ' + base:>12}")
    table = []
    for name, base_cycle, contestant in rows:
        pairing = paired(base_cycle, contestant, seconds)
        print(f"{name:<40} {pairing.rate:>10,.0f} {pairing.floor_rate:>11,.0f} {pairing.ratio:>11.2f}x")
        table.append({"name": name, "rate": pairing.rate, f"{base}_rate": pairing.floor_rate, "ratio": pairing.ratio})
    return table


def main(argv: list[str] | None = None) -> None:
    """Run both measurements and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--seconds", type=float, default=6.0, help="cycle time per pairing")
    parser.add_argument("--handoffs", type=int, default=100, help="hand-off samples each")
    add_json_argument(parser)
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"cycles": [], "handoffs": []}

    client = redis.Redis.from_url(args.url)
    info = client.info("server")
    print(f"redis-server {info['redis_version']} at {args.url}; redis-py {redis.__version__}")

    missing = [name for name in _PEER_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        print(f"peers not installed (pip install -e '.[bench]'): {', '.join(missing)}")

    contestants = cycle_contestants(client)
    floor_name, raw_floor = next(iter(contestants.items()))
    print("\nUncontended acquire+release cycles: each contestant alternates with the floor one")
    print(f"cycle at a time for {args.seconds:g} s; rates are at the median cycle time of each side")
    print(f"{'contestant':<40} {'cycles/s':>10} {'floor/s':>10} {'vs floor':>9}")
    for name, cycle in contestants.items():
        if name == floor_name:
            continue
        pairing = paired(raw_floor, cycle, args.seconds)
        print(f"{name:<40} {pairing.rate:>10,.0f} {pairing.floor_rate:>10,.0f} {pairing.ratio:>8.2f}x")
        results["cycles"].append({"name": name, "rate": pairing.rate, "floor": floor_name,
                                  "floor_rate": pairing.floor_rate, "ratio": pairing.ratio})

    results["versus_backend"] = _paired_table(
        "\nThe Locker against the backend alone (each alternating with the backend's own calls,\n"
        f"fresh token per cycle, for {args.seconds:g} s; >= 0.95x means within 5% of the backend)",
        "backend", versus_backend(client), args.seconds,
    )
    results["counting"] = _paired_table(
        "\nA counting key against an exclusive one (each alternating with the exclusive cycle,\n"
        f"for {args.seconds:g} s; the ratio is the counting key's cycles per exclusive cycle)",
        "exclusive", counting_versus_exclusive(client), args.seconds,
    )

    print(f"\nHand-off latency, release -> waiter holds ({args.handoffs} samples)")
    print(f"{'contestant':<40} {'p50 ms':>9} {'p99 ms':>9}")
    for name, (hold, wait) in handoff_contestants(args.url).items():
        samples = _handoff_samples(hold, wait, args.handoffs)
        p50 = statistics.median(samples) * 1000
        p99 = percentile(samples, 0.99) * 1000
        print(f"{name:<40} {p50:>9.2f} {p99:>9.2f}")
        results["handoffs"].append({"name": name, "p50_ms": p50, "p99_ms": p99})
    write_json(args.json, "redis_cycle", argv, results)


if __name__ == "__main__":
    main()
