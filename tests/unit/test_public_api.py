"""The public surface: the facade's ``__all__`` (STYLE 1), docstrings, and an import that pulls
in no driver."""

from __future__ import annotations

import importlib
import inspect
import json
import subprocess
import sys
import types

import lease_lock

CORE_MODULES = [
    "lease_lock",
    "lease_lock.admin",
    "lease_lock.backends",
    "lease_lock.backends.base",
    "lease_lock.backends.memory",
    "lease_lock.clock",
    "lease_lock.connect",
    "lease_lock.errors",
    "lease_lock.events",
    "lease_lock.acquisition",
    "lease_lock.heartbeat",
    "lease_lock.leadership",
    "lease_lock.lock",
    "lease_lock.lease",
    "lease_lock.locker",
    "lease_lock.lockset",
    "lease_lock.options",
    "lease_lock.reentry",
    "lease_lock.retry",
    "lease_lock.testing",
    "lease_lock.validation",
    "lease_lock.waiting",
]
#: The names the documented API promises at the top level.
PROMISED_NAMES = {
    "AccessDeniedError", "LeaseLockError", "Lock", "LockEvent", "LockHeldError", "LockLostError",
    "LockSet", "LockState", "LockStateError", "Locker", "MemoryBackend", "RateLimitedError",
    "ReplicationError", "Retry", "RetryState", "ValidationError", "connect", "exponential_backoff",
}
DRIVERS = ["redis", "psycopg2", "requests", "pymongo", "waitress"]


def test_facade_all_is_sorted_and_complete() -> None:
    exported = lease_lock.__all__
    assert list(exported) == sorted(exported)
    assert len(set(exported)) == len(exported)
    public = {
        name
        for name, value in vars(lease_lock).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public | {"__version__"} == set(exported)
    assert set(exported) >= PROMISED_NAMES


def test_every_core_module_declares_all_and_documents_it() -> None:
    for name in CORE_MODULES:
        module = importlib.import_module(name)
        assert module.__doc__, f"{name} has no docstring"
        assert hasattr(module, "__all__"), f"{name} has no __all__"
        for attribute in module.__all__:
            value = getattr(module, attribute)
            if inspect.isclass(value) or inspect.isfunction(value):
                assert inspect.getdoc(value), f"{name}.{attribute} has no docstring"


def test_public_methods_are_documented() -> None:
    for cls in (lease_lock.Locker, lease_lock.Lock, lease_lock.LockSet, lease_lock.Retry, lease_lock.Leadership):
        for attribute, value in vars(cls).items():
            if attribute.startswith("_") or not (callable(value) or isinstance(value, property)):
                continue
            assert inspect.getdoc(value), f"{cls.__name__}.{attribute} has no docstring"


def test_importing_lease_lock_imports_no_driver() -> None:
    script = (
        "import json, sys, lease_lock\n"
        "lease_lock.connect('memory://').close()\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {DRIVERS!r})))\n"
    )
    output = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(output.stdout) == []


def test_version_is_a_string() -> None:
    assert isinstance(lease_lock.__version__, str) and lease_lock.__version__.count(".") >= 1
