"""Backend capabilities are claims a backend makes, never ones it inherits: ``Capabilities()``
claims nothing, and every shipped backend spells out each field."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import ClassVar, Optional

import pytest
from lease_lock import Capabilities, Locker, MemoryBackend, ValidationError

PACKAGE = Path(__file__).resolve().parents[2] / "lease_lock"
FIELDS = {field.name for field in dataclasses.fields(Capabilities)}


def test_capabilities_claim_nothing_by_default() -> None:
    claims = Capabilities()
    assert [name for name in sorted(FIELDS - {"min_ttl", "clock", "wake"}) if getattr(claims, name)] == []
    assert claims.min_ttl == 0.0
    assert claims.clock == "not declared"
    assert claims.wake == "not declared"


class Undeclared(MemoryBackend):
    """A store with fences that forgot to say what it offers."""

    capabilities: ClassVar[Capabilities] = Capabilities()


def test_a_backend_that_declares_nothing_is_refused_fencing() -> None:
    with pytest.raises(ValidationError, match="fencing"):
        Locker(Undeclared(), fencing=True)
    with Locker(Undeclared()) as locker:
        assert locker.acquire("k").release()


def test_every_shipped_backend_declares_every_capability() -> None:
    # By name, in the source: a field left to its default would be a claim nobody made.
    declarations: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        if "Capabilities(" not in source:
            continue  # parsing every module of the package is most of this test's time
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Capabilities" and node.keywords:
                declarations[str(path.relative_to(PACKAGE))] = {keyword.arg or "" for keyword in node.keywords}
    assert {"backends/memory.py", "backends/sqlite.py", "backends/redis/__init__.py",
            "backends/postgres/_backend.py", "backends/http.py"} <= set(declarations)
    missing = {path: sorted(FIELDS - given) for path, given in declarations.items() if FIELDS - given}
    assert missing == {}


class FencedOnly(MemoryBackend):
    """Writes only the fenced grant, as a backend relying on the base class's acquire does."""

    def acquire(self, key: str, token: str, ttl: float, owner: str) -> bool:
        # The base class's default, reached past the memory backend's own plain grant.
        return super(MemoryBackend, self).acquire(key, token, ttl, owner)

    def acquire_fenced(self, key: str, token: str, ttl: float, owner: str) -> Optional[int]:
        self.fenced_calls += 1
        return super().acquire_fenced(key, token, ttl, owner)

    fenced_calls = 0


def test_acquire_defaults_to_the_fenced_grant_without_its_fence() -> None:
    backend = FencedOnly()
    assert backend.acquire("k", "a" * 32, 30.0, "me") is True
    assert backend.acquire("k", "b" * 32, 30.0, "other") is False
    assert backend.fenced_calls == 2
    assert backend.inspect("k").fence is not None
