"""Acquire+release cycles and hand-off latency on etcd, side by side in one run.

    python -m benchmarks.etcd_cycle [--url etcd://127.0.0.1:2379 | --start 3]
                                    [--seconds 4] [--handoffs 50] [--workers 8] [--json PATH]

``--start N`` starts a private N-member cluster on loopback for the run (the tests' helper, so
the repository's ``tests`` package must be importable); otherwise ``--url`` names a cluster.

Cycle contestants, each alternating with the floor one cycle at a time and judged on the median
cycle time (see ``measure.py``):

- ``by hand (floor)``: the three requests the backend sends for a cycle (the keep-alive of a
  spare lease, the "take it if free or ours" transaction on it, and the release: a
  token-guarded delete, which leaves the lease for the next cycle), typed by hand as JSON on one
  bare ``http.client`` connection to the same member, as the backend sends them.
- ``backend acquire/release``: ``EtcdBackend`` primitives; ``..., session=`` the same on a
  backend given a ``requests.Session`` (every request then goes through ``requests``).
- ``Locker`` and ``Locker fenced``: ``locker.acquire(key).release()``, the whole public path;
  ``Locker direct_handoff`` the same on a backend with ``direct_handoff=True``.
- ``tooz (etcd3gw driver)``: a started tooz coordinator (``etcd3+http://`` on the same member),
  ``coordinator.get_lock(name)``, ``lock.acquire(blocking=False)`` and ``lock.release()``. When
  tooz or etcd3gw is missing (``pip install -e '.[bench]'``) or the driver cannot start, the
  output says so in its place.

Contended: ``--workers`` processes (and then one alone) loop ``locker.acquire(key).release()``
on one key for ``--seconds``, first with the default hand-off, then with ``direct_handoff``;
the grants per second of all together against one process alone, the fewest grants of one
worker as a fraction of a fair share, and the attempts that found the key held per grant (each
one a transaction, after a lease grant or a keep-alive of the lease the worker's last refused
attempt kept; a queued waiter's, its transaction alone).

Hand-off: a waiter blocks in its library's own blocking acquire (``Locker.acquire``, woken
through the watch, and again with ``direct_handoff`` on both lockers, where the release hands it
the key; tooz's ``lock.acquire(blocking=60)``) while another client holds the key; the time from the start of
the holder's release to the waiter holding the lock (p50/p99), next to a bare watch delivery:
the time from the start of a release sent by hand (the revoke of the key's lease, as the
``Locker`` releases) to a watch stream (opened by hand) reading its event; and that delivery
followed by the transaction that takes the freed key, sent by hand on the event. Any hand-off
that takes the key after its release costs at least the latter: two commits of the cluster, one
after the other. All of them talk to the same member. Each release comes at a random moment
0.05 to 1.05 s after the waiter started (the bare rows wait the same pauses), so a waiter that
polls (tooz tries again once a second) is caught at every point of its period, not always just
after a failed try, and every row starts its release from the same idle.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import importlib.util
import json
import multiprocessing
import random
import tempfile
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Optional

import requests
from lease_lock import connect
from lease_lock.backends.etcd import EtcdBackend
from lease_lock.locker import Locker

from benchmarks.measure import add_json_argument, grant_cycle, locker_cycle, paired, percentile, write_json

__all__ = ["main"]

TTL = 30.0
TOKEN = "b" * 32
TOOZ = "tooz (etcd3gw driver)"
# Where a release falls after the waiter started: across a whole 1 s polling period.
_FIRST_RELEASE, _RELEASE_SPREAD = 0.05, 1.0
#: A blocking acquire: returns the release of the lock it got.
Hold = Callable[[], Callable[[], Any]]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _raw_cycle(endpoint: str) -> Callable[[], None]:
    """The backend's three requests for one cycle, by hand."""
    name = _b64(f"lease_lock/bench:raw:{uuid.uuid4().hex[:8]}".encode())
    value = _b64(TOKEN.encode() + b"\x00bench")
    guard = [
        {"key": name, "target": "VALUE", "result": "GREATER", "value": _b64(TOKEN.encode())},
        {"key": name, "target": "VALUE", "result": "LESS", "value": _b64(TOKEN.encode() + b"\x01")},
    ]
    parts = urllib.parse.urlsplit(endpoint)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)

    def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
        connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        answer: dict[str, Any] = json.loads(connection.getresponse().read())
        return answer

    lease = post("/v3/lease/grant", {"TTL": int(TTL)})["ID"]

    def cycle() -> None:
        post("/v3/lease/keepalive", {"ID": lease})
        put = {"key": name, "value": value, "lease": lease}
        post("/v3/kv/txn", {
            "compare": [{"key": name, "target": "CREATE", "result": "EQUAL", "create_revision": "0"}],
            "success": [{"request_put": put}],
            "failure": [{"request_txn": {
                "compare": guard,
                "success": [{"request_put": {**put, "prev_kv": True}}, {"request_range": {"key": name}}],
            }}],
        })
        released = post("/v3/kv/txn", {"compare": guard, "success": [{"request_delete_range": {"key": name}}]})
        assert released.get("succeeded"), released

    return cycle


