"""The ``lease-lock`` command: guard a shell command with a lease, inspect and drop leases.

``lease-lock run KEY [options] -- COMMAND [ARGS...]`` takes the key (with a fencing token), runs
the command as a child with the heartbeat keeping the lease alive, and gives the key back when
the child exits. The child runs in a process group of its own, so that when the lease is lost
the whole job (a shell script's children included) is stopped, not only its first process.

Exit status: the child's own; 128+N when the child died of signal N; ``--busy-exit``
(75) when the key is busy or ``--wait --timeout`` ran out; ``--lost-exit`` (70) when the lease was
lost while the child ran; 2 for usage errors; 69 when the backend cannot be reached. Every error
is one line on stderr, never a traceback.

Other modules add subcommands with :func:`register_command`; the modules listed in
:data:`COMMAND_MODULES` are imported (and so register theirs) when the parser is built.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any, Callable, NoReturn, Optional

from . import __version__
from .admin import (
    NO_ANSWER,
    CannotListError,
    ask,
    describe_holder,
    describe_holder_of,
    describe_lost_reason,
    describe_place,
    held_locks,
    locks_json,
    locks_table,
    places_held,
    release_prefix,
    state_json,
)
from .errors import AccessDeniedError, BackendUnavailableError, LeaseLockError, LockHeldError, ValidationError
from .validation import MAX_LIMIT, check_key, check_limit, escape_text, parse_duration, redact_url

if TYPE_CHECKING:
    from .backends.base import LockState
    from .events import LockEvent
    from .lock import Lock
    from .locker import Locker

__all__ = [
    "COMMANDS",
    "COMMAND_MODULES",
    "EXIT_BUSY",
    "EXIT_LOST",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "Command",
    "CommandError",
    "add_url_argument",
    "backend_errors",
    "build_parser",
    "duration",
    "main",
    "register_command",
]

#: Bad option, duration, key or URL.
EXIT_USAGE = 2
#: The backend cannot be reached (EX_UNAVAILABLE).
EXIT_UNAVAILABLE = 69
#: The lease was lost while the command ran (the default of ``--lost-exit``).
EXIT_LOST = 70
#: The key was busy (EX_TEMPFAIL; the default of ``--busy-exit``).
EXIT_BUSY = 75

_PROG = "lease-lock"
_EXIT_TABLE = """\
exit status:
  the command's own  it ran with the lock held and the lock was never lost
  128+N              the command died of signal N
  75                 the key was busy (or the -w/--timeout wait ran out); see --busy-exit
  70                 the lock was lost while the command ran; see --lost-exit
  69                 the backend cannot be reached
  2                  usage error: bad option, duration, key or URL
  126, 127           the command could not be started / was not found
"""
_DURATIONS = """\
durations: 30 or 30s (seconds), 250ms, 5m, 1.5h, 2d, or compound from the largest
unit down: 1h30m, 2m30s
"""


class CommandError(Exception):
    """An expected failure: ``main`` prints ``message`` on one line and exits with ``status``."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Command:
    """A subcommand: ``add_arguments`` fills its parser, ``run`` carries it out.

    ``run`` returns the exit status; it may raise :class:`CommandError` (or a
    :class:`~lease_lock.errors.ValidationError`, which exits 2) for expected failures.
    """

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


#: Subcommands by name, in the order ``--help`` lists them.
COMMANDS: dict[str, Command] = {}

#: Modules imported when the parser is built; importing one calls :func:`register_command`.
#: They must import heavy dependencies (servers, drivers) inside their ``run`` functions only.
COMMAND_MODULES: list[str] = ["lease_lock.server.cli"]


def register_command(
    name: str,
    *,
    help: str,
    add_arguments: Callable[[argparse.ArgumentParser], None],
    run: Callable[[argparse.Namespace], int],
) -> None:
    """Add (or replace) the subcommand ``name`` of ``lease-lock``."""
    if not isinstance(name, str) or not name or name.startswith("-"):
        raise ValidationError("command name must be a non-empty str not starting with '-'")
    COMMANDS[name] = Command(name, help, add_arguments, run)


