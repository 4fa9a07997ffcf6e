"""The backend written out in docs/howto/writing-a-backend.md passes the contract suite, and the
page's usage example runs as written."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lease_lock
import pytest
from lease_lock.backends import SCHEMES
from lease_lock.testing import BackendContract

PAGE = Path(__file__).resolve().parent.parent / "docs" / "howto" / "writing-a-backend.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.DOTALL)


def _page_namespace() -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "writing_a_backend"}
    exec(compile(_blocks()[0], f"{PAGE.name} block 1", "exec"), namespace)  # noqa: S102
    return namespace


NAMESPACE = _page_namespace()
DictBackend = NAMESPACE["DictBackend"]


class TestTheDocumentedBackend(BackendContract):
    store: Any = DictBackend

    @pytest.fixture
    def backend(self) -> Iterator[lease_lock.Backend]:
        backend = self.store()
        yield backend
        backend.close()


class DictBackendWithoutFences(DictBackend):  # type: ignore[misc,valid-type]
    """The page's backend as a store that keeps no fence counter would be written: its
    capabilities say so and ``acquire_fenced`` refuses, as the page tells such a store to do."""

    capabilities = dataclasses.replace(DictBackend.capabilities, fencing=False)

    def acquire(self, key: str, token: str, ttl: float, owner: str) -> bool:
        # The page's storage, with the fence it keeps hidden from every answer.
        return super().acquire_fenced(key, token, ttl, owner) is not None

    def acquire_fenced(self, key: str, token: str, ttl: float, owner: str) -> None:
        raise NotImplementedError("this store hands out no fences")

    def inspect(self, key: str) -> lease_lock.LockState:
        return dataclasses.replace(super().inspect(key), fence=None)


class TestABackendWithoutFences(TestTheDocumentedBackend):
    # A third party that implements the lock calls and no fences passes the suite too: the
    # fencing tests check that it refuses fences plainly, then skip with the reason.
    store = DictBackendWithoutFences


def test_a_backend_without_fences_cannot_pass_for_one_with_them() -> None:
    # The fencing tests must not pass by the mere declaration: a store that says it has no
    # fences but hands them out anyway (or that a Locker would accept with fencing=True) fails.
    backend = DictBackend()
    backend.capabilities = dataclasses.replace(DictBackend.capabilities, fencing=False)
    contract = BackendContract()
    with pytest.raises(pytest.fail.Exception):
        contract.skip_without(backend, "fencing", "contract:lying")


def test_the_fencing_tests_of_a_backend_without_fences_are_skipped_with_the_reason() -> None:
    # Skipped, not passed: the report must show that fences were never tested on this store.
    backend = DictBackendWithoutFences()
    contract = BackendContract()
    with pytest.raises(pytest.skip.Exception, match=r"does not declare capabilities\.fencing"):
        contract.test_fences_rise_with_every_grant(backend, "contract:fenceless")


def test_an_undeclared_capability_the_backend_has_anyway_fails_the_refusal_check() -> None:
    backend = DictBackend()
    contract = BackendContract()
    with pytest.raises(pytest.skip.Exception, match="scan"):
        contract.test_scan_lists_held_keys(backend, "contract:scanless")
    backend.scan = lambda prefix: iter([])  # lists (nothing) while claiming it cannot
    with pytest.raises(pytest.fail.Exception):
        contract.test_scan_lists_held_keys(backend, "contract:scanless")


class DictBackendWithOneFenceSlot(DictBackend):  # type: ignore[misc,valid-type]
    """Reports, for any held key, the fence of the latest grant of any key: one slot shared by
    every key where each key needs its own."""

    latest = 0

    def acquire_fenced(self, key: str, token: str, ttl: float, owner: str) -> Any:
        fence = super().acquire_fenced(key, token, ttl, owner)
        if fence is not None:
            self.latest = fence
        return fence

    def inspect(self, key: str) -> lease_lock.LockState:
        state = super().inspect(key)
        return dataclasses.replace(state, fence=self.latest) if state.held else state


class DictBackendForgettingChildCounters(DictBackend):  # type: ignore[misc,valid-type]
    """Force-releasing a key also forgets the fence counters of the keys under it
    (``key:...``), as a careless ``DELETE ... WHERE key LIKE 'key:%'`` would: those keys'
    fences start again from 1."""

    def force_release(self, key: str) -> bool:
        dropped: bool = super().force_release(key)
        for name in [name for name in self._fences if name.startswith(f"{key}:")]:
            del self._fences[name]
        return dropped


class _OneCount(dict[str, int]):
    """A fence table in which every key reads and writes the same count."""

    count = 0

    def get(self, key: str, default: Any = None) -> int:  # type: ignore[override]
        return self.count

    def __setitem__(self, key: str, value: int) -> None:
        self.count = value


class DictBackendWithOneCounter(DictBackend):  # type: ignore[misc,valid-type]
    """Draws every key's fences from one counter, as PostgreSQL's single sequence does: fences
    still rise per key, which is all the contract promises."""

    def __init__(self) -> None:
        super().__init__()
        self._fences = _OneCount()


@pytest.mark.parametrize("store", [DictBackendWithOneFenceSlot, DictBackendForgettingChildCounters])
def test_fence_independence_fails_a_store_whose_keys_share_fence_state(store: Any) -> None:
    contract = BackendContract()
    # The single-key fencing tests pass: only a second key shows the fault.
    contract.test_fences_rise_with_every_grant(store(), "contract:one")
    contract.test_fence_kept_by_extend_and_reacquire(store(), "contract:one")
    with pytest.raises(AssertionError):
        contract.test_fences_of_different_keys_are_independent(store(), "contract:two")


def test_fence_independence_allows_one_counter_for_every_key() -> None:
    backend = DictBackendWithOneCounter()
    BackendContract().test_fences_of_different_keys_are_independent(backend, "contract:shared")
    assert backend._fences.count == 9  # both keys' nine grants drew from the one counter


def test_the_page_shows_the_contract_subclass() -> None:
    namespace = dict(NAMESPACE)
    exec(compile(_blocks()[1], f"{PAGE.name} block 2", "exec"), namespace)  # noqa: S102
    assert issubclass(namespace["TestDictBackend"], BackendContract)


def test_the_usage_example_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    # register_scheme changes a process-wide table: put it back afterwards.
    monkeypatch.setattr("lease_lock.backends.SCHEMES", dict(SCHEMES))
    namespace = dict(NAMESPACE)
    exec(compile(_blocks()[2], f"{PAGE.name} block 3", "exec"), namespace)  # noqa: S102
    assert isinstance(namespace["locker"].backend, DictBackend)
    assert namespace["locker"].closed
