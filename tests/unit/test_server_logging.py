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
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from lease_lock.backends.memory import MemoryBackend
from lease_lock.server import create_app, create_key
from lease_lock.server.cli import JsonLogFormatter, _configure_logging, _DirectWriteHandler, _SecondCachedFormatter


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
        handler = _DirectWriteHandler(stream)
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
        handler = _DirectWriteHandler(stream)
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
        (_SecondCachedFormatter("%(levelname)s %(message)s"), lambda line: line),
        (JsonLogFormatter(), lambda line: json.loads(line)["message"]),
    ):
        path = tmp_path / "log.txt"
        with path.open("w", encoding="utf-8") as stream:
            handler = _DirectWriteHandler(stream)
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
        _configure_logging("text", "warning")
        assert [type(h) for h in logger.handlers if not isinstance(h, logging.NullHandler)] == [_DirectWriteHandler]
        assert logger.level == logging.WARNING
        assert not logging.getLogger("lease_lock.server").isEnabledFor(logging.INFO)  # no access lines


def test_the_service_logs_access_lines_unless_told_otherwise() -> None:
    with _library_logger(bare=True) as logger:
        _configure_logging("json")
        assert logger.level == logging.INFO
        assert logging.getLogger("lease_lock.server").isEnabledFor(logging.INFO)


def test_a_programs_own_logging_keeps_its_handlers_and_takes_only_a_level_given() -> None:
    with _library_logger(bare=False) as logger:
        own = logging.StreamHandler()
        logger.addHandler(own)
        logger.setLevel(logging.DEBUG)
        _configure_logging("json")
        assert logger.level == logging.DEBUG and logger.handlers[-1] is own
        _configure_logging("json", "error")
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