# -- argument helpers shared by subcommands ----------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line (status 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def duration(name: str) -> Callable[[str], float]:
    """An argparse ``type`` for durations such as ``30``, ``30s``, ``5m``, ``1h``, ``2d``."""

    def parse(text: str) -> float:
        try:
            return parse_duration(text, name)
        except ValidationError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return parse


def _exit_code(name: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = -1
        if not 0 <= value <= 255:
            raise argparse.ArgumentTypeError(f"{name} must be an exit status from 0 to 255")
        return value

    return parse


def _limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--limit must be a whole number from 1 to {MAX_LIMIT:,}, not {text!r}"
        ) from None
    try:
        return check_limit(value, "--limit")
    except ValidationError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _key(text: str) -> str:
    try:
        return check_key(text)
    except ValidationError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_url_argument(parser: argparse.ArgumentParser) -> None:
    """``--url``: the backend, defaulting to ``LEASE_LOCK_URL`` and then the embedded SQLite file."""
    parser.add_argument(
        "--url",
        help="backend URL (default: $LEASE_LOCK_URL, else the embedded SQLite file "
        "$XDG_STATE_HOME/lease-lock/locks.db)",
    )
    parser.add_argument(
        "--api-key", metavar="KEY",
        help="service key for an http(s):// URL (default: $LEASE_LOCK_API_KEY)",
    )


@contextlib.contextmanager
def backend_errors() -> Iterator[None]:
    """Turn ``BackendUnavailableError`` into exit status 69 with one line naming it.

    Only that error means "unreachable": every backend raises it for connection-level
    failures. Other errors keep their own status (a ``ValidationError``, such as a missing
    driver, is a usage error: 2), so a cron wrapper that retries on 69 never retries a setup
    mistake.
    """
    try:
        yield
    except BackendUnavailableError as error:
        raise CommandError(_unavailable_message(error), EXIT_UNAVAILABLE) from error


def _unavailable_message(error: BackendUnavailableError) -> str:
    """The one line printed for an unreachable backend (the message never holds a secret)."""
    return f"backend unavailable: {_one_line(error)}"


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def _connect(args: argparse.Namespace, **options: Any) -> Locker:
    """The locker of ``--url`` (and ``--api-key``, for an HTTP URL)."""
    from .connect import connect, default_url

    url = args.url or default_url()
    if getattr(args, "api_key", None) is not None:
        if not url.startswith(("http://", "https://")):
            raise CommandError("--api-key is for http:// and https:// URLs only", EXIT_USAGE)
        options["api_key"] = args.api_key
    with backend_errors():
        try:
            return connect(url, **options)
        except Exception as error:
            if not _from_a_driver(error):
                raise
            # connect() makes its first connection: an outage is BackendUnavailableError, so
            # what else the driver raised is the store refusing these settings (an unknown
            # database or role, a failed login), which no retry fixes.
            raise CommandError(
                f"the store refused {redact_url(url)}: {_without_password(_one_line(error), url)} "
                "(check the URL: host, database, user, password)",
                EXIT_USAGE,
            ) from error


def _from_a_driver(error: BaseException) -> bool:
    """Whether ``error`` is a driver's own exception (psycopg2's, redis-py's, sqlite3's), not
    lease_lock's nor a built-in one (which would be a bug, shown as such)."""
    module = type(error).__module__.partition(".")[0]
    return module not in ("builtins", "lease_lock")


def _without_password(text: str, url: str) -> str:
    """``text`` with the password of ``url`` (as written and decoded) masked, in case a driver
    repeats it."""
    try:
        password = urllib.parse.urlsplit(url).password
    except ValueError:
        password = None
    for secret in {password or "", urllib.parse.unquote(password or "")} - {""}:
        text = text.replace(secret, "***")
    return text


