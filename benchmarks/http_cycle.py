"""Acquire+release cycles through the HTTP lock service against a bare WSGI floor, and hand-offs.

Cycles: for each store, number of server processes and number of concurrent clients, the same
client load (``HttpBackend.acquire_fenced`` + ``release``, one key per client, keep-alive
sessions) runs against a **bare WSGI app** that answers the same statuses and bodies (201 with
a fence, 204) at once, and against ``lease-lock serve``. On Redis rows it also runs against a
**store-only app**: the bare app making the one raw store call the service's request makes
(``SET NX PX`` for a grant, the token-checked ``EVALSHA`` delete for a release) before it
answers, which shows how much of the gap to the bare app is the store's round trip itself. On
Redis rows it also runs against a **backend-only app**: the bare app making the store calls the
service's request makes, through the same backend (``RedisBackend.grant_if_free``, the fenced
grant script, and ``RedisBackend.release``, the release script that hands the key on). Redis
then does the service's own work and the client side is the service's, so what the service
costs beyond it is the service's own layer: routing, the credential, the budget, validation,
the answer and its access line.
Every side runs under the same server code and settings (``lease_lock.server.serving.serve``:
waitress, keep-alive, the same threads and worker processes) and the same clients; the ratio is
service/bare cycles per second, "vs store-only" service/store-only and "vs backend-only"
service/backend-only. The sides take turns in
short slices, each following each other equally often, so that a busy stretch of a shared
machine lands on all of them. Clients are spread over up to 8 processes so that the client's
own GIL does not cap the figure. Each side's server CPU per cycle (all its processes' threads,
from ``/proc``) is counted over the same slices: unlike the rates it hardly depends on what else
the machine runs, so it shows what the service's own work costs when the rates are noisy.

Hand-off, on each store: a waiter blocked in ``Locker.acquire`` while another client releases;
latency from the release call to the waiter's grant, with the ``Prefer: wait`` extension and
without it (``--max-waits 0``: the waiter sleeps until the holder's expiry or one second). On
Redis the same clients also hand off through a **wake-up floor**: the store-only app holding a
refused ``Prefer: wait`` request in ``BLPOP`` on a wake-up list until a release (the
token-checked delete, then ``LPUSH`` to that list) wakes it, and then granting with ``SET NX``.
That is the chain of the service's hand-off (client, server thread, store, the waiting server
thread, one more store round trip, the waiting client) with none of lease_lock's code on the
server: "vs floor" is the service's p50 over the floor's, so 1.00 means the service hands a
key on as fast as the wake-ups themselves go, and the machine's wake-up latency cancels out of
it. The rows of a store take turns, one hand-off each.

    python -m benchmarks.http_cycle [--seconds 3] [--clients 1,8,32] [--processes 1,2]
        [--stores memory,redis] [--redis-url redis://127.0.0.1:6379/0] [--handoffs 30]
        [--baseline CHECKOUT] [--variant ARGS]

With ``--baseline`` the service of another checkout (an earlier commit's work tree) runs as one
more side, in the same turns: "vs before" is this code's rate over that code's. With
``--variant ARGS`` this code's service runs once more with those extra ``serve`` arguments
(``--variant "--log-level warning"``), in the same turns: "variant c/s", its CPU per cycle and,
on Redis rows, its rate over the store-only app's.

``memory://`` lives in one process, so it is measured with one server process only.
"""

from __future__ import annotations

import argparse
import functools
import math
import multiprocessing
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Generator, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Callable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lease_lock import Locker
from lease_lock.backends.http import HttpBackend
from lease_lock.server import create_key

from benchmarks.measure import add_json_argument, in_turns, percentile, write_json

_THREADS = 8
_MAX_CLIENT_PROCESSES = 8
# Seconds of one slice of the alternating measurement.
_SLICE = 0.2


# -- the floor: a bare WSGI app answering like the service -------------------------------------


_STORE_TTL_MS = 30_000


