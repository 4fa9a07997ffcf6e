"""Compound durations (``1h30m``) beside the single-unit forms."""

from __future__ import annotations

import pytest
from lease_lock.errors import ValidationError
from lease_lock.validation import parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1h30m", 5400.0), ("2m30s", 150.0), ("1d2h3m4s5ms", 93784.005), ("1m500ms", 60.5),
        ("1.5h30m", 7200.0), (" 1h30m ", 5400.0), ("250ms", 0.25), ("90", 90.0),
    ],
)
def test_compound_durations_add_up(text: str, seconds: float) -> None:
    assert parse_duration(text, "--ttl") == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["30m1h", "1h30", "1h 30m", "1h1h", "1m30m", "h30m", "1h-30m", "", "1h30mx"])
def test_compound_durations_name_each_unit_once_from_the_largest(text: str) -> None:
    with pytest.raises(ValidationError, match=r"--ttl must look like 30, 30s, 5m, 1h, 2d or 1h30m"):
        parse_duration(text, "--ttl")