# -- run ---------------------------------------------------------------------------------------


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.usage = f"{_PROG} run KEY [options] -- COMMAND [ARGS...]"
    parser.epilog = f"{_EXIT_TABLE}\n{_DURATIONS}"
    # Optional here so that a missing KEY gets the same message as a missing COMMAND.
    parser.add_argument("key", metavar="KEY", nargs="?", type=_key, help="the lock key")
    add_url_argument(parser)
    parser.add_argument(
        "--ttl", type=duration("--ttl"), default=30.0, metavar="DURATION",
        help="lease length; the heartbeat renews it every third of it (default 30s)",
    )
    parser.add_argument(
        "--max-hold", type=duration("--max-hold"), default=86400.0, metavar="DURATION",
        help="stop the command when it has held the lock this long (default 24h)",
    )
    parser.add_argument(
        "--limit", type=_limit, default=1, metavar="N",
        help="let up to N runs hold KEY at once, each with a fence of its own; every run of KEY "
        "must give the same N (default 1)",
    )
    parser.add_argument(
        "--wait", action="store_true",
        help="wait for a busy key (for ever, or until --timeout) instead of one attempt",
    )
    parser.add_argument(
        "-w", "--timeout", type=duration("--timeout"), metavar="DURATION",
        help="wait for a busy key, giving up after this long (implies --wait, as flock -w)",
    )
    parser.add_argument(
        "-n", "--nonblock", action="store_true",
        help="one attempt, no waiting (the default; as flock -n)",
    )
    parser.add_argument(
        "-q", "--quiet", action="store_true",
        help="no waiting line and no busy message (errors are still printed)",
    )
    parser.add_argument(
        "-E", "--busy-exit", type=_exit_code("--busy-exit"), default=EXIT_BUSY, metavar="CODE",
        help=f"exit status when the key is busy (default {EXIT_BUSY})",
    )
    parser.add_argument(
        "--lost-exit", type=_exit_code("--lost-exit"), default=EXIT_LOST, metavar="CODE",
        help=f"exit status when the lock is lost while the command runs (default {EXIT_LOST})",
    )
    parser.add_argument(
        "--grace", type=duration("--grace"), default=10.0, metavar="DURATION",
        help="after a loss, SIGKILL the command this long after SIGTERM (default 10s)",
    )
    # Words before "--" that are not options: caught to explain where the command goes.
    parser.add_argument("stray", nargs="*", help=argparse.SUPPRESS)


class _Signals:
    """SIGINT, SIGTERM and SIGHUP handling for the life of one ``run``.

    Before the child exists a signal cancels the wait for the key; once it exists the signal is
    forwarded to the child's process group.
    """

    FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.received: list[int] = []
        self.cancel = threading.Event()
        self._group: Optional[int] = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _Signals:
        for signum in self.FORWARDED:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, frame: Optional[FrameType]) -> None:
        self.received.append(signum)
        self.cancel.set()
        if self._group is not None:
            _signal_group(self._group, signum)

    def attach(self, group: int) -> None:
        """Forward from now on to ``group``, including what arrived while the child started."""
        self._group = group
        for signum in list(self.received):
            _signal_group(group, signum)


def _signal_group(group: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signum)


class _Terminal:
    """Hands the controlling terminal to the child's process group while it runs.

    Only when stdin is a terminal whose foreground group is ours: the child can then read from
    it and receive the keys' signals (Ctrl-C) directly, as if started by the shell.
    """

    def __init__(self) -> None:
        self._fd: Optional[int] = None
        try:
            fd = sys.stdin.fileno()
            if os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp():
                self._fd = fd
        except (AttributeError, OSError, ValueError):
            self._fd = None

    def give(self, group: int) -> None:
        """Make ``group`` the terminal's foreground process group."""
        if self._fd is not None:
            self._set(group)

    def take_back(self) -> None:
        """Make our own process group the foreground group again."""
        if self._fd is not None:
            self._set(os.getpgrp())

    def _set(self, group: int) -> None:
        # A background process changing the foreground group is sent SIGTTOU unless it ignores
        # it; after handing the terminal over we are that background process.
        previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        try:
            with contextlib.suppress(OSError):
                os.tcsetpgrp(self._fd, group)  # type: ignore[arg-type]
        finally:
            signal.signal(signal.SIGTTOU, previous)


def _owner(command: Sequence[str]) -> str:
    label = f"{socket.gethostname()}:{os.getpid()} {os.path.basename(command[0])}"[:256]
    return label if label.isprintable() else f"{socket.gethostname()}:{os.getpid()}"[:256]


