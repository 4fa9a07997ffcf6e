"""The log handler of ``lease-lock serve``: each line written whole by its own thread, with no
lock, before the call returns; lines of many threads never mix."""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

from lease_lock.server.cli import JsonLogFormatter, _DirectWriteHandler, _SecondCachedFormatter


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
