"""The lock service's own instructions per acquire+release on Redis, counted by valgrind.

    python -m benchmarks.service_instructions [--cycles 300] [--redis-url redis://127.0.0.1:6379/0]

The rates of ``benchmarks.http_cycle`` move by several percent between runs of a shared
2-core machine; what the service's own request handling costs beyond the store's round trips
is a few percent of a cycle, so it is counted instead. Each row calls a WSGI application in
one process, without a server, for a grant (``POST /locks/{key}/lease``) and a release
(``DELETE``) per cycle, with the request environments waitress builds, against a real Redis;
``valgrind --tool=callgrind`` counts the instructions of the interpreter's process (the client
side of Redis only; Redis's own work and the kernel's are not counted), as in
``benchmarks.instructions``:

- *store-only*: ``benchmarks.http_cycle``'s store-only app, which makes the one raw Redis call
  of each request (``SET NX PX``, the token-checked delete) and answers as the service does;
- *backend-only*: its backend-only app, which makes the store calls of the service's requests
  through the service's own Redis backend (the fenced grant script, the release script) and
  answers as the service does;
- *service*: ``create_app`` on the same Redis, logging as ``lease-lock serve`` does (an access
  line per request, to a file);
- *service, no access line*: the same at ``--log-level warning``.

The figures to read are the differences. The service minus the backend-only app is what the
service's own layer costs per cycle (routing, credential, budget, validation, its rules, the
answer, the access lines): both make the same store calls through the same client. The service
minus the store-only app adds what the two clients differ by: redis-py's generic command path
against the backend's own, and the longer scripts' arguments and replies.
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable

from .http_cycle import FLOORS
from .instructions import count_rows

__all__ = ["main"]

ROWS = ("store-only", "backend-only", "service", "service-quiet")
_LABELS = {
    "store-only": "store-only app (raw SET NX PX + delete script)",
    "backend-only": "backend-only app (the service's store calls)",
    "service": "service, access line on (as lease-lock serve)",
    "service-quiet": "service, --log-level warning",
}
_KEY = "bench-instructions"
_RUNNER = "benchmarks.service_instructions"
_BODY = b'{"ttl_seconds": 30}'

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Any]


def _app(row: str, redis_url: str, keys_file: Path) -> WsgiApp:
    if row in FLOORS:
        return FLOORS[row](redis_url)
    from lease_lock.server import create_app
    from lease_lock.server._logs import configure_logging

    # As `lease-lock serve` sets logging up: its handler on stderr, here a file.
    stderr, sys.stderr = sys.stderr, (keys_file.parent / "serve.log").open("w", encoding="utf-8")
    try:
        configure_logging("text", "warning" if row == "service-quiet" else None)
    finally:
        sys.stderr = stderr
    return create_app(redis_url, keys_file, rate_limit=1_000_000_000)


def _cycle(app: WsgiApp, secret: str) -> Callable[[], None]:
    # A key of this process's own: the rows run at once, and two services share a project name.
    path = f"/locks/{_KEY}-{os.getpid()}/lease"

    def request(method: str, token: str, body: bytes) -> None:
        environ = {
            "REQUEST_METHOD": method, "SCRIPT_NAME": "", "PATH_INFO": path, "REQUEST_URI": path,
            "QUERY_STRING": "", "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "8080", "SERVER_PROTOCOL": "HTTP/1.1",
            "REMOTE_ADDR": "127.0.0.1", "CONTENT_LENGTH": str(len(body)) if body else "",
            "CONTENT_TYPE": "application/json" if body else "",
            "HTTP_AUTHORIZATION": f"Bearer {secret}", "HTTP_X_VOLCANO_LOCK_TOKEN": token,
            "HTTP_X_VOLCANO_REQUEST_ID": str(uuid.uuid4()), "HTTP_USER_AGENT": "python-requests/2.32.3",
            "HTTP_ACCEPT": "*/*", "HTTP_ACCEPT_ENCODING": "gzip, deflate", "HTTP_CONNECTION": "keep-alive",
            "wsgi.input": io.BytesIO(body), "wsgi.url_scheme": "http", "wsgi.version": (1, 0),
        }
        statuses: list[str] = []
        answer = app(environ, lambda status, headers, *rest: statuses.append(status))
        b"".join(answer)
        close = getattr(answer, "close", None)
        if close is not None:
            close()  # what a WSGI server does with the body: the access line is written here
        if not statuses or statuses[0][:3] not in ("201", "204"):
            raise RuntimeError(f"{method} answered {statuses}")

    def cycle() -> None:
        token = str(uuid.uuid4())
        request("POST", token, _BODY)
        request("DELETE", token, b"")

    return cycle


def run_cycles(row: str, cycles: int, redis_url: str) -> None:
    """Run ``row``'s cycles as ``benchmarks.instructions.run_cycles`` does (markers included)."""
    with tempfile.TemporaryDirectory(prefix="lease-lock-service-instructions-") as directory:
        from lease_lock.server import create_key

        keys_file = Path(directory) / "keys.toml"
        _, secret = create_key(keys_file, "bench", "locks.manage")
        cycle = _cycle(_app(row, redis_url, keys_file), secret)
        for stretch in (cycles, cycles, 3 * cycles):
            for _ in range(stretch):
                cycle()
            os.getpgrp()
        logging.shutdown()


def main(argv: Sequence[str] | None = None) -> None:
    """Count the rows and print instructions per cycle and the service's own share."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=300, help="N: rows run N and 3N cycles")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--valgrind", default="valgrind", help="the valgrind executable")
    parser.add_argument("--run", choices=ROWS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.cycles < 1:
        parser.error("--cycles must be at least 1")
    if args.run is not None:
        run_cycles(args.run, args.cycles, args.redis_url)
        return
    if shutil.which(args.valgrind) is None:
        parser.error(f"{args.valgrind} not found: install valgrind (apt-get install valgrind)")
    n = args.cycles
    counts = count_rows(ROWS, n, args.valgrind, _RUNNER, "--redis-url", args.redis_url)
    per_cycle = {row: counts.per_cycle(row, n) for row in ROWS}
    print(f"WSGI app on Redis, valgrind callgrind, {n} and {3 * n} cycles, instructions per acquire+release")
    header = f"{'cycle':<52} {'instructions':>12}"
    print(header)
    print("-" * len(header))
    for row in ROWS:
        print(f"{_LABELS[row]:<52} {per_cycle[row]:>12,.0f}")
    differences = (
        ("service minus backend-only (its own layer)", "backend-only"),
        ("service minus store-only", "store-only"),
    )
    for label, floor in differences:
        print(f"{label:<52} {per_cycle['service'] - per_cycle[floor]:>12,.0f}")
    print(f"{'access lines (service minus --log-level warning)':<52} "
          f"{per_cycle['service'] - per_cycle['service-quiet']:>12,.0f}")


if __name__ == "__main__":
    main()