class _WaitingLine:
    """While ``run`` waits for a busy key, one line on the terminal saying for whom, redrawn
    every second and erased when the wait ends. Nothing when stderr is not a terminal."""

    def __init__(self, locker: Locker, key: str, enabled: bool) -> None:
        self._locker = locker
        self._key = key
        self._stream = sys.stderr
        self._enabled = enabled and self._stream.isatty()
        self._done = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def __enter__(self) -> _WaitingLine:
        if self._enabled:
            self._thread = threading.Thread(target=self._draw, name="lease-lock-waiting", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._thread is not None:
            self._done.set()
            self._thread.join()

    def _width(self) -> int:
        try:
            columns = os.get_terminal_size(self._stream.fileno()).columns
        except (OSError, ValueError):
            columns = 0
        return columns or 80  # a terminal that does not know its size reports 0

    def _draw(self) -> None:
        start = time.monotonic()
        drawn = False
        # The first draw waits a little, so that a key that is free at once draws nothing.
        while not self._done.wait(1.0 if drawn else 0.25):
            holder = describe_holder_of(self._locker, self._key).strip(" ()") or "busy"
            waited = int(time.monotonic() - start)
            line = f"{_PROG}: waiting for {self._key!r} ({waited}s): {holder}"
            # Cut to the terminal's width: a wrapped line could not be redrawn in place.
            width = self._width()
            self._stream.write(f"\r\x1b[K{line[: max(10, width - 2)]}\u2026")
            self._stream.flush()
            drawn = True
        if drawn:
            self._stream.write("\r\x1b[K")
            self._stream.flush()


class _WaitNote:
    """An ``on_event`` hook noting whether ``run --wait`` found its key busy, and how long the
    acquisition took: a wait that goes unsaid looks like a slow command in a cron log."""

    def __init__(self) -> None:
        self.busy = False
        self.waited: Optional[float] = None

    def __call__(self, event: LockEvent) -> None:
        if event.type == "contended":
            self.busy = True
        elif event.type == "acquired" and self.waited is None:
            self.waited = event.waited

    def report(self, key: str) -> None:
        """Say on stderr how long the key was waited for, if it was busy."""
        if self.busy and self.waited is not None:
            _error(f"waited {self.waited:.1f}s for {key!r}")


def _take(locker: Locker, args: argparse.Namespace, signals: _Signals) -> Optional[Lock]:
    """The held lock, or ``None`` when the key is busy."""
    with backend_errors():
        try:
            if not args.wait:
                return locker.try_acquire(args.key, limit=args.limit)
            timeout = math.inf if args.timeout is None else args.timeout
            with _WaitingLine(locker, args.key, enabled=not args.quiet):
                return locker.acquire(args.key, timeout=timeout, cancel=signals.cancel, limit=args.limit)
        except LockHeldError as error:
            if error.reason == "cancelled" and signals.received:
                raise CommandError(
                    f"interrupted while waiting for {args.key!r}", 128 + signals.received[0]
                ) from None
            return None


#: ``prctl`` option that makes the kernel send a signal to a process when its parent dies.
_PR_SET_PDEATHSIG = 1


#: How often a stopping group is looked at while its grace runs.
_GROUP_POLL = 0.05


def _tie_to_supervisor() -> Optional[Callable[[], None]]:
    """A ``preexec_fn`` that has the kernel SIGKILL the command when this process dies.

    Without it, a supervisor killed by SIGKILL (the OOM killer, ``kill -9``) leaves the command
    running past its lease while another holder starts. Linux only (``PR_SET_PDEATHSIG``); the
    function is resolved here, in the parent, so the child only makes one C call before exec.
    The kernel ties the command to the thread that started it: ``run`` starts it from its main
    thread, which lives as long as the supervisor. Only the command's own process is tied; its
    children die with it only if they are tied to it in turn (or when the supervisor, alive,
    signals the whole group).
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    supervisor = os.getpid()

    def tie() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != supervisor:
            # The supervisor died between the fork and the tie: nobody holds the lease.
            os._exit(128 + signal.SIGKILL)

    return tie


def _start(command: Sequence[str], lock: Lock) -> subprocess.Popen[bytes]:
    env = dict(os.environ, LEASE_LOCK_KEY=lock.key, LEASE_LOCK_FENCE=str(lock.fence))
    group: dict[str, Any] = (
        {"process_group": 0} if sys.version_info >= (3, 11) else {"start_new_session": True}
    )
    try:
        return subprocess.Popen(list(command), env=env, preexec_fn=_tie_to_supervisor(), **group)
    except FileNotFoundError:
        raise CommandError(f"command not found: {command[0]}", 127) from None
    except OSError as error:
        raise CommandError(f"cannot run {command[0]}: {error.strerror or error}", 126) from None


def _status_of(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _supervise(
    lock: Lock, command: Sequence[str], args: argparse.Namespace, signals: _Signals
) -> tuple[int, bool]:
    """Run the command under the lock; return its exit status and whether the lease was lost.

    A loss while the command runs stops it (and reports it); the caller gives the key back.
    """
    terminal = _Terminal()
    child = _start(command, lock)
    terminal.give(child.pid)
    signals.attach(child.pid)
    wake = threading.Event()

    def watch_child() -> None:
        child.wait()
        wake.set()

    def watch_lease() -> None:
        while not wake.is_set():
            if lock.lost.wait(0.5):
                wake.set()

    for target in (watch_child, watch_lease):
        threading.Thread(target=target, name=f"lease-lock-{target.__name__}", daemon=True).start()
    try:
        wake.wait()
        if child.poll() is None:
            _report_loss(lock, f"stopping the command (SIGTERM, SIGKILL after {args.grace:g}s)")
            _stop_group(child, args.grace)
            return _status_of(child.returncode), True
    finally:
        terminal.take_back()
    status = _status_of(child.returncode)
    if lock.lost.is_set():
        _report_loss(lock, "the command finished after the loss; stopping what is left of its process group")
        _stop_group(child, args.grace)
        return status, True
    return status, False


def _group_exists(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stop_group(child: subprocess.Popen[bytes], grace: float) -> None:
    """After a loss: SIGTERM the command's whole process group, then SIGKILL the group once
    ``grace`` has passed, whatever the leader did (a member that ignores SIGTERM must not keep
    running while another holder runs). Returns early when the group is gone."""
    group = child.pid
    _signal_group(group, signal.SIGTERM)
    give_up = time.monotonic() + grace
    while time.monotonic() < give_up:
        child.poll()  # reap the leader, so that only live members keep the group in existence
        if child.returncode is not None and not _group_exists(group):
            return
        time.sleep(min(_GROUP_POLL, max(0.0, give_up - time.monotonic())))
    _signal_group(group, signal.SIGKILL)
    child.wait()


def _report_loss(lock: Lock, what: str) -> None:
    _error(f"lost the lock on {lock.key!r}: {describe_lost_reason(lock.lost_reason)}; {what}")


def _release(lock: Lock) -> bool:
    """Give the key back; ``False`` when the release found it no longer ours."""
    try:
        return lock.release() or lock.state != "lost"
    except LeaseLockError:
        raise
    except Exception as error:  # noqa: BLE001 - any driver error: the key will run out
        # The command is done; the key runs out on its own at the end of its lease.
        _error(f"could not release {lock.key!r} ({type(error).__name__}: {_one_line(error)})")
        return True


def _check_counting(locker: Locker, limit: int) -> None:
    if limit > 1 and not locker.backend.capabilities.counting:
        raise CommandError(
            f"--limit {limit} needs a store that grants counting leases; "
            f"{type(locker.backend).__name__} does not",
            EXIT_USAGE,
        )


def _run(args: argparse.Namespace) -> int:
    if args.stray:
        raise CommandError(
            f"put the command after --: {_PROG} run KEY [options] -- COMMAND [ARGS...]", EXIT_USAGE
        )
    if args.key is None or not args.run_command:
        raise CommandError(
            f"KEY and COMMAND are required: {_PROG} run KEY [options] -- COMMAND [ARGS...]", EXIT_USAGE
        )
    if args.nonblock and (args.wait or args.timeout is not None):
        raise CommandError("--nonblock is one attempt; it cannot go with --wait or --timeout", EXIT_USAGE)
    # As flock -w: a timeout means waiting for that long.
    args.wait = args.wait or args.timeout is not None
    note = _WaitNote()
    with _Signals() as signals:
        locker = _connect(
            args, ttl=args.ttl, max_hold=args.max_hold, fencing=True, owner=_owner(args.run_command),
            on_event=note if args.wait and not args.quiet else None,
        )
        try:
            _check_counting(locker, args.limit)
            lock = _take(locker, args, signals)
            if lock is None:
                holder = "" if args.quiet else describe_holder_of(locker, args.key)
                if not args.quiet:
                    _error(f"{args.key!r} is busy{holder}; not running the command")
                return int(args.busy_exit)
            note.report(args.key)
            if signals.received:
                _release(lock)
                return 128 + signals.received[0]
            try:
                status, lost = _supervise(lock, args.run_command, args, signals)
            finally:
                released = _release(lock)
            if not (lost or released):
                _report_loss(lock, "found when giving the key back")
            return int(args.lost_exit) if lost or not released else status
        finally:
            locker.close()


# -- status, ls and force-release ----------------------------------------------------------------


def _add_status_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("keys", metavar="KEY", nargs="+", type=_key, help="keys to show")
    add_url_argument(parser)
    parser.add_argument("--json", action="store_true", help="print a JSON array, one object per key")


def _state_line(state: LockState) -> str:
    """One line for a key; a counting key's holders follow it in :func:`_holder_lines`."""
    key = escape_text(state.key)
    if not state.held:
        return f"{key}: free"
    if state.limit > 1:
        return f"{key}: {places_held(state)} held (limit {state.limit})"
    line = f"{key}: {describe_holder(state)}"
    expires_at = state_json(state)["expires_at"]
    if expires_at is not None:
        line += f" ({expires_at})"
    if state.fence is not None:
        line += f", fence {state.fence}"
    return line


def _holder_lines(state: LockState) -> list[str]:
    """One indented line per holder of a counting key, by fence (none for an exclusive key,
    whose one holder is on its key's line)."""
    if state.limit == 1:
        return []
    return ["  " + describe_place(holder) for holder in state.holders]


def _status(args: argparse.Namespace) -> int:
    locker = _connect(args, fencing=True)
    try:
        with backend_errors():
            states = [locker.get(key) for key in args.keys]
    finally:
        locker.close()
    if args.json:
        print(locks_json(states))
    else:
        for state in states:
            print("\n".join([_state_line(state), *_holder_lines(state)]))
    return 0


def _add_ls_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "prefix", metavar="PREFIX", nargs="?", default="",
        help="only keys starting with this (taken literally: no wildcards)",
    )
    add_url_argument(parser)
    parser.add_argument(
        "--json", action="store_true", help="print a JSON array with the fields of status --json"
    )