def _tooz_coordinator(endpoint: str) -> Any:
    """A started tooz coordinator on ``endpoint`` through the etcd3gw driver, or the reason
    (a str) why there is none here."""
    try:
        from tooz import coordination
    except ImportError as error:
        return f"not run: tooz is not installed ({error}); pip install -e '.[bench]'"
    if importlib.util.find_spec("etcd3gw") is None:
        return "not run: etcd3gw (tooz's etcd3+http driver) is not installed; pip install -e '.[bench]'"
    try:
        coordinator = coordination.get_coordinator(
            f"etcd3+{endpoint}", f"bench-{uuid.uuid4().hex[:8]}".encode()
        )
        coordinator.start()
    except Exception as error:  # noqa: BLE001 - whatever the driver raises is the reason to print
        return f"not run: the driver did not start on {endpoint}: {error!r}"
    return coordinator


def _tooz_cycle(coordinator: Any) -> Callable[[], None]:
    """One non-blocking acquire and release of a tooz lock on a name of its own."""
    name = f"bench:tooz:{uuid.uuid4().hex[:8]}".encode()

    def cycle() -> None:
        lock = coordinator.get_lock(name)
        if not lock.acquire(blocking=False):
            raise RuntimeError("tooz: uncontended acquire failed")
        lock.release()

    return cycle


def _wait_for(wait: Hold, held_at: list[float], releases: list[Callable[[], Any]]) -> None:
    releases.append(wait())
    held_at.append(time.perf_counter())


def _handoffs(hold: Hold, wait: Hold, count: int) -> list[float]:
    """Seconds from the start of each release of ``hold``'s lock to ``wait`` holding it."""
    pauses = random.Random(25)
    delays: list[float] = []
    for _ in range(count):
        release = hold()
        held_at: list[float] = []
        releases: list[Callable[[], Any]] = []
        thread = threading.Thread(target=_wait_for, args=(wait, held_at, releases))
        thread.start()
        # Let the waiter fail its attempt and go to sleep (on the watch, or until its next poll).
        time.sleep(_FIRST_RELEASE + pauses.random() * _RELEASE_SPREAD)
        started = time.perf_counter()
        release()
        thread.join(120)
        if not held_at:
            raise RuntimeError("the waiter never got the lock")
        delays.append(held_at[0] - started)
        releases[0]()
    return delays