def bare_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
    """Answers like the service at once, with no store: a grant with 201 and a lease body, a
    release with 204, a read with 200; the same headers as the service's answers (the request id
    echoed, ``Cache-Control``, the wait extension's announcement) in the same order."""
    return _answer(environ, start_response, None)


WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], list[bytes]]


def store_only_app(redis_url: str) -> WsgiApp:
    """:func:`bare_app` plus the one raw Redis call of each request: ``SET key token NX PX`` for a
    grant (409 when it is refused), the token-checked ``EVALSHA`` delete for a release."""
    import redis

    from benchmarks.redis_cycle import UNLOCK

    client = redis.Redis.from_url(redis_url)
    compare_and_delete = client.register_script(UNLOCK)

    def grant(key: str, token: str) -> bool:
        return bool(client.set(key, token, nx=True, px=_STORE_TTL_MS))

    def release(key: str, token: str) -> bool:
        return bool(compare_and_delete(keys=[key], args=[token]))

    return _floor_app("bench-store-only", grant, release)


#: The hand-off row of the wake-up floor.
_WAKE_FLOOR_ROW = "wake-up floor (BLPOP, SET NX)"
#: How long a wake-up signal stays in its list when nobody waits for it (milliseconds).
_WAKE_TTL_MS = 1_000
#: The wake-up floor's release: the token-checked delete, then a signal to one waiting request.
RELEASE_AND_WAKE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('DEL', KEYS[2])
redis.call('LPUSH', KEYS[2], 1)
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1
"""


def wake_floor_app(redis_url: str) -> WsgiApp:
    """:func:`store_only_app` whose refused grant waits out a ``Prefer: wait=N`` in ``BLPOP`` on
    the key's wake-up list and then tries ``SET NX`` again (answering with
    ``Preference-Applied``), and whose release pushes to that list (:data:`RELEASE_AND_WAKE`):
    the least a server can do to hand a released key to a waiting request over Redis."""
    import redis

    client = redis.Redis.from_url(redis_url)
    release_and_wake = client.register_script(RELEASE_AND_WAKE)

    def grant(key: str, token: str) -> bool:
        return bool(client.set(key, token, nx=True, px=_STORE_TTL_MS))

    def wait_for_grant(key: str, token: str, wait: float) -> bool:
        deadline = time.monotonic() + wait
        while not grant(key, token):
            left = deadline - time.monotonic()
            if left < 0.01:
                return False
            client.blpop([key + ":wake"], timeout=left)
        return True

    def release(key: str, token: str) -> bool:
        return bool(release_and_wake(keys=[key, key + ":wake"], args=[token, _WAKE_TTL_MS]))

    return _floor_app("bench-wake-floor", grant, release, wait_for_grant)


def backend_only_app(redis_url: str) -> WsgiApp:
    """:func:`bare_app` plus the store calls of the service's requests, through the backend the
    service uses: ``RedisBackend.grant_if_free`` for a grant (409 when the key is held),
    ``RedisBackend.release`` for a release."""
    from lease_lock.backends.redis import RedisBackend

    backend = RedisBackend.from_url(redis_url)

    def grant(key: str, token: str) -> bool:
        return isinstance(backend.grant_if_free(key, token, _STORE_TTL_MS / 1000, "bench"), int)

    return _floor_app("bench-backend-only", grant, backend.release)


#: What a floor's store call answers: done (granted, released), and headers to add.
StoreAnswer = tuple[bool, list[tuple[str, str]]]
_PREFER_WAIT = re.compile(r"wait=([0-9]+(?:\.[0-9]+)?)")


def _floor_app(
    prefix: str,
    grant: Callable[[str, str], bool],
    release: Callable[[str, str], bool],
    wait_for_grant: Optional[Callable[[str, str, float], bool]] = None,
) -> WsgiApp:
    """:func:`bare_app` calling ``grant`` for a ``POST`` and ``release`` for a ``DELETE``, on the
    request's path under ``prefix`` with the request's token; with ``wait_for_grant``, a ``POST``
    with ``Prefer: wait=N`` calls that instead, for N seconds, and says it waited."""

    def store_call(method: str, environ: dict[str, Any]) -> StoreAnswer:
        key = prefix + environ["PATH_INFO"]
        token = environ.get("HTTP_X_VOLCANO_LOCK_TOKEN", "")
        if method == "POST":
            preferred = _PREFER_WAIT.search(environ.get("HTTP_PREFER", ""))
            if preferred and wait_for_grant is not None:
                return wait_for_grant(key, token, float(preferred[1])), [("Preference-Applied", preferred[0])]
            return grant(key, token), []
        if method == "DELETE":
            return release(key, token), []
        return True, []

    return functools.partial(_answer, store_call=store_call)


#: The floors of the cycles served on a store, by name (``--serve-floor``).
FLOORS: dict[str, Callable[[str], WsgiApp]] = {"store-only": store_only_app, "backend-only": backend_only_app}
#: Every app ``--serve-floor`` serves: the cycles' floors and the hand-off's.
_SERVED_FLOORS: dict[str, Callable[[str], WsgiApp]] = {**FLOORS, "wake": wake_floor_app}


def _answer(
    environ: dict[str, Any],
    start_response: Callable[..., Any],
    store_call: Optional[Callable[[str, dict[str, Any]], StoreAnswer]],
) -> list[bytes]:
    environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    method = environ["REQUEST_METHOD"]
    request_id = environ.get("HTTP_X_VOLCANO_REQUEST_ID") or str(uuid.uuid4())
    done, headers = (True, []) if store_call is None else store_call(method, environ)
    if method == "POST" and not done:
        status = "409 Conflict"
        body = b'{"error": "the lock is held by another owner", "code": "lock_held"}'
    elif method == "POST":
        status = "201 Created"
        body = b'{"expires_at": "2099-01-01T00:00:00.000Z", "fencing_token": 1000000000000001}'
    elif method == "DELETE":
        status, body = "204 No Content", b""
        headers.append(("X-Lease-Lock-Released", "true" if done else "false"))
    else:
        status, body = "200 OK", b'{"held": false}'
    headers.append(("X-Volcano-Request-Id", request_id))
    if body:
        headers += [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
    headers += [("Cache-Control", "no-store"), ("X-Lease-Lock-Wait", "30"), ("X-Lease-Lock-Wait-Step", "0.001")]
    start_response(status, headers)
    return [body]


def _serve_bare(workers: int, redis_url: Optional[str], floor: str) -> None:
    """Serve :func:`bare_app`, or with ``redis_url`` the app of :data:`FLOORS` named ``floor`` on
    that store."""
    from lease_lock.server.serving import serve

    def announce(url: str, _workers: int) -> None:
        print(f"bare: serving on {url}", file=sys.stderr, flush=True)

    def build() -> WsgiApp:
        # Built in each worker process, so that each has its own store connections.
        return bare_app if redis_url is None else _SERVED_FLOORS[floor](redis_url)

    serve(build, "127.0.0.1", 0, workers=workers, threads=_THREADS, announce=announce)


def _server_pids(pid: int) -> list[int]:
    """``pid`` and its child processes (the worker processes of ``serve --workers N``)."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[1]) == pid:
            children.append(int(stat.parent.name))
    return [pid, *children]