@contextlib.contextmanager
def _listing() -> Iterator[None]:
    """``backend_errors``, and a store that cannot list keys as a usage error (status 2)."""
    try:
        with backend_errors():
            yield
    except CannotListError as error:
        raise CommandError(f"{error}; use status KEY... instead", EXIT_USAGE) from None


def _ls(args: argparse.Namespace) -> int:
    locker = _connect(args, fencing=True)
    try:
        with _listing():
            states = held_locks(locker, args.prefix)
    finally:
        locker.close()
    if args.json:
        print(locks_json(states))
    elif states:
        print(locks_table(states))
    else:
        print(f"no held keys under {args.prefix!r}" if args.prefix else "no held keys")
    return 0


def _add_force_release_arguments(parser: argparse.ArgumentParser) -> None:
    parser.usage = f"{_PROG} force-release (KEY | --prefix PREFIX) [--yes] [--url URL]"
    parser.add_argument("key", metavar="KEY", nargs="?", type=_key, help="the key to drop")
    parser.add_argument(
        "--prefix",
        help="drop every key held under PREFIX (taken literally: no wildcards); lists them first",
    )
    add_url_argument(parser)
    parser.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")


def _confirm(question: str) -> bool:
    """Ask on stderr, read the answer from stdin; no answer (closed stdin) refuses."""
    answer = ask(question)
    if answer is None:
        raise CommandError(NO_ANSWER, 1)
    return answer


