"""The typed surface of lock options and reasons: each Locker call's keyword-only options are
``LockOptions``' (so the signatures cannot drift from the validation), the ``Literal`` types list
what the library really uses (tests/test_packaging.py runs a type checker over them)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Callable, get_args

import lease_lock
import pytest
from lease_lock import Locker, ValidationError, connect
from lease_lock.events import EVENT_TYPES
from lease_lock.options import LOCK_OPTIONS, NOT_GIVEN, OPTION_DEFAULTS

ROOT = Path(__file__).resolve().parent.parent.parent
WAITING_OPTIONS = {"retry", "timeout", "blocking"}
#: Each call's keyword-only parameters besides the lock options.
OWN_KEYWORDS = {"locked": {"skip"}}
#: The options a call does not take: try_acquire makes one attempt.
NOT_TAKEN = {"try_acquire": WAITING_OPTIONS}


@pytest.mark.parametrize("method", ["lock", "acquire", "try_acquire", "locked", "acquire_many"])
def test_each_call_takes_the_lock_options_as_keywords_with_their_defaults(method: str) -> None:
    parameters = inspect.signature(getattr(Locker, method)).parameters.values()
    keywords = {each.name: each.default for each in parameters if each.kind is each.KEYWORD_ONLY}
    assert set(keywords) == (LOCK_OPTIONS - NOT_TAKEN.get(method, set())) | OWN_KEYWORDS.get(method, set())
    assert not any(parameter.kind is parameter.VAR_KEYWORD for parameter in parameters)
    for name in LOCK_OPTIONS & set(keywords):
        # locked() must tell blocking=True from no blocking at all: skip=True means one attempt.
        expected = NOT_GIVEN if (method, name) == ("locked", "blocking") else OPTION_DEFAULTS[name]
        assert keywords[name] is expected, name


CALLS: dict[str, Callable[..., object]] = {
    "lock": lambda locker, **option: locker.lock("k", **option),
    "acquire": lambda locker, **option: locker.acquire("k", **option),
    "try_acquire": lambda locker, **option: locker.try_acquire("k", **option),
    "locked": lambda locker, **option: locker.locked("k", **option)(lambda: None)(),
    "acquire_many": lambda locker, **option: locker.acquire_many(["k"], **option),
}


@pytest.mark.parametrize("method", sorted(CALLS))
def test_every_option_a_call_takes_reaches_its_validation(method: str) -> None:
    # A call's fast path for "no option given" must not overlook one: each bad value is refused.
    parameters = inspect.signature(getattr(Locker, method)).parameters
    with connect("memory://") as locker:
        for name in LOCK_OPTIONS & set(parameters):
            with pytest.raises(ValidationError, match=name):
                CALLS[method](locker, **{name: object()})
        assert list(locker.list()) == []


def test_the_event_type_literal_lists_every_event_type() -> None:
    assert set(get_args(lease_lock.EventType)) == set(EVENT_TYPES)


def test_the_lost_reason_literal_lists_the_documented_reasons() -> None:
    page = (ROOT / "docs" / "reference" / "lost-reasons.md").read_text(encoding="utf-8")
    documented = set(re.findall(r'^\| `"([a-z-]+)"` \|', page, re.MULTILINE))
    assert set(get_args(lease_lock.LostReason)) == documented


def test_the_held_reason_literal_lists_the_reasons_the_error_names() -> None:
    described = set(re.findall(r'``"([a-z-]+)"``', lease_lock.LockHeldError.__doc__ or ""))
    assert set(get_args(lease_lock.HeldReason)) == described