def _cpu_seconds(pids: list[int]) -> float:
    """CPU time the threads of ``pids`` have run, in seconds (nanosecond ``schedstat`` counts;
    ``nan`` without ``/proc``)."""
    total = 0
    try:
        for pid in pids:
            for task in Path(f"/proc/{pid}/task").iterdir():
                total += int((task / "schedstat").read_text().split()[0])
    except OSError:
        return math.nan
    return total / 1e9


@contextmanager
def _server(command: list[str], log: Path, cwd: Optional[str] = None) -> Iterator[tuple[str, int]]:
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}, cwd=cwd
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            text = log.read_text(errors="replace")
            if "serving on " in text:
                yield text.split("serving on ", 1)[1].split()[0], process.pid
                break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server did not start:\n{text}")
            time.sleep(0.05)
    finally:
        process.terminate()
        process.wait(30)


def _bare_server(workers: int, tmp: Path, redis_url: Optional[str] = None, floor: str = "store-only") -> Any:
    command = [sys.executable, "-m", "benchmarks.http_cycle", "--serve-bare", "--workers", str(workers)]
    if redis_url is not None:
        command += ["--serve-store", redis_url, "--serve-floor", floor]
    return _server(command, tmp / f"bare-{workers}-{time.monotonic_ns()}.log")


