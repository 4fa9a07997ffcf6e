"""The lock service's log: the line formats and the handler of ``lease-lock serve``, and the
access line every request makes.

Every request writes an access line, so its cost is paid once per request by a server that
spends a few hundred microseconds on the whole request. Two things keep it small:

- :class:`LineWriter` writes each line with one ``write`` system call and no lock.
- When the line would reach nothing but the ``serve`` setup (one :class:`LineWriter` with a
  :class:`LineFormatter`, no filters, logging's own record factory and logger class), the
  line's text is written directly, without a ``LogRecord``: the same text the record would
  give. Any other setup (a program's own handlers, filters, record factory or formats) gets a
  record, copied from one ``Logger.makeRecord`` made for the process (see :class:`_AccessRecords`).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from typing import Any, Optional

from ..validation import escape_text

__all__ = ["TEXT_FORMAT", "JsonLogFormatter", "LineFormatter", "LineWriter", "configure_logging", "log_access"]

_log = logging.getLogger("lease_lock.server")
_ACCESS_FORMAT = "%s %s -> %d project=%s request_id=%s %.1fms"
_MAKE_RECORD = logging.Logger.makeRecord
# Where an access line's record says it was made (its ``funcName``).
_ACCESS_FUNCTION = "log_access"

#: The text log's line: when, which worker process, which logger, how grave, what.
TEXT_FORMAT = "%(asctime)s %(process)d %(name)s %(levelname)s %(message)s"


def _text_line(stamp: str, process: object, logger: str, level: str, message: str) -> str:
    """A line of :data:`TEXT_FORMAT`, control characters escaped."""
    return escape_text(f"{stamp} {process} {logger} {level} {message}")


def _json_entry(stamp: str, level: str, logger: str, process: object, message: str) -> dict[str, Any]:
    """The fields every JSON line starts with."""
    return {"time": stamp, "level": level, "logger": logger, "process": process, "message": message}


class LineFormatter(logging.Formatter):
    """A ``logging.Formatter`` that formats the date and time of each second once, and writes
    every line as one line: control characters in it are escaped.

    The service logs a line per request, and the date part (``localtime`` + ``strftime``) was a
    sizeable share of the cost of a line; the milliseconds are added to it every time. A line
    of the text log's own format (:data:`TEXT_FORMAT`) with no traceback or stack is written
    directly, to the text the general path gives.
    """

    _cached: tuple[int, str] = (-1, "")

    def __init__(self, fmt: Optional[str] = None, datefmt: Optional[str] = None) -> None:
        super().__init__(fmt, datefmt)
        self._direct = fmt == TEXT_FORMAT

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line (see the class)."""
        if (
            not self._direct
            or record.exc_info
            or record.exc_text
            or record.stack_info
            or type(record.process) is not int
        ):
            return super().format(record)
        # What ``Formatter.format`` does for this format, without looking up each field of
        # ``%(...)s`` in the record's dictionary.
        record.message = record.getMessage()
        record.asctime = self.formatTime(record)
        return _text_line(record.asctime, record.process, record.name, record.levelname, record.message)

    def formatMessage(self, record: logging.LogRecord) -> str:
        """The line before any traceback, with control characters escaped.

        Keys and owner labels may hold any character but NUL; escaped, a line of the log is
        one line that no key can end early, rewrite (``\\r``) or colour (ESC).
        """
        return escape_text(super().formatMessage(record))

    def formatTime(self, record: logging.LogRecord, datefmt: Optional[str] = None) -> str:
        """The record's time as ``logging.Formatter`` writes it (``YYYY-MM-DD HH:MM:SS,mmm``)."""
        if datefmt is not None or not self._own_time():
            return super().formatTime(record, datefmt)
        return self._stamp(int(record.created), int(record.msecs))

    def _own_time(self) -> bool:
        """Whether times are this class's own: local time, logging's default format."""
        return self.datefmt is None and self.converter is time.localtime

    def _stamp(self, second: int, millis: int) -> str:
        """``YYYY-MM-DD HH:MM:SS,mmm`` of ``second`` and ``millis`` (see :meth:`_date`)."""
        return f"{self._date(second)},{millis:03d}"

    def _date(self, second: int) -> str:
        """``YYYY-MM-DD HH:MM:SS`` of ``second`` in local time, formatted once per second."""
        cached_second, stamp = self._cached  # one tuple, read and replaced whole: thread-safe
        if cached_second != second:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))
            self._cached = (second, stamp)
        return stamp

    def _access_line(self, now_ns: int, process: int, args: tuple[Any, ...]) -> Optional[str]:
        """The line this formatter makes of the record of an access line with ``args`` made at
        ``now_ns`` in ``process``, made without the record (``None`` when this formatter's
        lines need one)."""
        if not self._direct or not self._own_time():
            return None
        second, nanos = divmod(now_ns, 1_000_000_000)
        method, *rest = args
        # The text _text_line makes of the record, escaped where it can need it: the method is
        # the client's and the level's name the program's, while the rest is a time, numbers, a
        # route template, a project name of the keys file's pattern and a UUID (scanning the
        # whole line for control characters was a tenth of the line's cost).
        level = escape_text(logging.getLevelName(logging.INFO))
        message = _ACCESS_FORMAT % (escape_text(method), *rest)
        return f"{self._stamp(second, nanos // 1_000_000)} {process} {_log.name} {level} {message}"