def _locker_handoffs(endpoint: str, count: int, direct: bool = False) -> list[float]:
    """Hand-offs between two lockers, each on a backend of its own, both on ``endpoint``; with
    ``direct``, both backends hand keys over by ``direct_handoff``."""
    holder = Locker(EtcdBackend([endpoint], direct_handoff=direct), ttl=TTL)
    waiter = Locker(EtcdBackend([endpoint], direct_handoff=direct), ttl=TTL)
    key = f"bench:handoff:{uuid.uuid4().hex[:8]}"
    try:
        return _handoffs(
            lambda: holder.acquire(key).release, lambda: waiter.acquire(key, timeout=60).release, count
        )
    finally:
        for locker in (holder, waiter):
            locker.close()
            locker.backend.close()


def _tooz_handoffs(holder: Any, waiter: Any, count: int) -> list[float]:
    """Hand-offs between two tooz coordinators: the waiter's blocking acquire polls."""
    name = f"bench:tooz-handoff:{uuid.uuid4().hex[:8]}".encode()

    def take(coordinator: Any, blocking: Any) -> Callable[[], Any]:
        lock = coordinator.get_lock(name)
        if not lock.acquire(blocking=blocking):
            raise RuntimeError("tooz: a blocking acquire gave up")
        return lock.release  # type: ignore[no-any-return]

    return _handoffs(lambda: take(holder, True), lambda: take(waiter, 60), count)


def _watch_deliveries(endpoint: str, count: int, *, take: bool = False) -> list[float]:
    """Seconds from the start of a release sent by hand to a bare watch stream reading it; with
    ``take``, to the answer of the transaction that takes the freed key, sent by hand on that
    event (the least any hand-off that takes the key after its release can cost).

    Each release is made as the ``Locker``'s is, at the same moments: the revoke of the lease
    the key is on, at the same random pauses as the hand-offs of :func:`_handoffs`, so that the
    rows differ only in what the library does."""
    session = requests.Session()
    name = f"bench:watch:{uuid.uuid4().hex[:8]}".encode()
    stream = requests.post(
        endpoint + "/v3/watch",
        data=json.dumps({"create_request": {"key": _b64(name), "filters": ["NOPUT"]}}),
        stream=True,
        timeout=(10, None),
    )
    lines = stream.iter_lines(chunk_size=None)
    next(lines)  # the "created" answer
    take_if_free = json.dumps({
        "compare": [{"key": _b64(name), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}],
        "success": [{"request_put": {"key": _b64(name), "value": _b64(b"y")}}],
    })
    pauses = random.Random(25)
    delays: list[float] = []
    try:
        for _ in range(count):
            lease = session.post(endpoint + "/v3/lease/grant", data=json.dumps({"TTL": int(TTL)}), timeout=10).json()
            put = json.dumps({"key": _b64(name), "value": _b64(b"x"), "lease": lease["ID"]})
            session.post(endpoint + "/v3/kv/put", data=put, timeout=10)
            time.sleep(_FIRST_RELEASE + pauses.random() * _RELEASE_SPREAD)
            started = time.perf_counter()
            session.post(endpoint + "/v3/lease/revoke", data=json.dumps({"ID": lease["ID"]}), timeout=10)
            for line in lines:
                if line and b"DELETE" in line:
                    break
            if take:
                answer = session.post(endpoint + "/v3/kv/txn", data=take_if_free, timeout=10).json()
                if not answer.get("succeeded"):
                    raise RuntimeError(f"the freed key was not taken: {answer}")
            delays.append(time.perf_counter() - started)
    finally:
        stream.close()
        session.close()
    return delays


def _contend(url: str, key: str, seconds: float, ready: Any, start: Any, grants: Any) -> None:
    """One worker process: acquire/release ``key`` in a loop for ``seconds``; count its grants
    and its attempts that found the key held."""
    refused = [0]

    def count_refusals(event: Any) -> None:
        if event.type == "contended":
            refused[0] += 1

    with connect(url, ttl=TTL, on_event=count_refusals) as locker:
        ready.put(True)
        start.wait()
        deadline = time.monotonic() + seconds
        count = 0
        while time.monotonic() < deadline:
            locker.acquire(key, timeout=60).release()
            count += 1
        grants.put((count, refused[0]))


