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
    # fencing tests check that it refuses fences plainly instead.
    store = DictBackendWithoutFences


def test_a_backend_without_fences_cannot_pass_for_one_with_them() -> None:
    # The fencing tests must not pass by the mere declaration: a store that says it has no
    # fences but hands them out anyway (or that a Locker would accept with fencing=True) fails.
    backend = DictBackend()
    backend.capabilities = dataclasses.replace(DictBackend.capabilities, fencing=False)
    contract = BackendContract()
    with pytest.raises(pytest.fail.Exception):
        contract.without_fences(backend, "contract:lying")


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
