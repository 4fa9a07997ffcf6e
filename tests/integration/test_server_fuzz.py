"""Fuzzing the service over real HTTP with hypothesis: whatever the method, path, headers and
body, the answer is a 2xx/4xx and every error is a JSON body with a string ``error`` and ``code``.

Requests are drawn around the shipped OpenAPI document's routes, so most of them reach deep
into the handlers instead of stopping at a 404.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lease_lock.backends.memory import MemoryBackend
from lease_lock.server import create_app, openapi_document

from tests.support.http_server import ThreadedServer, make_keys

_ROUTES = [path.replace("{key}", "KEY") for path in openapi_document()["paths"]] + ["/", "/locks/KEY/x", "/x"]
_KEYS = st.one_of(
    st.sampled_from(["job", "a:b", "a%3Ab", "a%2Fb", "%", "%FF", "k" * 129, "", ".", "..", "x y"]),
    st.text(min_size=0, max_size=140).map(lambda text: requests.utils.quote(text, safe="")),
)
# Header values stay legal HTTP field text: malformed HTTP itself is refused by waitress, with
# its own plain-text 400, before the application sees it.
_FIELD_TEXT = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=60)
_TOKENS = st.one_of(
    st.none(),
    st.builds(lambda u: str(u), st.uuids()),
    st.builds(lambda u: "{" + u.hex.upper() + "}", st.uuids()),
    _FIELD_TEXT,
)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=3),
    max_leaves=8,
)
_BODIES = st.one_of(
    st.builds(lambda ttl: {"ttl_seconds": ttl}, st.one_of(st.integers(-10, 10_000_000), _JSON)),
    _JSON,
    st.binary(max_size=300),
)


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    keys_file = tmp_path_factory.mktemp("fuzz") / "keys.toml"
    keys = make_keys(keys_file)
    with ThreadedServer(create_app(MemoryBackend(), keys_file, rate_limit=1_000_000)) as server:
        yield server.url, keys


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    method=st.sampled_from(["GET", "POST", "PATCH", "DELETE", "PUT", "HEAD", "OPTIONS"]),
    route=st.sampled_from(_ROUTES),
    key=_KEYS,
    token=_TOKENS,
    request_id=st.one_of(st.none(), st.builds(str, st.uuids()), _FIELD_TEXT),
    credential=st.sampled_from(["alpha", "alpha_read", "beta", "none", "garbage"]),
    body=_BODIES,
    owner=st.one_of(st.none(), st.text(max_size=40).map(lambda text: requests.utils.quote(text, safe=""))),
    prefix=st.one_of(st.none(), st.text(max_size=20)),
)
def test_no_input_gets_a_5xx(
    fuzz_server: tuple[str, dict[str, str]],
    method: str,
    route: str,
    key: str,
    token: str | None,
    request_id: str | None,
    credential: str,
    body: object,
    owner: str | None,
    prefix: str | None,
) -> None:
    url, keys = fuzz_server
    headers = {}
    if credential in keys:
        headers["Authorization"] = f"Bearer {keys[credential]}"
    elif credential == "garbage":
        headers["Authorization"] = "Bearer llk_" + uuid.uuid4().hex
    for name, value in (
        ("X-Volcano-Lock-Token", token),
        ("X-Volcano-Request-Id", request_id),
        ("X-Lease-Lock-Owner", owner),
    ):
        if value is not None:
            headers[name] = value
    kwargs: dict[str, object] = {"data": body} if isinstance(body, bytes) else {"json": body}
    params = {"prefix": prefix} if prefix is not None else None
    try:
        response = requests.request(
            method, url + route.replace("KEY", key), headers=headers, params=params, timeout=10, **kwargs
        )
    except (requests.exceptions.InvalidHeader, UnicodeEncodeError, ValueError):
        return  # the client refused to send it: nothing reached the server
    assert response.status_code < 500, response.text
    if response.status_code >= 400 and method != "HEAD":
        assert response.headers["Content-Type"] == "application/json"
        payload = response.json()
        assert isinstance(payload["error"], str) and isinstance(payload["code"], str)