def _contended(url: str, workers: int, seconds: float) -> list[tuple[int, int]]:
    """Grants and refused attempts per worker when ``workers`` processes loop on one key for
    ``seconds``."""
    context = multiprocessing.get_context("spawn")
    start = context.Event()
    ready, grants = context.Queue(), context.Queue()
    key = f"bench:contended:{uuid.uuid4().hex[:8]}"
    processes = [
        context.Process(target=_contend, args=(url, key, seconds, ready, start, grants)) for _ in range(workers)
    ]
    for process in processes:
        process.start()
    # Spawned interpreters take a while to import; the clock starts for all of them at once.
    for _ in processes:
        ready.get(timeout=120)
    start.set()
    counts = [grants.get(timeout=seconds + 120) for _ in processes]
    for process in processes:
        process.join(60)
    return counts


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Run every contestant and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--url", default="etcd://127.0.0.1:2379")
    parser.add_argument("--start", type=int, default=0, metavar="N", help="start a private N-member cluster")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--handoffs", type=int, default=50)
    parser.add_argument("--workers", type=int, default=8, help="processes of the contended row")
    add_json_argument(parser)
    args = parser.parse_args(argv)
    factory: Any = None
    url = args.url
    if args.start:
        from tests.support.etcd_server import EtcdFactory

        factory = EtcdFactory(Path(tempfile.mkdtemp(prefix="bench-etcd-")))
        url = factory.cluster(members=args.start).url
    try:
        results = _run(url, args)
    finally:
        if factory is not None:
            factory.close()
    write_json(args.json, "etcd_cycle", argv, results)