def _force_release(args: argparse.Namespace) -> int:
    if (args.key is None) == (args.prefix is None):
        raise CommandError("give either KEY or --prefix PREFIX", EXIT_USAGE)
    locker = _connect(args, fencing=True)
    try:
        if args.prefix is not None:
            return _force_release_prefix(locker, args)
        with backend_errors():
            state = locker.get(args.key)
            if not state.held:
                print(f"{escape_text(args.key)}: free, nothing to release")
                return 0
            question = f"force-release {_state_line(state)}?"
            if not args.yes and not _confirm(question):
                raise CommandError("aborted; nothing released", 1)
            dropped = locker.force_release(args.key)
    finally:
        locker.close()
    key = escape_text(args.key)
    if not dropped:
        print(f"{key}: free, nothing to release")
    else:
        # The store drops every place of a counting key at once, whoever holds each.
        print(f"{key}: released, all places dropped" if state.limit > 1 else f"{key}: released")
    return 0


def _force_release_prefix(locker: Locker, args: argparse.Namespace) -> int:
    with _listing():
        dropped = release_prefix(
            locker, args.prefix, confirm=None if args.yes else _confirm, write=print
        )
    if dropped is None:
        raise CommandError("aborted; nothing released", 1)
    return 0


register_command(
    "run",
    help="run a command while holding KEY",
    add_arguments=_add_run_arguments,
    run=_run,
)
register_command(
    "status",
    help="show who holds the keys and until when",
    add_arguments=_add_status_arguments,
    run=_status,
)
register_command(
    "force-release",
    help="drop KEY, or every key under --prefix, whoever holds it",
    add_arguments=_add_force_release_arguments,
    run=_force_release,
)
register_command(
    "ls",
    help="list the held keys (under PREFIX) with owner, fence and lease",
    add_arguments=_add_ls_arguments,
    run=_ls,
)


