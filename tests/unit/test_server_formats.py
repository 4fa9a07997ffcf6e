"""The service's hand-written fast paths give exactly what the general code they replace gives.

The request path writes lease answers as JSON text directly, formats ``expires_at`` with
``time.gmtime``, passes canonical UUIDs through unparsed, formats each second of the log
timestamps once, writes text log lines without ``%``-formatting the record and copies access
records from one ``makeRecord`` made; each is checked here against the plain library code it
stands in for.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import sys
import threading
import time
import uuid
from datetime import datetime, timezone

import pytest
from lease_lock.server import _logs as logs_module
from lease_lock.server._logs import _ACCESS_FORMAT, JsonLogFormatter, LineFormatter, _access_records
from lease_lock.server.app import _lease_response, _Reject, _uuid, format_time
from lease_lock.server.service import Grant
from lease_lock.validation import escape_text


def _rfc3339_by_datetime(epoch: float) -> str:
    millis = math.floor(epoch * 1000)
    moment = datetime.fromtimestamp(millis // 1000, timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{millis % 1000:03d}Z"


def test_format_time_matches_datetime_and_rounds_down() -> None:
    rng = random.Random(12)
    instants = [0.0, 0.0009, 0.999, 1.0, 59.9995, 1_764_560_000.9999, 4_102_444_799.999]
    instants += [rng.uniform(0, 4e9) for _ in range(2000)]
    for epoch in instants:
        assert format_time(epoch) == _rfc3339_by_datetime(epoch), epoch
    assert format_time(1_764_560_000.9999) == "2025-12-01T03:33:20.999Z"


@pytest.mark.parametrize("fence", [1, 2**53 + 1, 1_764_560_000_123_456])
def test_lease_answers_are_the_json_of_their_body(fence: int) -> None:
    response = _lease_response(201, Grant(1_764_560_000.25, fence))
    body = {"expires_at": format_time(1_764_560_000.25), "fencing_token": fence}
    assert response.encoded == json.dumps(body).encode()
    assert json.loads(response.encoded) == {"expires_at": "2025-12-01T03:33:20.250Z", "fencing_token": fence}


def test_uuids_are_normalised_whatever_their_form() -> None:
    value = uuid.UUID("0f3a9c61-b2d4-4e5f-8a7b-1c2d3e4f5a6b")
    canonical = str(value)
    forms = [canonical, canonical.upper(), value.hex, f"{{{canonical}}}", f"urn:uuid:{canonical}"]
    assert [_uuid(form, "X-Token", "invalid_token") for form in forms] == [canonical] * len(forms)
    assert _uuid(None, "X-Token", "invalid_token") is None
    for bad in ["", "not-a-uuid", canonical + "0", canonical[:-1], canonical + "\n"]:
        with pytest.raises(_Reject) as refused:
            _uuid(bad, "X-Token", "invalid_token")
        assert refused.value.response.status == 400


def _record(created: float) -> logging.LogRecord:
    record = logging.LogRecord("lease_lock.server", logging.INFO, __file__, 1, "line %d", (7,), None)
    record.created = created
    record.msecs = (created - int(created)) * 1000
    return record


def test_log_timestamps_match_logging_across_seconds() -> None:
    pattern = "%(asctime)s %(process)d %(name)s %(levelname)s %(message)s"
    cached, plain = LineFormatter(pattern), logging.Formatter(pattern)
    # Within one second, across a boundary, backwards in time: the cache never shows a stale second.
    for created in [1_764_560_000.001, 1_764_560_000.999, 1_764_560_001.0, 1_764_559_000.5, 1_764_560_001.25]:
        assert cached.format(_record(created)) == plain.format(_record(created))
    line = json.loads(JsonLogFormatter().format(_record(1_764_560_000.5)))
    assert line["time"] == plain.formatTime(_record(1_764_560_000.5))


def test_log_lines_with_tracebacks_or_control_characters_match_logging() -> None:
    pattern = "%(asctime)s %(process)d %(name)s %(levelname)s %(message)s"
    cached, plain = LineFormatter(pattern), logging.Formatter(pattern)
    record = _record(1_764_560_000.5)
    record.msg, record.args = "key %s", ("a\nb\x1b[31m\\",)
    assert cached.format(record) == escape_text(plain.format(_record_like(record)))
    try:
        raise ValueError("boom")
    except ValueError:
        failed = logging.LogRecord("lease_lock.server", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    line = cached.format(failed)
    assert line.startswith(plain.formatTime(failed)) and "Traceback" in line and "ValueError: boom" in line


def _record_like(record: logging.LogRecord) -> logging.LogRecord:
    copy = logging.LogRecord(record.name, record.levelno, record.pathname, record.lineno, record.msg, record.args, None)
    copy.created, copy.msecs = record.created, record.msecs
    return copy


def test_access_records_are_what_make_record_gives() -> None:
    logger = logging.getLogger("lease_lock.server")
    args = ("POST", "/locks/{key}/lease", 201, "alpha", str(uuid.uuid4()), 1.25)
    fields = {"method": "POST", "status": 201}
    before = time.time()
    copied = _access_records.make(args, fields)
    made = logger.makeRecord(logger.name, logging.INFO, logs_module.__file__, 0, _ACCESS_FORMAT, args, None,
                             "log_access", {"access": fields})
    varying = {"created", "msecs", "relativeCreated"}
    assert {k: v for k, v in vars(copied).items() if k not in varying} == {
        k: v for k, v in vars(made).items() if k not in varying
    }
    assert before - 0.001 <= copied.created <= made.created + 0.001
    # Whole milliseconds of its own time, as the formatters show them.
    assert copied.msecs == int(copied.msecs) and 0 <= (copied.created % 1) * 1000 - copied.msecs < 1.001
    assert abs(copied.relativeCreated - made.relativeCreated) < 1000
    # Another thread's record names that thread, as makeRecord would.
    seen: list[logging.LogRecord] = []
    worker = threading.Thread(target=lambda: seen.append(_access_records.make(args, fields)), name="worker-7")
    worker.start()
    worker.join()
    assert seen[0].threadName == "worker-7" and seen[0].thread == worker.ident
    assert seen[0].getMessage() == made.getMessage()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() is POSIX")
def test_access_records_of_a_forked_worker_name_its_process() -> None:
    args = ("DELETE", "/locks/{key}/lease", 204, "alpha", str(uuid.uuid4()), 0.5)
    assert _access_records.make(args, {}).process == os.getpid()
    reading, writing = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        try:
            os.write(writing, str(_access_records.make(args, {}).process).encode())
        finally:
            os._exit(0)
    os.close(writing)
    os.waitpid(child, 0)
    with os.fdopen(reading) as pipe:
        assert pipe.read() == str(child)
