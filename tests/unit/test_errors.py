"""Errors: stable codes, attributes, builtins mixed in, pickling."""

from __future__ import annotations

import pickle

import pytest
from lease_lock import (
    AccessDeniedError,
    LeaseLockError,
    LockHeldError,
    LockLostError,
    LockStateError,
    RateLimitedError,
    ReplicationError,
    ValidationError,
)

ERRORS: list[tuple[LeaseLockError, str, dict[str, object]]] = [
    (
        LockHeldError("order:1", attempts=3, elapsed=1.5, reason="timeout"),
        "LOCK_HELD",
        {"key": "order:1", "attempts": 3, "elapsed": 1.5, "reason": "timeout"},
    ),
    (
        LockLostError("order:1", "extend-failed", completed=True, result={"rows": 3}),
        "LOCK_LOST",
        {"key": "order:1", "reason": "extend-failed", "completed": True, "result": {"rows": 3}},
    ),
    (LockStateError("closed locker"), "LOCK_STATE", {}),
    (ValidationError("ttl must be > 0 seconds"), "LOCK_VALIDATION", {}),
    (RateLimitedError("slow down", retry_after=2.5), "LOCK_RATE_LIMITED", {"retry_after": 2.5, "status": 429}),
    (ReplicationError("1 of 2", replicas=2, acknowledged=1), "LOCK_REPLICATION", {"replicas": 2, "acknowledged": 1}),
    (AccessDeniedError("no scope", status=403), "LOCK_ACCESS_DENIED", {"status": 403}),
]


@pytest.mark.parametrize(("error", "code", "attributes"), ERRORS, ids=[type(case[0]).__name__ for case in ERRORS])
def test_code_attributes_and_pickle_round_trip(error: LeaseLockError, code: str, attributes: dict[str, object]) -> None:
    assert isinstance(error, LeaseLockError)
    assert error.code == code == type(error).code
    for name, value in attributes.items():
        assert getattr(error, name) == value
    copy = pickle.loads(pickle.dumps(error))  # noqa: S301 - our own bytes, made just above
    assert type(copy) is type(error)
    assert str(copy) == str(error) and copy.args == error.args
    for name, value in attributes.items():
        assert getattr(copy, name) == value


def test_pickled_lost_error_keeps_its_default_fields() -> None:
    copy = pickle.loads(pickle.dumps(LockLostError("k", "expired")))  # noqa: S301 - our own bytes
    assert (copy.completed, copy.result) == (False, None)


def test_validation_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="bad"):
        raise ValidationError("bad ttl")


def test_messages_say_what_happened() -> None:
    held = str(LockHeldError("job", attempts=2, elapsed=0.25, reason="held"))
    assert "job" in held and "2 attempt" in held
    lost = str(LockLostError("job", "max-hold", completed=True))
    assert "job" in lost and "max-hold" in lost and "before the loss was noticed" in lost
    # The loss happened while the block ran; only its discovery came after.
    assert "after the block completed" not in lost
    assert "while held" in str(LockLostError("job", "extend"))


def test_codes_are_distinct() -> None:
    codes = [code for _, code, _ in ERRORS]
    assert len(set(codes)) == len(codes)
    assert LeaseLockError.code not in codes
