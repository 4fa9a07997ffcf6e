"""The API document matches the server: it is a valid OpenAPI document, and schemathesis runs
every operation of it against the WSGI app (served on loopback) with valid, read-only and
invalid service keys, finding no 5xx and no answer that the document does not allow."""

from __future__ import annotations

import re
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings
from lease_lock.backends.memory import MemoryBackend
from lease_lock.server import create_app, openapi_document
from openapi_spec_validator import validate

from tests.support.http_server import ThreadedServer, make_keys

# The keys must exist when the module is collected: schemathesis builds the tests then.
_KEYS_FILE = Path(tempfile.mkdtemp(prefix="lease-lock-openapi-")) / "keys.toml"
_KEYS = make_keys(_KEYS_FILE)
_UNKNOWN_KEY = "llk_000000000000." + "A" * 43
# Enough cases per operation to cover every parameter, within about a minute for the module.
_EXAMPLES = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))


def test_the_document_is_valid_openapi() -> None:
    validate(openapi_document())


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    # Waits are on but short, so that generated "Prefer: wait=N" headers cannot slow the run.
    app = create_app(MemoryBackend(), _KEYS_FILE, rate_limit=10**9, max_wait=0.2, metrics=True)
    with ThreadedServer(app) as server:
        yield server.url
    app.close()


@pytest.mark.parametrize(
    "owner",
    ["host%3A42", "web 1/worker-3", "100%", "a%zz%", "%25", "", "a\tb", "tab\tinside", "%09", "%0e", "%7F", "%E0",
     "%C3%28"],
)
def test_the_owner_pattern_admits_exactly_what_the_server_takes(owner: str, url: str) -> None:
    # The generated cases below send any value the pattern admits and expect it taken; one the
    # server refused (a tab, an escape of a control character or of broken UTF-8) failed them at
    # random, whenever hypothesis happened to draw it.
    post = openapi_document()["paths"]["/locks/{key}/lease"]["post"]
    [parameter] = [p for p in post["parameters"] if p.get("name") == "X-Lease-Lock-Owner"]
    admitted = re.search(parameter["schema"]["pattern"], owner) is not None
    answer = requests.post(
        f"{url}/locks/owner-{uuid.uuid4().hex}/lease",
        json={"ttl_seconds": 10},
        headers={"Authorization": f"Bearer {_KEYS['alpha_full']}", "X-Volcano-Lock-Token": str(uuid.uuid4()),
                 "X-Lease-Lock-Owner": owner},
        timeout=30,
    )
    assert answer.status_code == (201 if admitted else 400), answer.text


def _schema_with_key(key: str) -> Any:
    schema = schemathesis.openapi.from_dict(openapi_document())

    @schema.auth()
    class ServiceKey:
        """Sends ``key`` as the bearer credential the document's security scheme asks for."""

        def get(self, case: Any, context: Any) -> str:
            return key

        def set(self, case: Any, data: str, context: Any) -> None:
            case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}

    return schema


_FULL = _schema_with_key(_KEYS["alpha_full"])
_READ_ONLY = _schema_with_key(_KEYS["alpha_read"])
_UNKNOWN = _schema_with_key(_UNKNOWN_KEY)


@_FULL.parametrize()
@_EXAMPLES
def test_every_operation_with_a_full_key(case: Any, url: str) -> None:
    case.call_and_validate(base_url=url)


@_READ_ONLY.parametrize()
@_EXAMPLES
def test_every_operation_with_a_read_only_key(case: Any, url: str) -> None:
    case.call_and_validate(base_url=url)


@_UNKNOWN.parametrize()
@_EXAMPLES
def test_every_operation_with_an_unknown_key(case: Any, url: str) -> None:
    case.call_and_validate(base_url=url)
