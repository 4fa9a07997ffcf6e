"""The ``lease-lock serve`` and ``lease-lock service-keys`` subcommands.

Importing this module registers both with ``lease-lock`` (``lease_lock.cli.register_command``;
the main CLI imports it through ``COMMAND_MODULES``). :func:`add_serve_parser` and
:func:`add_keys_parser` attach the same commands to any ``argparse`` parser, and
``python -m lease_lock.server`` runs them on their own through :func:`main`.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.parse
from typing import Any, Optional, Sequence

from ..errors import ValidationError
from ._logs import configure_logging
from .serving import DEFAULT_CHANNEL_TIMEOUT, DEFAULT_CONNECTION_LIMIT

__all__ = ["add_keys_parser", "add_serve_parser", "main", "parse_bind", "register"]

_USAGE_EXIT = 2
_MAX_BODY_ON_THE_SOCKET = 1024 * 1024


def parse_bind(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6) into its parts; port 0 picks a free port."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValidationError(f"--bind must look like 127.0.0.1:8080, got {text!r}")
    return host.strip("[]"), int(port)


def _serve(args: argparse.Namespace) -> int:
    from .serving import require_waitress, serve

    require_waitress()
    host, port = parse_bind(args.bind)
    for name in ("threads", "connection_limit", "channel_timeout", "workers"):
        value = getattr(args, name)
        if value < 1:
            raise ValidationError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    if args.workers > 1 and urllib.parse.urlsplit(args.url).scheme == "memory":
        raise ValidationError("--workers above 1 needs a shared store: memory:// lives in one process")
    configure_logging(args.log_format, args.log_level)
    # Check the keys file and the URL before anything listens (each worker builds its own app).
    first = _app(args)
    if args.workers > 1:
        _close_app(first)
    built = iter([first] if args.workers == 1 else [])
    return serve(
        lambda: next(built, None) or _app(args),
        host,
        port,
        workers=args.workers,
        threads=args.threads,
        connection_limit=args.connection_limit,
        channel_timeout=args.channel_timeout,
        # waitress refuses bodies above this with its own 413 (JSON too, see serving); the
        # app's 413 covers everything between its own (smaller) limit and this one.
        max_request_body_size=_MAX_BODY_ON_THE_SOCKET,
        close_app=_close_app,
        announce=_announce,
    )


def _close_app(app: Any) -> None:
    app.close()
    app.service.backend.close()


def _app(args: argparse.Namespace) -> Any:
    from .app import create_app

    # Waiters may take half the threads by default, so waiting never starves other requests.
    max_waits = args.max_waits if args.max_waits is not None else max(1, args.threads // 2)
    return create_app(
        args.url,
        args.keys,
        rate_limit=args.rate_limit,
        max_waits=max_waits,
        max_wait=args.max_wait,
        metrics=args.metrics,
    )


def _announce(url: str, workers: int) -> None:
    suffix = f" with {workers} worker processes" if workers > 1 else ""
    print(f"lease-lock: serving on {url}{suffix}", file=sys.stderr, flush=True)


def _keys_create(args: argparse.Namespace) -> int:
    from .keys import create_key

    _record, key = create_key(args.keys, args.project, args.scope)
    # The key is shown this once and never stored: stdout carries nothing else.
    print(key)
    return 0


def _keys_list(args: argparse.Namespace) -> int:
    from .keys import list_keys

    records = list_keys(args.keys)
    if args.json:
        rows: list[dict[str, Any]] = [
            {"id": r.id, "project": r.project, "scope": r.scope, "created": r.created.isoformat()} for r in records
        ]
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'ID':<12}  {'PROJECT':<20}  {'SCOPE':<12}  CREATED")
    for r in records:
        print(f"{r.id:<12}  {r.project:<20}  {r.scope:<12}  {r.created.isoformat()}")
    return 0


def _keys_revoke(args: argparse.Namespace) -> int:
    from .keys import revoke_key

    if not revoke_key(args.keys, args.id):
        print(f"lease-lock: no key with id {args.id} in {args.keys}", file=sys.stderr)
        return 1
    return 0


def _serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", required=True, help="backend URL, e.g. redis://localhost:6379/0")
    parser.add_argument("--bind", default="127.0.0.1:8080", help="HOST:PORT (default %(default)s)")
    parser.add_argument("--keys", required=True, help="keys file (TOML) made by `lease-lock service-keys create`")
    parser.add_argument(
        "--rate-limit",
        type=int,
        default=600,
        help="requests per project per minute (default %(default)s)",
    )
    parser.add_argument("--threads", type=int, default=8, help="threads per process (default %(default)s)")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="server processes sharing the port and the store (default %(default)s)",
    )
    parser.add_argument(
        "--metrics", action="store_true", help="serve GET /metrics (Prometheus text, no service key)"
    )
    parser.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="log lines as text or as one JSON object each (default %(default)s)",
    )
    parser.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        default=None,
        help="least severe log lines written (default info); warning leaves out the access line of "
        "every request, and its cost, where a proxy in front logs requests already",
    )
    parser.add_argument(
        "--max-waits",
        type=int,
        default=None,
        help="requests of one process that may wait under 'Prefer: wait=N' at once "
        "(default: half of --threads; 0 turns the extension off)",
    )
    parser.add_argument(
        "--max-wait",
        type=float,
        default=30.0,
        help="longest wait granted to 'Prefer: wait=N', in seconds (default %(default)s)",
    )
    parser.add_argument(
        "--connection-limit",
        type=int,
        default=DEFAULT_CONNECTION_LIMIT,
        help="open connections per process at most (default %(default)s)",
    )
    parser.add_argument(
        "--channel-timeout",
        type=int,
        default=DEFAULT_CHANNEL_TIMEOUT,
        help="seconds a silent connection (idle, or headers unfinished) stays open (default %(default)s)",
    )


def _keys_arguments(parser: argparse.ArgumentParser) -> None:
    from .keys import SCOPES

    commands = parser.add_subparsers(dest="keys_command", metavar="ACTION")
    commands.required = True
    create = commands.add_parser("create", help="create a key and print it once")
    create.add_argument("--keys", required=True, help="keys file (created if missing)")
    create.add_argument("--project", required=True, help="project the key's locks belong to")
    create.add_argument("--scope", required=True, choices=SCOPES, help="what the key may do")
    listing = commands.add_parser("list", help="show id, project, scope and creation time")
    listing.add_argument("--keys", required=True, help="keys file")
    listing.add_argument("--json", action="store_true", help="print a JSON array")
    revoke = commands.add_parser("revoke", help="delete a key by id")
    revoke.add_argument("--keys", required=True, help="keys file")
    revoke.add_argument("id", help="the key id shown by `service-keys list`")


def _keys(args: argparse.Namespace) -> int:
    # Dispatch here rather than through nested ``set_defaults``: the parent parser's default
    # ``handler`` would win on some Python versions.
    actions = {"create": _keys_create, "list": _keys_list, "revoke": _keys_revoke}
    return actions[args.keys_command](args)


_SERVE_HELP = "serve the HTTP lock service with waitress (needs the 'server' extra)"
_KEYS_HELP = "create, list and revoke the lock service's keys (only hashes are stored)"


def add_serve_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``serve`` to an ``argparse`` subparsers object; its ``handler(args)`` runs it."""
    parser: argparse.ArgumentParser = subparsers.add_parser("serve", help=_SERVE_HELP, description=_SERVE_HELP)
    _serve_arguments(parser)
    parser.set_defaults(handler=_serve)
    return parser


def add_keys_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``service-keys create|list|revoke`` to an ``argparse`` subparsers object."""
    parser: argparse.ArgumentParser = subparsers.add_parser("service-keys", help=_KEYS_HELP, description=_KEYS_HELP)
    _keys_arguments(parser)
    parser.set_defaults(handler=_keys)
    return parser


def register() -> None:
    """Register ``serve`` and ``service-keys`` with ``lease-lock``."""
    from ..cli import register_command

    register_command("serve", help=_SERVE_HELP, add_arguments=_serve_arguments, run=_serve)
    register_command("service-keys", help=_KEYS_HELP, add_arguments=_keys_arguments, run=_keys)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run ``serve`` or ``service-keys`` from ``argv``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m lease_lock.server")
    subparsers = parser.add_subparsers(dest="command", required=True)
    add_serve_parser(subparsers)
    add_keys_parser(subparsers)
    args = parser.parse_args(argv)
    try:
        status: int = args.handler(args)
    except ValidationError as exc:
        print(f"lease-lock: {exc}", file=sys.stderr)
        return _USAGE_EXIT
    return status


register()