def _run(url: str, args: argparse.Namespace) -> dict[str, Any]:
    # Every contestant talks to the same one member, so that none gains from a closer one.
    first = EtcdBackend.from_url(url).endpoints[0]
    floor = _raw_cycle(first)
    backend = EtcdBackend([first])
    session = requests.Session()
    on_session = EtcdBackend([first], session=session)
    locker = Locker(EtcdBackend([first]), ttl=TTL)
    fenced = Locker(EtcdBackend([first]), ttl=TTL, fencing=True)
    direct = Locker(EtcdBackend([first], direct_handoff=True), ttl=TTL)
    coordinators = [_tooz_coordinator(first) for _ in range(3)]
    missing = next((item for item in coordinators if isinstance(item, str)), None)
    contestants: dict[str, Any] = {
        "backend acquire/release": grant_cycle(backend.acquire, backend.release, TOKEN, TTL),
        "backend acquire/release, session=": grant_cycle(on_session.acquire, on_session.release, TOKEN, TTL),
        "Locker": locker_cycle(locker),
        "Locker fenced": locker_cycle(fenced),
        "Locker direct_handoff": locker_cycle(direct),
        TOOZ: missing or _tooz_cycle(coordinators[0]),
    }
    print(f"etcd at {url}; every cycle on {first}; {args.seconds:g} s per pairing")
    print(f"{'contestant':40} {'cycles/s':>9} {'floor/s':>9} {'ratio':>7}")
    cycles: dict[str, Any] = {}
    ahead: Optional[float] = None
    try:
        for name, contestant in contestants.items():
            if isinstance(contestant, str):
                print(f"{name:40} {contestant}")
                cycles[name] = {"not_run": contestant}
                continue
            pairing = paired(floor, contestant, args.seconds)
            cycles[name] = {"rate": pairing.rate, "floor_rate": pairing.floor_rate, "ratio": pairing.ratio}
            print(f"{name:40} {pairing.rate:9.0f} {pairing.floor_rate:9.0f} {pairing.ratio:6.2f}x")
        if "ratio" in cycles[TOOZ]:
            # Each against the same floor in its own pairing: the ratio of ratios cancels the
            # drift of the cluster between pairings.
            ahead = cycles["Locker"]["ratio"] / cycles[TOOZ]["ratio"]
            print(f"{'Locker vs tooz (ratio of their ratios)':40} {'':9} {'':9} {ahead:6.2f}x")
        handoffs = {
            "Locker hand-off (watch)": _locker_handoffs(first, args.handoffs),
            "Locker hand-off (direct_handoff)": _locker_handoffs(first, args.handoffs, direct=True),
            f"{TOOZ} hand-off (polls)": (
                missing or _tooz_handoffs(coordinators[1], coordinators[2], args.handoffs)
            ),
            "bare watch delivery": _watch_deliveries(first, args.handoffs),
            "bare watch delivery, then take": _watch_deliveries(first, args.handoffs, take=True),
        }
    finally:
        for item in (locker, fenced, direct):
            item.close()
            item.backend.close()
        backend.close()
        on_session.close()
        session.close()
        for coordinator in coordinators:
            if not isinstance(coordinator, str):
                coordinator.stop()
    print(f"{'hand-off':40} {'p50 ms':>9} {'p99 ms':>9}")
    latencies: dict[str, Any] = {}
    for name, delays in handoffs.items():
        if isinstance(delays, str):
            print(f"{name:40} {delays}")
            latencies[name] = {"not_run": delays}
            continue
        latencies[name] = {"p50": percentile(delays, 0.5), "p99": percentile(delays, 0.99)}
        print(f"{name:40} {percentile(delays, 0.5) * 1000:9.2f} {percentile(delays, 0.99) * 1000:9.2f}")
    for row, label in (("Locker hand-off (watch)", "Locker"), ("Locker hand-off (direct_handoff)", "direct")):
        for bare, what in (("bare watch delivery", "watch"), ("bare watch delivery, then take", "watch, then take")):
            gap = (latencies[row]["p50"] - latencies[bare]["p50"]) * 1000
            print(f"{label + ' p50 minus ' + what:40} {gap:9.2f}")
    print(f"{'contended (one key)':40} {'grants/s':>9} {'vs 1 proc':>9} {'fewest/fair':>11} {'refused/grant':>13}")
    contended = {}
    direct_url = url + ("&" if "?" in url else "?") + "direct_handoff=true"
    for name, contender in (("Locker", url), ("Locker direct_handoff", direct_url)):
        contended[name] = _contention(contender, name, args)
    return {
        "contended": contended["Locker"],
        "contended_direct_handoff": contended["Locker direct_handoff"],
        "cycles": cycles,
        "locker_vs_tooz": ahead,
        "handoffs": latencies,
        "handoff_p50": latencies["Locker hand-off (watch)"]["p50"],
        "direct_handoff_p50": latencies["Locker hand-off (direct_handoff)"]["p50"],
        "watch_p50": latencies["bare watch delivery"]["p50"],
        "watch_then_take_p50": latencies["bare watch delivery, then take"]["p50"],
    }


def _contention(url: str, name: str, args: argparse.Namespace) -> dict[str, Any]:
    """One process alone, then ``args.workers`` together, on one key at ``url``; printed rows."""
    alone = _contended(url, 1, args.seconds)[0][0] / args.seconds
    results = _contended(url, args.workers, args.seconds)
    counts = [grants for grants, _refused in results]
    total = sum(counts) / args.seconds
    fewest = min(counts) / (sum(counts) / len(counts)) if sum(counts) else 0.0
    refused = sum(refusals for _grants, refusals in results) / max(1, sum(counts))
    print(f"{name + ', 1 process':40} {alone:9.1f}")
    print(f"{f'{name}, {args.workers} processes':40} {total:9.1f} {total / alone:8.2f}x {fewest:11.2f} {refused:13.2f}")
    return {
        "alone": alone, "workers": args.workers, "total": total, "fewest_of_fair": fewest, "refused_per_grant": refused,
    }


if __name__ == "__main__":
    main()
