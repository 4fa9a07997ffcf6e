"""A held lock dropped at once (``if locker.try_acquire(key): work()``) is given back at once, so
the work runs unprotected: the warning saying so must be one Python shows by default, and must
tell the user which call returned the lock and what to do with it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import lease_lock
import pytest
from lease_lock import Locker, MemoryBackend
from lease_lock.errors import DroppedLockWarning

ROOT = Path(__file__).resolve().parents[2]


def test_the_warning_is_a_runtime_warning_of_our_own_exported_from_the_package() -> None:
    assert issubclass(DroppedLockWarning, RuntimeWarning)
    assert lease_lock.DroppedLockWarning is DroppedLockWarning
    assert "DroppedLockWarning" in lease_lock.__all__


@pytest.mark.parametrize(
    ("call", "take"),
    [
        ("Locker.try_acquire()", lambda locker: locker.try_acquire("job")),
        ("Locker.acquire()", lambda locker: locker.acquire("job")),
        ("Locker.lock()", lambda locker: locker.lock("job").acquire()),
    ],
)
def test_a_dropped_held_lock_names_its_key_and_the_call_that_returned_it(call: str, take: object) -> None:
    with Locker(MemoryBackend()) as locker:
        with pytest.warns(DroppedLockWarning) as caught:
            assert take(locker)  # type: ignore[operator]
        message = str(caught[0].message)
        assert "'job'" in message
        assert call in message
        assert "keep the returned Lock" in message
        assert "Lease" not in message


def test_a_dropped_reentrant_handle_warns_the_same_way() -> None:
    with Locker(MemoryBackend(), reentrant=True) as locker:
        with locker.lock("job"), pytest.warns(DroppedLockWarning) as caught:
            assert locker.try_acquire("job")
        message = str(caught[0].message)
        assert "'job'" in message and "Locker.try_acquire()" in message
        assert "keep the returned Lock" in message


def test_the_warning_is_shown_under_pythons_default_filters() -> None:
    # A plain interpreter: no -W, no -X dev, no PYTHONWARNINGS. A ResourceWarning would be hidden.
    environment = {
        name: value for name, value in os.environ.items() if name not in ("PYTHONWARNINGS", "PYTHONDEVMODE")
    }
    environment["PYTHONPATH"] = str(ROOT)
    program = (
        "import lease_lock\n"
        "with lease_lock.connect('memory://') as locker:\n"
        "    if locker.try_acquire('report'):\n"
        "        pass\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert "DroppedLockWarning" in completed.stderr
    assert "'report'" in completed.stderr and "keep the returned Lock" in completed.stderr
