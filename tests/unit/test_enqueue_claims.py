"""Enqueue-time claims (Celery ``lock_on_enqueue``, RQ ``enqueue_once``): a store that cannot
adopt a claim is refused before anything is claimed, whether the backend class says so or only
the store behind it (the HTTP client's service) can."""

from __future__ import annotations

from typing import Optional

import pytest
from lease_lock import Backend, Locker, MemoryBackend, ValidationError
from lease_lock.contrib._enqueue import claim

JOB = "0123456789abcdef0123456789abcdef"


class CannotAdopt(MemoryBackend):
    """A backend class that keeps the base class's refusal."""

    adopt = Backend.adopt


class StoreCannotAdopt(MemoryBackend):
    """A client whose class offers ``adopt`` but whose store behind it refuses it (as the HTTP
    client does for a service whose store has none)."""

    def adopt(self, key: str, claim_token: str, token: str, ttl: float, owner: str) -> Optional[int]:
        raise NotImplementedError("the store behind this client cannot adopt a claim")


@pytest.mark.parametrize("backend_class", [CannotAdopt, StoreCannotAdopt])
def test_a_store_that_cannot_adopt_is_refused_before_anything_is_claimed(backend_class: type[MemoryBackend]) -> None:
    backend = backend_class()
    with Locker(backend) as locker:
        with pytest.raises(ValidationError, match=f"{backend_class.__name__} cannot adopt"):
            claim(locker, "job-key", JOB, 3600.0)
        assert list(backend.scan("")) == [], "nothing was claimed"
        assert locker.try_acquire("job-key") is not None, "the key is free for the next caller"


def test_a_claim_is_written_once_and_answered_with_its_holder() -> None:
    backend = MemoryBackend()
    with Locker(backend) as locker:
        assert claim(locker, "job-key", JOB, 3600.0) is None
        assert claim(locker, "job-key", JOB, 3600.0) is None, "the same job's claim again is its own"
        holder = claim(locker, "job-key", "fedcba9876543210fedcba9876543210", 3600.0)
        assert holder is not None and holder.held and holder.owner is not None and holder.owner.endswith(JOB)
