"""``manage.py locks``: list and clear the locks of the project's configured locker.

``manage.py locks list [PREFIX] [--json]`` prints the held keys under ``PREFIX`` (a table, or
the JSON array of ``lease-lock ls --json``); ``manage.py locks release KEY...`` and
``manage.py locks release --prefix PREFIX`` drop keys whoever holds them, after listing them
and asking once (``--yes`` skips the question; without it and without an answer on stdin
nothing is released). Keys are given and shown without ``LEASE_LOCK["KEY_PREFIX"]``, as the
code that locks them names them. The output is the ``lease-lock`` command's.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Optional

from django.core.management.base import BaseCommand, CommandError, CommandParser

from .....admin import NO_ANSWER, ask, held_locks, locks_json, locks_table, release_keys, release_prefix
from .....errors import ValidationError
from .....locker import Locker

__all__ = ["Command"]

#: ``CommandError.returncode`` for usage errors, as the ``lease-lock`` command's.
USAGE_RETURNCODE = 2


class Command(BaseCommand):  # type: ignore[misc]  # Django ships no type hints
    """List (``locks list``) and force-release (``locks release``) the project's locks."""

    help = "List and force-release the locks of settings.LEASE_LOCK's locker."

    def add_arguments(self, parser: CommandParser) -> None:
        """``list [PREFIX] [--json]`` and ``release (KEY... | --prefix PREFIX) [--yes]``."""
        actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
        listing = actions.add_parser("list", help="list the held keys (under PREFIX)")
        listing.add_argument("prefix", nargs="?", default="", metavar="PREFIX", help="taken literally")
        listing.add_argument("--json", action="store_true", help="a JSON array, as lease-lock ls --json")
        release = actions.add_parser("release", help="drop keys whoever holds them")
        release.add_argument("keys", nargs="*", metavar="KEY", help="the keys to drop")
        release.add_argument("--prefix", help="drop every key held under PREFIX (taken literally)")
        release.add_argument("--yes", action="store_true", help="do not ask for confirmation")

    def get_locker(self) -> Locker:
        """The locker of ``settings.LEASE_LOCK`` (override to choose another)."""
        from ... import get_locker

        return get_locker()

    def handle(self, *args: Any, **options: Any) -> None:
        """Carry out ``list`` or ``release``."""
        write: Callable[[str], None] = self.stdout.write
        try:
            locker = self.get_locker()
            if options["action"] == "list":
                states = held_locks(locker, options["prefix"])
                if options["json"]:
                    write(locks_json(states))
                elif states:
                    write(locks_table(states))
                else:
                    write(f"no held keys under {options['prefix']!r}" if options["prefix"] else "no held keys")
                return
            keys, prefix = options["keys"], options["prefix"]
            if bool(keys) == (prefix is not None):
                raise CommandError("give either KEY... or --prefix PREFIX", returncode=USAGE_RETURNCODE)
            confirm = None if options["yes"] else self._confirm
            if prefix is not None:
                dropped = release_prefix(locker, prefix, confirm=confirm, write=write)
            else:
                dropped = release_keys(locker, keys, confirm=confirm, write=write)
        except ValidationError as error:
            raise CommandError(str(error), returncode=USAGE_RETURNCODE) from None
        if dropped is None:
            raise CommandError("aborted; nothing released")

    def _confirm(self, question: str) -> bool:
        answer: Optional[bool] = ask(question, stdin=sys.stdin, stderr=sys.stderr)
        if answer is None:
            raise CommandError(NO_ANSWER)
        return answer