class JsonLogFormatter(LineFormatter):
    """One JSON object per line: time, level, logger, message, and an access line's fields."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON."""
        entry = _json_entry(self.formatTime(record), record.levelname, record.name, record.process, record.getMessage())
        entry.update(getattr(record, "access", {}))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)

    def _access_line(self, now_ns: int, process: int, args: tuple[Any, ...]) -> Optional[str]:
        if not self._own_time():
            return None
        second, nanos = divmod(now_ns, 1_000_000_000)
        stamp = self._stamp(second, nanos // 1_000_000)
        entry = _json_entry(stamp, logging.getLevelName(logging.INFO), _log.name, process, _ACCESS_FORMAT % args)
        entry.update(_access_fields(args))
        return json.dumps(entry)


class LineWriter(logging.StreamHandler):  # type: ignore[type-arg] # generic only in typeshed
    """A ``StreamHandler`` that writes each line with one ``write`` system call and no lock.

    Every request makes an access line. ``StreamHandler`` holds the handler's lock across the
    format, the write and the flush (a system call, during which the thread gives up the GIL
    and then queues to get it back), so the server's threads took turns at that lock. Here
    the line is formatted by its own thread without a lock and reaches the file descriptor in
    one ``os.write``. The kernel writes a line of up to 4 KiB (``PIPE_BUF``; every access line)
    whole even to a pipe, so lines of several threads never mix; a longer one (a traceback) to
    a pipe or socket might have another thread's line land inside it.
    """

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        stream.flush()  # what the stream holds goes out before the first line written around it
        self._fd = stream.fileno()
        self._encoding = getattr(stream, "encoding", None) or "utf-8"

    def handle(self, record: logging.LogRecord) -> bool:
        """Filter and emit ``record`` without taking the handler's lock (see the class)."""
        rv = self.filter(record)
        if rv:
            self.emit(record)
        return bool(rv)

    def emit(self, record: logging.LogRecord) -> None:
        """Write ``record`` as one line."""
        try:
            self._write(self.format(record))
        except Exception:  # noqa: BLE001 - logging's own policy: report and go on
            self.handleError(record)

    def _write(self, line: str) -> None:
        data = (line + self.terminator).encode(self._encoding, "backslashreplace")
        while data:
            data = data[os.write(self._fd, data) :]


def configure_logging(log_format: str = "text", level: Optional[str] = None) -> None:
    """Send the service's log (access lines, store errors, keys file errors) to stderr, from
    ``level`` up (``info`` unless given; access lines are ``info``).

    Only when nobody configured logging already: an embedding program keeps its own setup, and
    only a ``level`` given on purpose is applied to it.
    """
    logger = logging.getLogger("lease_lock")
    if logger.handlers or logging.getLogger().handlers:
        if level is not None:
            logger.setLevel(level.upper())
        return
    handler = LineWriter(sys.stderr)
    # The process id in the text format tells the lines of --workers processes apart.
    handler.setFormatter(JsonLogFormatter() if log_format == "json" else LineFormatter(TEXT_FORMAT))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO if level is None else level.upper())


