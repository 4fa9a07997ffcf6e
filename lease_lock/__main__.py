"""``python -m lease_lock`` and the ``lease-lock`` script: the command, interruptible from the start.

Importing :mod:`lease_lock.cli` and what it needs takes a noticeable part of a second, and a
signal in that time would otherwise end in a traceback (SIGINT) or a silent death (SIGTERM). So
this module, which imports nothing heavy, takes both signals first: each one unwinds the process
as a ``KeyboardInterrupt`` and :func:`main` turns it into one line and the status 128+N, whatever
was under way. ``lease-lock run`` replaces the handlers with its own while it waits or supervises.
"""

import signal
import sys

__all__ = ["main"]


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised as Python raises ``KeyboardInterrupt`` for SIGINT: one way out for both."""


def _terminate(signum: int, frame: object) -> None:
    raise _Terminated


def main() -> int:
    """Run ``lease-lock`` with ``sys.argv``; a SIGINT or SIGTERM gives 130 or 143 and one line."""
    try:
        # Inside the try: once SIGTERM is taken, a SIGINT, too, must find the handler below.
        signal.signal(signal.SIGTERM, _terminate)
        from .cli import main as command

        return command()
    except KeyboardInterrupt as stop:
        signum = signal.SIGTERM if isinstance(stop, _Terminated) else signal.SIGINT
        sys.stderr.write(f"lease-lock: interrupted by {signum.name}\n")
        sys.stderr.flush()
        return 128 + signum


if __name__ == "__main__":
    raise SystemExit(main())
