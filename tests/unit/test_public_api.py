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
    "lease_lock._acquisition",
    "lease_lock.heartbeat",
    "lease_lock.leadership",
    "lease_lock.lock",
    "lease_lock._lease",
    "lease_lock.locker",
    "lease_lock.lockset",
    "lease_lock.options",
    "lease_lock._held",
    "lease_lock.retry",
    "lease_lock.testing",
    "lease_lock.validation",
]
#: The names the documented API promises at the top level.
PROMISED_NAMES = {
    "AccessDeniedError", "DroppedLockWarning", "LeaseLockError", "Lock", "LockEvent", "LockHeldError", "LockLostError",
    "LockSet", "LockState", "LockStateError", "Locker", "MemoryBackend", "RateLimitedError",
    "ReplicationError", "Retry", "RetryState", "ValidationError", "connect", "exponential_backoff",
}
DRIVERS = ["redis", "psycopg2", "requests", "pymongo", "waitress", "django", "flask", "celery", "rq"]


def test_facade_all_is_sorted_and_complete() -> None:
    exported = lease_lock.__all__
    assert list(exported) == sorted(exported)
    assert len(set(exported)) == len(exported)
    # dir(), not vars(): most names load on first use (PEP 562), and dir() lists them before.
    public = {
        name
        for name in dir(lease_lock)
        if not name.startswith("_") and not isinstance(getattr(lease_lock, name), types.ModuleType)
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


def test_a_bare_import_loads_no_driver_no_server_and_no_core() -> None:
    # ``import lease_lock`` alone: the errors and connect() only; everything else on first use.
    script = "import json, sys, lease_lock\nprint(json.dumps(sorted(sys.modules)))\n"
    output = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    loaded = set(json.loads(output.stdout))
    assert not {module for module in loaded if module.split(".")[0] in DRIVERS}
    assert not {module for module in loaded if module.startswith("lease_lock.server")}
    assert not {module for module in loaded if module.startswith("lease_lock.backends")}
    assert "lease_lock.locker" not in loaded


def test_lazy_names_import_like_eager_ones() -> None:
    script = (
        "import sys\n"
        "from lease_lock import Locker, MemoryBackend, connect\n"
        "import lease_lock.connect as module\n"
        "import lease_lock\n"
        "assert lease_lock.connect is connect and callable(connect), lease_lock.connect\n"
        "assert lease_lock.Locker is Locker and lease_lock.MemoryBackend is MemoryBackend\n"
        "with connect('memory://') as locker, locker.lock('k') as lock:\n"
        "    assert lock.state == 'held'\n"
        "try:\n"
        "    lease_lock.NoSuchName\n"
        "except AttributeError:\n"
        "    print('ok')\n"
    )
    output = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert output.stdout.strip() == "ok"


def test_version_is_a_string() -> None:
    assert isinstance(lease_lock.__version__, str) and lease_lock.__version__.count(".") >= 1


#: Everything a user may call or read on a Lock (its context manager aside).
LOCK_NAMES = {
    "acquire", "check", "expires_in", "extend", "fence", "held_for", "holds", "is_held", "key", "limit", "lost",
    "lost_reason", "release", "retry", "state", "thread", "token", "ttl",
}
#: Everything a user may call or read on a Locker's class (``ttl`` and ``key_prefix`` are
#: attributes of each locker).
LOCKER_NAMES = {
    "acquire", "acquire_many", "backend", "close", "closed", "elect", "fencing", "force_release", "get", "list",
    "limit", "lock", "locked", "max_hold", "owner", "reentrant", "retry", "run_heartbeat", "try_acquire",
}


def test_a_lock_has_exactly_its_documented_public_names() -> None:
    from lease_lock import Lock

    assert {name for name in dir(Lock) if not name.startswith("_")} == LOCK_NAMES
    assert Lock.__doc__ is not None
    for name in LOCK_NAMES:
        assert f"``{name}``" in Lock.__doc__, f"Lock's docstring does not name {name}"
    assert hasattr(Lock, "__enter__") and hasattr(Lock, "__exit__")


def test_a_locker_has_exactly_the_names_users_call() -> None:
    # What only the library needs is a constructor option (heartbeat_thread, owns_backend), a
    # function of lease_lock.connect (check_locker_options) or private.
    from lease_lock import Locker

    assert {name for name in dir(Locker) if not name.startswith("_")} == LOCKER_NAMES
    with Locker(lease_lock.MemoryBackend()) as locker:
        assert {name for name in vars(locker) if not name.startswith("_")} == {"ttl", "key_prefix"}


def test_the_lock_module_exports_only_what_users_name() -> None:
    import lease_lock.lock

    assert sorted(lease_lock.lock.__all__) == ["Lock", "LossSignal"]