class _AccessRecords:
    """The log records of the access lines, each a copy of one made by the logger itself.

    ``Logger.info`` would walk the call stack for the caller's file and line, and
    ``LogRecord`` reads the file's name, the process and its name and the thread and its name
    anew for every line; of those only the time and the thread differ from one access line of
    a process to the next. So a record is made once per process (and per setting of
    ``logging``'s ``logThreads``, ``logProcesses``, ``logMultiprocessing``) by
    ``Logger.makeRecord`` and copied for each line, with its own time, thread, arguments and
    ``access`` fields: handlers and filters see what ``makeRecord`` would give them. A record
    factory or logger class of the program's own makes every record itself.
    """

    def __init__(self) -> None:
        # logging's settings -> the fields of this process's template record, and the process
        # id (both forgotten in a forked child, see forget; asking for the process id on every
        # line is a system call).
        self._template: tuple[tuple[object, ...], dict[str, Any]] = ((), {})
        self._process: Optional[int] = None

    def forget(self) -> None:
        """Make the next record's template anew (in a forked child: another process id)."""
        self._template = ((), {})
        self._process = None

    def process(self) -> int:
        """The id of this process."""
        if self._process is None:
            self._process = os.getpid()
        return self._process

    def make(self, args: tuple[Any, ...], fields: dict[str, Any]) -> logging.LogRecord:
        """An access line's record: ``_ACCESS_FORMAT`` with ``args``, and ``fields`` as ``access``."""
        if not _default_records():
            return self._made(args, fields)
        settings = (logging.logThreads, logging.logProcesses, logging.logMultiprocessing)
        known, template = self._template  # one tuple, read and replaced whole: thread-safe
        if known != settings:
            template = vars(self._made((), {}))
            self._template = (settings, template)
        record: logging.LogRecord = logging.LogRecord.__new__(logging.LogRecord)
        copied = vars(record)
        copied.update(template)
        now = time.time_ns()
        copied["created"] = now / 1e9
        copied["msecs"] = (now % 1_000_000_000) // 1_000_000 + 0.0
        copied["relativeCreated"] = template["relativeCreated"] + (now / 1e9 - template["created"]) * 1000
        if settings[0]:
            copied["thread"] = threading.get_ident()
            copied["threadName"] = threading.current_thread().name
        copied["args"] = args
        copied["access"] = fields
        return record

    @staticmethod
    def _made(args: tuple[Any, ...], fields: dict[str, Any]) -> logging.LogRecord:
        return _log.makeRecord(
            _log.name, logging.INFO, __file__, 0, _ACCESS_FORMAT, args, None, _ACCESS_FUNCTION, {"access": fields}
        )


def _default_records() -> bool:
    """Whether records are made by logging's own record factory and logger class."""
    return logging.getLogRecordFactory() is logging.LogRecord and type(_log).makeRecord is _MAKE_RECORD


def _sole_writer() -> Optional[LineWriter]:
    """The one :class:`LineWriter` an access line's record would reach, when nothing else could
    see it, change it or drop it: no filter on the service's logger or on the writer, no other
    handler on the way up (a ``NullHandler`` does nothing), the writer's level letting ``info``
    through, and records made by logging's own factory and logger class (a program's own
    would see no record on the direct path). ``None`` otherwise."""
    if _log.filters or not logging.logProcesses or not _default_records():
        return None
    found: Optional[logging.Handler] = None
    logger: Optional[logging.Logger] = _log
    while logger is not None:
        for handler in logger.handlers:
            if type(handler) is logging.NullHandler:
                continue
            if found is not None:
                return None
            found = handler
        logger = logger.parent if logger.propagate else None
    if type(found) is not LineWriter or found.filters or found.level > logging.INFO:
        return None
    return found


def log_access(method: str, route: str, status: int, project: str, request_id: str, seconds: float) -> None:
    """Write the access line of one request (``info``): method, route template, status,
    project, request id and duration. The route template, never the path: lock names stay out
    of the log."""
    if not _log.isEnabledFor(logging.INFO):
        return
    args = (method, route, status, project, request_id, seconds * 1000)
    writer = _sole_writer()
    formatter = writer.formatter if writer is not None else None
    # Only the formatters defined here: a subclass of the program's own may format otherwise.
    if writer is not None and isinstance(formatter, LineFormatter) and type(formatter) in _DIRECT_FORMATTERS:
        line = formatter._access_line(time.time_ns(), _access_records.process(), args)
        if line is not None:
            try:
                writer._write(line)
            except Exception:  # noqa: BLE001 - logging's own policy: report and go on
                writer.handleError(_access_records.make(args, _access_fields(args)))
            return
    _log.handle(_access_records.make(args, _access_fields(args)))


def _access_fields(args: tuple[Any, ...]) -> dict[str, Any]:
    """The ``access`` fields of an access line's record (what the JSON lines carry)."""
    method, route, status, project, request_id, milliseconds = args
    return {
        "method": method,
        "route": route,
        "status": status,
        "project": project,
        "request_id": request_id,
        "duration_ms": round(milliseconds, 1),
    }


_DIRECT_FORMATTERS = (LineFormatter, JsonLogFormatter)
_access_records = _AccessRecords()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_access_records.forget)
