"""Setup mistakes are ``ValidationError`` (CLI exit 2), never an outage, and never leak a secret.

The missing-driver cases run real processes and are in
``tests/integration/test_setup_errors_processes.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from lease_lock import ValidationError, connect
from lease_lock.backends import backend_from_url

SECRET = "Sup3rSecretPw"  # noqa: S105 - a made-up secret that must never be echoed


def test_an_import_error_inside_the_driver_is_not_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    # A broken backend module (not a missing driver) must show its own error.
    from lease_lock import backends

    monkeypatch.setitem(backends.SCHEMES, "broken", "lease_lock.no_such_module:Backend")
    with pytest.raises(ImportError):
        backend_from_url("broken://x")


# -- secrets -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        f"admin:{SECRET}@db.example:5432/locks",  # no scheme: the whole URL used to be echoed
        f"//admin:{SECRET}@db.example/locks",
        f"sqlite://admin:{SECRET}@host/locks.db",  # a host where SQLite takes none
        f"sqlite:///locks.db?busy_timeout=1s&api_key={SECRET}",
        f"memory://?api_key={SECRET}",
        f"memory://?api_key={SECRET}&other=1",
    ],
)
def test_setup_errors_never_show_a_secret(url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValidationError) as caught:
        connect(url)
    assert SECRET not in str(caught.value)
    assert SECRET not in repr(caught.value)


def test_a_malformed_secret_option_is_named_without_its_value() -> None:
    from lease_lock.backends.base import parse_url_options

    def refuse(text: str) -> str:
        raise ValueError(f"bad value {text!r}")

    with pytest.raises(ValidationError) as caught:
        parse_url_options(f"x://h/?api_key={SECRET}", {"api_key": refuse}, {}, backend="x")
    assert "api_key" in str(caught.value)
    assert SECRET not in str(caught.value)
    assert caught.value.__cause__ is None
