"""Acquire+release cycles per second through the HTTP lock service, beside its floors.

Three rows, measured in one run on loopback:

- ``store direct``: the same backend called in-process (no HTTP at all);
- ``HTTP floor``: two bare HTTP requests per cycle to a WSGI app that answers 204 at once,
  through the same waitress and ``requests`` session (the cost of the transport alone);
- ``lock service``: ``HttpBackend.acquire_fenced`` + ``release`` against ``create_app``.

The overhead per request is the service's time per request minus the floor's.

    python -m benchmarks.http_cycle [--url memory://] [--seconds 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Optional

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lease_lock.backends import backend_from_url
from lease_lock.backends.http import HttpBackend
from lease_lock.server import create_app, create_key
from tests.support.http_server import ThreadedServer

from benchmarks.measure import add_json_argument, write_json


def _rate(cycle: Callable[[int], None], seconds: float) -> float:
    for index in range(20):  # warm the connection pool and the code paths
        cycle(index)
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        cycle(done)
        done += 1
    return done / (time.perf_counter() - start)


def _empty_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
    environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    start_response("200 OK", [("Content-Length", "2"), ("Content-Type", "application/json")])
    return [b"{}"]


def main(argv: Optional[list[str]] = None) -> None:
    """Run the three measurements and print them side by side."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="memory://", help="backend behind the service (default %(default)s)")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per measurement")
    add_json_argument(parser)
    args = parser.parse_args(argv)

    direct = backend_from_url(args.url)
    token = direct.new_token()
    prefix = uuid.uuid4().hex

    def direct_cycle(index: int) -> None:
        key = f"bench:{prefix}:{index % 64}"
        direct.acquire_fenced(key, token, 30, "bench")
        direct.release(key, token)

    rows = [("store direct", _rate(direct_cycle, args.seconds), 0)]

    with ThreadedServer(_empty_app) as floor_server:
        session = requests.Session()

        def floor_cycle(index: int) -> None:
            session.post(f"{floor_server.url}/locks/k/lease", json={"ttl_seconds": 30}, timeout=10)
            session.post(f"{floor_server.url}/locks/k/lease", timeout=10)

        rows.append(("HTTP floor (2 requests)", _rate(floor_cycle, args.seconds), 2))
        session.close()

    with tempfile.TemporaryDirectory() as tmp:
        keys_file = Path(tmp) / "keys.toml"
        _, key = create_key(keys_file, "bench", "full")
        store = backend_from_url(args.url)
        app = create_app(store, keys_file, rate_limit=10**9)
        with ThreadedServer(app) as server:
            client = HttpBackend(server.url, key)

            def service_cycle(index: int) -> None:
                name = f"bench.{prefix}.{index % 64}"
                client.acquire_fenced(name, token_http, 30, "bench")
                client.release(name, token_http)

            token_http = client.new_token()
            rows.append(("lock service (2 requests)", _rate(service_cycle, args.seconds), 2))
            client.close()
        store.close()
    direct.close()

    print(f"backend: {args.url}; {args.seconds:.1f} s per row; one client thread")
    print(f"{'row':<28}{'cycles/s':>10}{'ms/cycle':>10}{'vs direct':>11}")
    for name, rate, _requests in rows:
        print(f"{name:<28}{rate:>10.0f}{1000 / rate:>10.3f}{rows[0][1] / rate:>10.1f}x")
    floor_ms = 1000 / rows[1][1] / 2
    service_ms = 1000 / rows[2][1] / 2
    print(f"service overhead per request over the HTTP floor: {service_ms - floor_ms:.3f} ms")
    write_json(args.json, "http_cycle", argv, {
        "backend": args.url,
        "rows": [{"name": name, "rate": rate, "requests": count} for name, rate, count in rows],
        "overhead_ms_per_request": service_ms - floor_ms,
    })


if __name__ == "__main__":
    main()