# -- entry point ---------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The ``lease-lock`` parser with every registered subcommand."""
    for module in COMMAND_MODULES:
        importlib.import_module(module)
    parser = _Parser(
        prog=_PROG,
        description="Distributed lease locks from the shell: guard cron jobs and deploy scripts.",
        epilog=_EXIT_TABLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"{_PROG} {__version__}")
    commands = parser.add_subparsers(dest="command_name", metavar="COMMAND", parser_class=_Parser)
    commands.required = True
    for command in COMMANDS.values():
        sub = commands.add_parser(
            command.name,
            help=command.help,
            description=command.help,
            epilog=_EXIT_TABLE if command.name == "run" else None,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        command.add_arguments(sub)
        sub.set_defaults(handler=command.run)
    return parser


def _split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    """For ``run``, everything after the first ``--`` is the command, kept out of argparse."""
    words = [word for word in argv if not word.startswith("-")]
    if words[:1] == ["run"] and "--" in argv:
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1 :]
    return argv, []


def _error(message: str) -> None:
    sys.stderr.write(f"{_PROG}: {message}\n")
    sys.stderr.flush()


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run ``lease-lock`` with ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    head, command = _split_command(arguments)
    args = build_parser().parse_args(head)
    args.run_command = command
    try:
        return int(args.handler(args))
    except CommandError as error:
        _error(str(error))
        return error.status
    except ValidationError as error:
        _error(str(error))
        return EXIT_USAGE
    except BackendUnavailableError as error:
        _error(_unavailable_message(error))
        return EXIT_UNAVAILABLE
    except AccessDeniedError as error:
        # As a refused database login: a setting no retry fixes (the key or its scope).
        _error(f"the store refused the credential: {_one_line(error)}")
        return EXIT_USAGE
    except LeaseLockError as error:
        _error(f"{error.code}: {error}")
        return 1
    except Exception as error:
        if os.environ.get("LEASE_LOCK_DEBUG"):
            raise
        _error(
            f"unexpected {type(error).__name__}: {_one_line(error)} "
            "(set LEASE_LOCK_DEBUG=1 for the traceback)"
        )
        return 1
