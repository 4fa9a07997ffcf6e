"""``SingletonCommand``: a management command that never runs twice at once."""

from __future__ import annotations

import math
from typing import Any, Callable, ClassVar, Optional, Union

from django.core.management.base import BaseCommand, CommandError, CommandParser, OutputWrapper

from ...admin import describe_holder_of, describe_lost_reason
from ...errors import LockHeldError, LockLostError, ValidationError
from ...lock import Lock
from ...locker import Locker
from ...validation import check_limit

__all__ = ["BUSY_RETURNCODE", "LOST_RETURNCODE", "SingletonCommand"]

#: ``CommandError.returncode`` when another run holds the lock (``EX_TEMPFAIL``, as the CLI).
BUSY_RETURNCODE = 75
#: ``CommandError.returncode`` when the lock was lost while the command ran (as the CLI).
LOST_RETURNCODE = 70


class SingletonCommand(BaseCommand):  # type: ignore[misc]  # Django ships no type hints
    """A ``BaseCommand`` whose run holds a lease lock from start to end.

    The key is ``"command:<name>"`` unless the class sets ``lock_key``: a ``str``, or a callable
    receiving the command's options as a dict and returning the key. ``lock_ttl`` and
    ``lock_max_hold`` (seconds) default to the locker's. ``lock_limit = N`` lets up to N runs
    hold the key at once (default 1; the lock store must grant counting leases); it is checked
    when the class is defined. The heartbeat keeps the lease alive for
    the whole run; ``self.lock`` is the held :class:`~lease_lock.Lock` while ``handle()`` runs,
    so a long command can call ``self.lock.check()`` between steps.

    Options added to every subclass: ``--lock-wait`` waits for the lock instead of giving up,
    and ``--lock-timeout SECONDS`` bounds that wait (it implies ``--lock-wait``). Without them a
    busy key writes one line to stderr and ends with ``CommandError(returncode=75)``; a wait that
    times out ends the same way. A lock lost during the run ends with
    ``CommandError(returncode=70)`` naming the key and the reason, even if ``handle()`` finished:
    its work may have overlapped another run's.
    """

    lock_key: ClassVar[Union[str, Callable[[dict[str, Any]], str], None]] = None
    lock_ttl: ClassVar[Optional[float]] = None
    lock_max_hold: ClassVar[Optional[float]] = None
    lock_limit: ClassVar[int] = 1
    lock: Optional[Lock] = None
    _lock_from_argv = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # A bad limit fails when the command module is imported, not when a run is busy.
        super().__init_subclass__(**kwargs)
        check_limit(cls.lock_limit, "lock_limit")

    def get_locker(self) -> Locker:
        """The locker to use: the process-wide one of ``settings.LEASE_LOCK`` (override to
        choose another)."""
        from . import get_locker

        return get_locker()

    def get_lock_key(self, options: dict[str, Any]) -> str:
        """The key for this run, from ``lock_key`` or the command's name."""
        key = type(self).lock_key
        if key is None:
            return "command:" + type(self).__module__.rpartition(".")[2]
        if callable(key):
            key = key(options)
        if not isinstance(key, str):
            raise ValidationError(f"lock_key must be a str or return one, not {type(key).__name__}")
        return key

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        """Django's parser plus ``--lock-wait`` and ``--lock-timeout``."""
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        parser.add_argument(
            "--lock-wait", action="store_true", help="Wait for another run to finish instead of giving up."
        )
        parser.add_argument(
            "--lock-timeout", type=float, metavar="SECONDS", default=None,
            help="Wait at most SECONDS for the lock (implies --lock-wait).",
        )
        return parser

    def run_from_argv(self, argv: list[str]) -> None:
        """Run from ``manage.py``: Django itself prints a ``CommandError`` there, so the busy
        line is not written twice."""
        self._lock_from_argv = True
        super().run_from_argv(argv)

    def execute(self, *args: Any, **options: Any) -> Any:
        """Take the lock, run the command under it, give it back."""
        if options.get("stderr"):
            self.stderr = OutputWrapper(options["stderr"])
        timeout = options.get("lock_timeout")
        wait = bool(options.get("lock_wait")) or timeout is not None
        lock_options: dict[str, Any] = {"blocking": wait}
        if wait:
            lock_options["timeout"] = math.inf if timeout is None else timeout
        if self.lock_max_hold is not None:
            lock_options["max_hold"] = self.lock_max_hold
        if self.lock_limit > 1:
            lock_options["limit"] = self.lock_limit
        key = self.get_lock_key(options)
        locker = self.get_locker()
        try:
            lock = locker.acquire(key, self.lock_ttl, **lock_options)
        except LockHeldError as error:
            # The words of ``lease-lock run``, with the key as this command names it (without
            # the locker's prefix).
            waited = f" after waiting {error.elapsed:.1f}s" if error.reason == "timeout" else ""
            others = "another run holds it" if self.lock_limit == 1 else f"{self.lock_limit} other runs hold it"
            message = f"{key!r} is busy{describe_holder_of(locker, key)}{waited}; {others}, not started"
            if not self._lock_from_argv:
                self.stderr.write(message)
            raise CommandError(message, returncode=BUSY_RETURNCODE) from error
        self.lock = lock
        try:
            with lock:
                return super().execute(*args, **options)
        except LockLostError as error:
            if error.key != lock.key:
                raise
            raise CommandError(
                f"lost the lock on {key!r}: {describe_lost_reason(error.reason)}; another run may "
                "have overlapped this one",
                returncode=LOST_RETURNCODE,
            ) from error
        finally:
            self.lock = None
