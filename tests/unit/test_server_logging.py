"""The log handler of ``lease-lock serve``: each line written whole by its own thread, with no
lock, before the call returns; lines of many threads never mix. And the level ``--log-level``
sets, on the service's own setup and on a program's own. The access line of a request is
written once the server has handed its answer over."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from lease_lock.backends.memory import MemoryBackend
from lease_lock.server import _logs as logs_module
from lease_lock.server import create_app, create_key
from lease_lock.server._logs import JsonLogFormatter, LineFormatter, LineWriter, configure_logging, log_access


def _logger(name: str, handler: logging.Handler) -> logging.Logger:
    logger = logging.getLogger(f"lease_lock.test_logging.{name}")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    return logger


def test_a_line_is_in_the_file_when_the_call_returns(tmp_path: Path) -> None:
    path = tmp_path / "log.txt"
    with path.open("w", encoding="utf-8") as stream:
        stream.write("before\n")  # held by the stream's buffer: goes out first
        handler = LineWriter(stream)
        logger = _logger("written", handler)
        try:
            logger.info("value %s", ["é"])
            assert path.read_text(encoding="utf-8") == "before\nvalue ['é']\n"
        finally:
            logger.removeHandler(handler)


def test_lines_from_many_threads_through_a_pipe_never_mix() -> None:
    read_end, write_end = os.pipe()
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: os.read(read_end, 65536), b"")))
    reader.start()
    with os.fdopen(write_end, "w", encoding="utf-8") as stream:
        handler = LineWriter(stream)
        logger = _logger("pipe", handler)
        try:

            def write(thread: int) -> None:
                for index in range(300):
                    logger.info("thread %d line %d %s", thread, index, "x" * 200)

            threads = [threading.Thread(target=write, args=(n,)) for n in range(6)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
        finally:
            logger.removeHandler(handler)
    reader.join(30)
    os.close(read_end)
    lines = b"".join(chunks).decode().splitlines()
    assert len(lines) == 1800
    for thread in range(6):
        mine = [line for line in lines if line.startswith(f"thread {thread} ")]
        assert mine == [f"thread {thread} line {index} {'x' * 200}" for index in range(300)]


def test_text_lines_escape_control_characters_and_json_lines_keep_them(tmp_path: Path) -> None:
    key = "two\nlines\r\x1b[31mred\ttab"
    for formatter, read in (
        (LineFormatter("%(levelname)s %(message)s"), lambda line: line),
        (JsonLogFormatter(), lambda line: json.loads(line)["message"]),
    ):
        path = tmp_path / "log.txt"
        with path.open("w", encoding="utf-8") as stream:
            handler = LineWriter(stream)
            handler.setFormatter(formatter)
            logger = _logger(f"escape-{type(formatter).__name__}", handler)
            try:
                logger.warning("lost the lock on %s held by %s", key, "owner\x07")
                try:
                    raise RuntimeError("boom")
                except RuntimeError:
                    logger.exception("failed on %s", key)
            finally:
                logger.removeHandler(handler)
        lines = path.read_text(encoding="utf-8").splitlines()
        if isinstance(formatter, JsonLogFormatter):
            assert len(lines) == 2
            assert read(lines[0]) == f"lost the lock on {key} held by owner\x07"  # exact
        else:
            assert lines[0] == "WARNING lost the lock on two\\nlines\\r\\x1b[31mred\\ttab held by owner\\x07"
            assert lines[1] == "ERROR failed on two\\nlines\\r\\x1b[31mred\\ttab"
            # The traceback below it keeps its lines.
            assert lines[2] == "Traceback (most recent call last):" and lines[-1] == "RuntimeError: boom"


@contextlib.contextmanager
def _library_logger(*, bare: bool) -> Iterator[logging.Logger]:
    """The ``lease_lock`` logger, its handlers and level, and the root logger's handlers, all
    put back afterwards; with ``bare``, no handler of a program's own anywhere meanwhile
    (pytest's capture handlers, which it puts on the root logger for each test, are taken off)."""
    logger, root = logging.getLogger("lease_lock"), logging.getLogger()
    handlers, level, root_handlers = list(logger.handlers), logger.level, list(root.handlers)
    if bare:
        for handler in root_handlers:
            root.removeHandler(handler)
        for handler in [h for h in handlers if not isinstance(h, logging.NullHandler)]:
            logger.removeHandler(handler)
    try:
        yield logger
    finally:
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        for handler in handlers:
            logger.addHandler(handler)
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in root_handlers:
            root.addHandler(handler)
        logger.setLevel(level)


def test_the_service_logs_from_the_level_asked_for() -> None:
    with _library_logger(bare=True) as logger:
        configure_logging("text", "warning")
        assert [type(h) for h in logger.handlers if not isinstance(h, logging.NullHandler)] == [LineWriter]
        assert logger.level == logging.WARNING
        assert not logging.getLogger("lease_lock.server").isEnabledFor(logging.INFO)  # no access lines


def test_the_service_logs_access_lines_unless_told_otherwise() -> None:
    with _library_logger(bare=True) as logger:
        configure_logging("json")
        assert logger.level == logging.INFO
        assert logging.getLogger("lease_lock.server").isEnabledFor(logging.INFO)


def test_a_programs_own_logging_keeps_its_handlers_and_takes_only_a_level_given() -> None:
    with _library_logger(bare=False) as logger:
        own = logging.StreamHandler()
        logger.addHandler(own)
        logger.setLevel(logging.DEBUG)
        configure_logging("json")
        assert logger.level == logging.DEBUG and logger.handlers[-1] is own
        configure_logging("json", "error")
        assert logger.level == logging.ERROR and logger.handlers[-1] is own


def test_the_access_line_is_written_when_the_server_closes_the_answer(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # After the answer is handed to the connection, so that its write never delays the answer.
    keys_file = tmp_path / "keys.toml"
    _, key = create_key(keys_file, "alpha", "full")
    app = create_app(MemoryBackend(), keys_file)
    environ = {
        "REQUEST_METHOD": "GET", "PATH_INFO": "/locks/job", "QUERY_STRING": "", "HTTP_AUTHORIZATION": f"Bearer {key}",
        "wsgi.input": io.BytesIO(b""), "CONTENT_LENGTH": "0",
    }
    statuses: list[str] = []
    caplog.set_level(logging.INFO, logger="lease_lock.server")
    answer = app(environ, lambda status, headers, *args: statuses.append(status))
    assert statuses == ["200 OK"] and json.loads(b"".join(answer)) == {"held": False}
    assert not [r for r in caplog.records if "/locks/{key}" in r.getMessage()]
    answer.close()  # type: ignore[attr-defined] # what every WSGI server does with the body
    answer.close()  # type: ignore[attr-defined] # a second close writes nothing more
    [line] = [r.getMessage() for r in caplog.records if "/locks/{key}" in r.getMessage()]
    assert line.startswith("GET /locks/{key} -> 200 project=alpha request_id=")


# A moment well inside its second, so that the record's float time and the direct line's
# integer time name the same millisecond.
_NOW_NS = 1_764_560_000_250_400_000
_ACCESS = ("GE\x1bT", "/locks/{key}/lease", 201, "alpha", "5e0a7f7c-1d0c-4f43-9a55-0c1f8b5b1e52", 0.00125)


def _served_lines(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    log_format: str,
    setup: Any = None,
    access: tuple[Any, ...] = _ACCESS,
) -> tuple[list[str], int]:
    """The access lines ``lease-lock serve``'s logging writes for ``access`` at ``_NOW_NS``, and
    how many records were made for them; ``setup(writer)`` changes the setup first."""
    made: list[logging.LogRecord] = []
    make = logs_module._access_records.make
    monkeypatch.setattr(logs_module._access_records, "make", lambda *a: made.append(make(*a)) or made[-1])
    monkeypatch.setattr(time, "time_ns", lambda: _NOW_NS)
    path = tmp_path / f"{log_format}-{len(list(tmp_path.iterdir()))}.log"
    with path.open("w", encoding="utf-8") as stream, _library_logger(bare=True) as logger:
        monkeypatch.setattr(sys, "stderr", stream)
        configure_logging(log_format)
        [writer] = [h for h in logger.handlers if not isinstance(h, logging.NullHandler)]
        if setup is not None:
            setup(writer)
        log_access(*access)
    return path.read_text(encoding="utf-8").splitlines(), len(made)


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_the_access_line_written_directly_is_the_line_its_record_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, log_format: str
) -> None:
    # No record on the serve setup: the line's text is written as it stands.
    direct, records = _served_lines(tmp_path, monkeypatch, log_format)
    assert records == 0
    # A filter that lets everything through: the record path, to the same line.
    through_record, records = _served_lines(tmp_path, monkeypatch, log_format, lambda w: w.addFilter(lambda r: True))
    assert records == 1
    assert direct == through_record and len(direct) == 1
    if log_format == "text":
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(_NOW_NS // 10**9))
        assert direct[0] == (
            f"{stamp},250 {os.getpid()} lease_lock.server INFO GE\\x1bT /locks/{{key}}/lease -> 201 project=alpha "
            "request_id=5e0a7f7c-1d0c-4f43-9a55-0c1f8b5b1e52 1.2ms"
        )
    else:
        entry = json.loads(direct[0])
        assert entry["method"] == "GE\x1bT" and entry["duration_ms"] == 1.2 and entry["process"] == os.getpid()


def test_the_direct_access_line_escapes_what_its_record_escapes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The direct line escapes only the parts that can hold a control character or a backslash,
    # the client's method among them; the record's line is escaped whole.
    access = ("P\\O\rST\u202e", *_ACCESS[1:])
    direct, records = _served_lines(tmp_path, monkeypatch, "text", access=access)
    through_record, _ = _served_lines(
        tmp_path, monkeypatch, "text", lambda w: w.addFilter(lambda r: True), access=access
    )
    assert records == 0
    assert direct == through_record and len(direct) == 1
    assert " INFO P\\\\O\\rST\\u202e /locks/{key}/lease -> 201 " in direct[0]


def _drop_everything(writer: logging.Handler) -> None:
    writer.addFilter(lambda record: False)


def _quiet_writer(writer: logging.Handler) -> None:
    writer.setLevel(logging.WARNING)


def _second_handler(writer: logging.Handler) -> None:
    logging.getLogger().addHandler(logging.NullHandler())  # a NullHandler does nothing: still direct
    logging.getLogger().addHandler(_Collect())


def _own_factory(writer: logging.Handler) -> None:
    factory = logging.getLogRecordFactory()
    logging.setLogRecordFactory(lambda *args, **kwargs: factory(*args, **kwargs))


class _Collect(logging.Handler):
    seen: ClassVar[list[logging.LogRecord]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(record)


@pytest.mark.parametrize(
    ("setup", "lines", "records"),
    [(_drop_everything, 0, 1), (_quiet_writer, 0, 1), (_second_handler, 1, 1), (_own_factory, 1, 1)],
    ids=["filtered-out", "writer-level-warning", "another-handler", "own-record-factory"],
)
def test_an_access_line_is_a_record_when_anything_else_could_see_or_change_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setup: Any, lines: int, records: int
) -> None:
    factory = logging.getLogRecordFactory()
    _Collect.seen = []
    try:
        written, made = _served_lines(tmp_path, monkeypatch, "text", setup)
    finally:
        logging.setLogRecordFactory(factory)
    assert len(written) == lines and made == records
    if setup is _second_handler:
        assert [record.getMessage().split(" -> ")[0] for record in _Collect.seen] == ["GE\x1bT /locks/{key}/lease"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() is POSIX")
def test_a_forked_worker_writes_its_own_process_id_on_the_direct_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "fork.log"
    with path.open("w", encoding="utf-8") as stream, _library_logger(bare=True):
        monkeypatch.setattr(sys, "stderr", stream)
        configure_logging("text")
        log_access(*_ACCESS)  # the parent's process id is known from here on
        child = os.fork()
        if child == 0:  # pragma: no cover - runs in the child
            try:
                log_access(*_ACCESS)
            finally:
                os._exit(0)
        os.waitpid(child, 0)
    parent_line, child_line = path.read_text(encoding="utf-8").splitlines()
    assert parent_line.split()[2] == str(os.getpid()) and child_line.split()[2] == str(child)


def test_a_formatter_subclass_of_the_programs_own_gets_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Shouting(LineFormatter):
        def format(self, record: logging.LogRecord) -> str:
            return super().format(record).upper()

    def shout(writer: logging.Handler) -> None:
        writer.setFormatter(Shouting(logs_module.TEXT_FORMAT))

    written, made = _served_lines(tmp_path, monkeypatch, "text", shout)
    assert made == 1 and written[0].endswith("PROJECT=ALPHA REQUEST_ID=5E0A7F7C-1D0C-4F43-9A55-0C1F8B5B1E52 1.2MS")