def _service(store: str, keys_file: Path, workers: int, tmp: Path, *extra: str, cwd: Optional[str] = None) -> Any:
    """``lease-lock serve`` on ``store``; with ``cwd``, the ``lease_lock`` of the checkout there."""
    command = [
        sys.executable, "-m", "lease_lock", "serve", "--url", store, "--keys", str(keys_file),
        "--bind", "127.0.0.1:0", "--workers", str(workers), "--threads", str(_THREADS),
        "--rate-limit", "1000000000", *extra,
    ]
    return _server(command, tmp / f"service-{workers}-{time.monotonic_ns()}.log", cwd)


# -- the client load -------------------------------------------------------------------------


def _client_process(
    urls: tuple[str, ...], key: str, threads: int, ready: Any, start: Any, slices: int, out: Any
) -> None:
    """``threads`` clients, each running cycles against every server in turn by slice (see
    _slice_side) from the moment ``start`` holds, once every client passed ``ready`` (warm); puts
    the cycle times of each side, in the order of ``urls``."""
    sides = len(urls)

    def loop(index: int, times: list[list[float]]) -> None:
        backends = [HttpBackend(url, key) for url in urls]
        name = f"cycle.{uuid.uuid4().hex[:12]}.{index}"
        tokens = [backend.new_token() for backend in backends]
        for backend, token in zip(backends, tokens):
            for _ in range(10):  # warm the connection and the code paths
                backend.acquire_fenced(name, token, 30, "bench")
                backend.release(name, token)
        ready.wait()  # every client is warm, and the start is set
        began_at = start.value
        time.sleep(max(0.0, began_at - time.monotonic()))
        clock = time.perf_counter
        while True:
            side = _slice_side(time.monotonic() - began_at, slices, sides)
            if side is None:
                break
            backend, token = backends[side], tokens[side]
            began = clock()
            backend.acquire_fenced(name, token, 30, "bench")
            backend.release(name, token)
            times[side].append(clock() - began)
        for backend in backends:
            backend.close()

    per_thread: list[list[list[float]]] = [[[] for _ in urls] for _ in range(threads)]
    workers = [threading.Thread(target=loop, args=(i, per_thread[i])) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    out.put([[t for times in per_thread for t in times[side]] for side in range(sides)])


def _set_start(start: Any) -> None:
    """Run once, by the last client to be warm: everybody starts a moment from now."""
    start.value = time.monotonic() + 0.1


def _slice_side(elapsed: float, slices: int, sides: int = 2) -> Optional[int]:
    """Which of ``sides`` servers the clients load ``elapsed`` seconds into a run of ``slices``
    slices (0 is the bare app), ``None`` once the run is over.

    Slices come in rounds of one slice per side, each round's order the previous one's turned by
    one place, so that no side always follows the same other (with two sides the order flips
    every pair, as in ``benchmarks.measure.paired``).
    """
    index = int(elapsed // _SLICE)
    if index >= slices:
        return None
    turn, place = divmod(index, sides)
    return (place + turn) % sides


Figures = tuple[float, float, float, float]


def _alternating(
    urls: tuple[str, ...], key: str, clients: int, seconds: float, pids: Optional[list[list[int]]] = None
) -> list[Figures]:
    """The loads of every server of ``urls`` in turns of _SLICE seconds, ``seconds`` per server,
    by the same client threads, so that a busy stretch of a shared machine falls on every side;
    each side's cycles/s, p50/p99 (ms) over all its slices and, given the server processes of
    each side (``pids``), their CPU time per cycle in microseconds (else ``nan``), in the order
    of ``urls``."""
    sides = len(urls)
    slices = sides * max(1, round(seconds / _SLICE))
    context = multiprocessing.get_context("fork")
    processes = min(clients, _MAX_CLIENT_PROCESSES)
    queue = context.Queue()
    # Every client starts at the same moment (CLOCK_MONOTONIC is system-wide), set once all are warm.
    start = context.Value("d", 0.0)
    ready = context.Barrier(clients + 1, action=functools.partial(_set_start, start))
    spawned = []
    for index in range(processes):
        threads = clients // processes + (1 if index < clients % processes else 0)
        process = context.Process(target=_client_process, args=(urls, key, threads, ready, start, slices, queue))
        process.start()
        spawned.append(process)
    ready.wait(timeout=120)
    # Every client is warm: from here on each server serves only the measured cycles.
    cpu_before = [_cpu_seconds(side) for side in pids] if pids else None
    observed: list[list[float]] = [[] for _ in urls]
    for _ in spawned:
        for side, times in enumerate(queue.get(timeout=120 + sides * seconds)):
            observed[side].extend(times)
    cpu = [_cpu_seconds(side) - before for side, before in zip(pids, cpu_before)] if pids and cpu_before else None
    for process in spawned:
        process.join(30)
    side_seconds = slices // sides * _SLICE
    results = []
    for side, times in enumerate(observed):
        if not times:
            raise RuntimeError("no cycle completed")
        cpu_per_cycle = cpu[side] / len(times) * 1e6 if cpu is not None else math.nan
        results.append(
            (len(times) / side_seconds, percentile(times, 0.5) * 1000, percentile(times, 0.99) * 1000, cpu_per_cycle)
        )
    return results


# -- hand-off ----------------------------------------------------------------------------------


def _handoff_samples(url: str, key: str) -> Generator[float, None, None]:
    """Hand-offs between two clients of the server at ``url``, one latency (seconds) per
    ``next()``."""
    holder, waiter = Locker(HttpBackend(url, key), ttl=30), Locker(HttpBackend(url, key), ttl=30)
    try:
        while True:
            yield _handoff(holder, waiter, f"handoff.{uuid.uuid4().hex[:12]}")
    finally:
        holder.close()
        waiter.close()


def _handoff(holder: Locker, waiter: Locker, name: str) -> float:
    """Seconds from ``holder``'s release of ``name`` to ``waiter``'s grant, the waiter blocked in
    ``acquire`` before the release."""
    held = holder.acquire(name)
    granted: list[float] = []

    def wait_for_it() -> None:
        lock = waiter.acquire(name, timeout=60)
        granted.append(time.perf_counter())
        lock.release()

    thread = threading.Thread(target=wait_for_it)
    thread.start()
    time.sleep(0.3)  # the waiter is blocked (and watching) before the release
    released = time.perf_counter()
    held.release()
    thread.join(60)
    return granted[0] - released


def main(argv: Optional[list[str]] = None) -> None:
    """Run the measurements and print the tables (and write them as JSON with ``--json``)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per measurement")
    parser.add_argument("--clients", default="1,8,32", help="concurrent clients (comma-separated)")
    parser.add_argument("--processes", default="1,2", help="server processes (comma-separated)")
    parser.add_argument("--stores", default="memory,redis", help="memory and/or redis")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--handoffs", type=int, default=30, help="hand-offs per row (0: skip)")
    parser.add_argument(
        "--baseline",
        default=None,
        metavar="CHECKOUT",
        help="also serve the lease_lock of another checkout (e.g. `git worktree add /tmp/before COMMIT`) in the"
        " same turns, as a before/after comparison in one run",
    )
    parser.add_argument(
        "--variant",
        default=None,
        metavar="ARGS",
        help="also serve this code with these extra `serve` arguments in the same turns (e.g. '--log-level warning')",
    )
    parser.add_argument("--serve-bare", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--serve-store", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--serve-floor", choices=sorted(_SERVED_FLOORS), default="store-only", help=argparse.SUPPRESS)
    add_json_argument(parser)
    args = parser.parse_args(argv)
    if args.serve_bare:
        _serve_bare(args.workers, args.serve_store, args.serve_floor)
        return

    clients = [int(n) for n in args.clients.split(",")]
    processes = [int(n) for n in args.processes.split(",")]
    stores = {"memory": "memory://", "redis": args.redis_url}
    with tempfile.TemporaryDirectory() as directory:
        tmp = Path(directory)
        keys_file = tmp / "keys.toml"
        _, key = create_key(keys_file, f"bench-{uuid.uuid4().hex[:8]}", "full")
        print(f"acquire+release cycles, {args.seconds:.1f} s each, {_THREADS} threads per server process")
        header = f"{'store':<8}{'procs':>6}{'clients':>8}{'bare c/s':>10}{'service c/s':>12}{'ratio':>7}"
        header += f"{'p50 ms':>8}{'p99 ms':>8}{'bare p50':>9}{'bare p99':>9}"
        # Server CPU per cycle, in microseconds, of the bare app, the service, the store-only app
        # and the backend-only app.
        header += f"{'bare us':>8}{'svc us':>8}{'store us':>9}{'backend us':>11}"
        if args.baseline:
            header += f"{'before c/s':>11}{'before us':>10}{'vs before':>10}"
        if args.variant:
            header += f"{'variant c/s':>12}{'variant us':>11}{'variant/store-only':>19}"
        print(header + f"{'store-only c/s':>15}{'vs store-only':>14}{'backend-only c/s':>17}{'vs backend-only':>16}")
        rows: list[dict[str, Any]] = []
        handoffs: list[dict[str, Any]] = []
        for store in args.stores.split(","):
            for workers in processes:
                if store == "memory" and workers > 1:
                    continue  # one process's memory is not shared
                for count in clients:
                    with ExitStack() as servers:
                        started = [servers.enter_context(_bare_server(workers, tmp))]
                        if store == "redis":
                            for floor in FLOORS:
                                floor_server = _bare_server(workers, tmp, stores[store], floor)
                                started.append(servers.enter_context(floor_server))
                        if args.baseline:
                            service = _service(stores[store], keys_file, workers, tmp, cwd=args.baseline)
                            started.append(servers.enter_context(service))
                        if args.variant:
                            variant = _service(stores[store], keys_file, workers, tmp, *shlex.split(args.variant))
                            started.append(servers.enter_context(variant))
                        started.append(servers.enter_context(_service(stores[store], keys_file, workers, tmp)))
                        urls = tuple(url for url, _pid in started)
                        pids = [_server_pids(pid) for _url, pid in started]
                        figures = _alternating(urls, key, count, args.seconds, pids)
                    bare, served = figures[0], figures[-1]
                    store_only, backend_only = (figures[1], figures[2]) if store == "redis" else (None, None)
                    variant_figures = figures[-2] if args.variant else None
                    before = figures[-3 if args.variant else -2] if args.baseline else None
                    row = {
                        "store": store, "processes": workers, "clients": count, "bare_rate": bare[0],
                        "service_rate": served[0], "ratio": served[0] / bare[0], "p50_ms": served[1],
                        "p99_ms": served[2], "bare_p50_ms": bare[1], "bare_p99_ms": bare[2],
                        "bare_cpu_us": bare[3], "service_cpu_us": served[3],
                    }
                    before_cells = ""
                    if before is not None:
                        row.update(baseline_rate=before[0], ratio_to_baseline=served[0] / before[0])
                        row.update(baseline_cpu_us=before[3])
                        before_cells = f"{before[0]:>11.0f}{before[3]:>10.0f}{served[0] / before[0]:>10.2f}"
                    if variant_figures is not None:
                        row.update(variant_rate=variant_figures[0], variant_cpu_us=variant_figures[3])
                        versus = "-"
                        if store_only is not None:
                            row.update(variant_to_store_only=variant_figures[0] / store_only[0])
                            versus = f"{variant_figures[0] / store_only[0]:.2f}"
                        before_cells += f"{variant_figures[0]:>12.0f}{variant_figures[3]:>11.0f}{versus:>19}"
                    if store_only is not None and backend_only is not None:
                        row.update(
                            store_only_rate=store_only[0], ratio_to_store_only=served[0] / store_only[0],
                            store_only_cpu_us=store_only[3], backend_only_rate=backend_only[0],
                            ratio_to_backend_only=served[0] / backend_only[0], backend_only_cpu_us=backend_only[3],
                        )
                        store_cells = f"{store_only[3]:>9.0f}{backend_only[3]:>11.0f}" + before_cells
                        store_cells += f"{store_only[0]:>15.0f}{served[0] / store_only[0]:>14.2f}"
                        store_cells += f"{backend_only[0]:>17.0f}{served[0] / backend_only[0]:>16.2f}"
                    else:
                        store_cells = f"{'-':>9}{'-':>11}" + before_cells + f"{'-':>15}{'-':>14}{'-':>17}{'-':>16}"
                    rows.append(row)
                    print(
                        f"{store:<8}{workers:>6}{count:>8}{bare[0]:>10.0f}{served[0]:>12.0f}"
                        f"{served[0] / bare[0]:>7.2f}{served[1]:>8.2f}{served[2]:>8.2f}{bare[1]:>9.2f}{bare[2]:>9.2f}"
                        f"{bare[3]:>8.0f}{served[3]:>8.0f}" + store_cells
                    )
        if args.handoffs:
            print(f"\nHand-off latency (ms), {args.handoffs} hand-offs, one server process")
            print(f"{'row':<40}{'p50':>8}{'p99':>8}{'vs floor':>10}")
            for store in args.stores.split(","):
                with ExitStack() as servers:
                    labels = ["with Prefer: wait", "without (--max-waits 0)"]
                    started = [
                        servers.enter_context(_service(stores[store], keys_file, 1, tmp)),
                        servers.enter_context(_service(stores[store], keys_file, 1, tmp, "--max-waits", "0")),
                    ]
                    if store == "redis":
                        labels.append(_WAKE_FLOOR_ROW)
                        started.append(servers.enter_context(_bare_server(1, tmp, stores[store], "wake")))
                    samplers = {label: _handoff_samples(url, key) for label, (url, _pid) in zip(labels, started)}
                    measured = in_turns(samplers, args.handoffs)
                p50s = {label: statistics.median(latencies) * 1000 for label, latencies in measured.items()}
                floor_p50 = p50s.get(_WAKE_FLOOR_ROW)  # measured on Redis only
                for label, latencies in measured.items():
                    p50, p99 = p50s[label], percentile(latencies, 0.99) * 1000
                    row = {"store": store, "mode": label, "p50_ms": p50, "p99_ms": p99}
                    versus = "-"
                    if label == labels[0] and floor_p50 is not None:
                        row.update(floor_p50_ms=floor_p50, ratio_to_floor=p50 / floor_p50)
                        versus = f"{p50 / floor_p50:.2f}"
                    print(f"{f'{store}, {label}':<40}{p50:>8.2f}{p99:>8.2f}{versus:>10}")
                    handoffs.append(row)
    write_json(args.json, "http_cycle", argv, {"rows": rows, "handoffs": handoffs})


if __name__ == "__main__":
    main()
