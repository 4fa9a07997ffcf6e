"""The install the README documents works for type checkers: ``mypy --strict`` on a user's file
finds the package, and its types, after a strict editable install; ``py.typed`` ships; and the
typed lock options make a type checker refuse a misspelt option or a bad value."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path
from typing import Optional

import pytest

ROOT = Path(__file__).resolve().parent.parent

USER_FILE = """\
import lease_lock

locker: lease_lock.Locker = lease_lock.connect("memory://")
with locker.lock("report") as lock:
    fence: "int | None" = lock.fence
"""

WRONG_USER_FILE = """\
import lease_lock

fence: str = lease_lock.connect("memory://").lock("report").fence
"""


def _copy_project(target: Path) -> None:
    """The files an install reads, so the install's build tree stays out of the checkout."""
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, target / name)
    shutil.copytree(ROOT / "lease_lock", target / "lease_lock", ignore=shutil.ignore_patterns("__pycache__"))


def _mypy(*sources: Path, python: Optional[Path] = None) -> subprocess.CompletedProcess[str]:
    """``mypy --strict`` on ``sources``: as a user of the install in ``python``'s environment, or,
    without ``python``, against this checkout's package and with the project's own settings."""
    # The user's environment, not this checkout's: no PYTHONPATH or MYPYPATH leading mypy to the source.
    env = {name: value for name, value in os.environ.items() if name not in ("PYTHONPATH", "MYPYPATH")}
    options = ["--python-executable", str(python)] if python is not None else []
    if python is None:
        env["MYPYPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", *options, *map(str, sources)],
        cwd=sources[0].parent if python is not None else ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_mypy_sees_the_strict_editable_install(tmp_path: Path) -> None:
    project = tmp_path / "checkout"
    project.mkdir()
    _copy_project(project)
    environment = tmp_path / "env"
    # A user's own venv, blind to this one and to the base interpreter's packages: pip builds the
    # install in an isolated environment with the build requirements pyproject.toml names, fetched
    # from whatever index pip is configured with (a local one works offline), exactly as the
    # README's command does.
    venv.create(environment, system_site_packages=False, with_pip=True)
    python = environment / "bin" / "python"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "-e", str(project),
         "--config-settings", "editable_mode=strict"],
        capture_output=True, text=True, timeout=600, check=False,
        env={name: value for name, value in os.environ.items() if name not in ("PYTHONPATH", "PIP_NO_BUILD_ISOLATION")},
    )
    assert install.returncode == 0, install.stdout + install.stderr
    user = tmp_path / "user"
    user.mkdir()
    (user / "app.py").write_text(USER_FILE, encoding="utf-8")
    checked = _mypy(user / "app.py", python=python)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # It really read the package's annotations: a wrong type is caught.
    (user / "wrong.py").write_text(WRONG_USER_FILE, encoding="utf-8")
    wrong = _mypy(user / "wrong.py", python=python)
    assert wrong.returncode == 1 and "Incompatible types in assignment" in wrong.stdout, wrong.stdout


OPTIONS_RIGHT = """\
import math
from datetime import timedelta

import lease_lock

locker = lease_lock.connect("memory://")
locker.acquire("report", 30, timeout=timedelta(seconds=1), max_hold=math.inf, auto_extend=False)
locker.try_acquire("report", request_id="job-1")
locker.acquire_many(["a", "b"], timeout=2.5)
try:
    locker.lock("report", blocking=False).acquire()
except lease_lock.LockHeldError as error:
    waited_out: bool = error.reason == "timeout"
"""

OPTIONS_WRONG = """\
import lease_lock

locker = lease_lock.connect("memory://")
locker.acquire("report", ttl_seconds=30)
locker.try_acquire("report", timeout=1)
locker.lock("report", blocking="no")
locker.acquire_many(["a"], token="t" * 20)
reason: lease_lock.LostReason = "expird"
"""


def test_a_type_checker_refuses_a_misspelt_option_and_a_bad_value(tmp_path: Path) -> None:
    (tmp_path / "right.py").write_text(OPTIONS_RIGHT, encoding="utf-8")
    (tmp_path / "wrong.py").write_text(OPTIONS_WRONG, encoding="utf-8")
    checked = _mypy(tmp_path / "right.py", tmp_path / "wrong.py")
    errors = [line for line in checked.stdout.splitlines() if ": error: " in line]
    assert all(line.startswith(str(tmp_path / "wrong.py")) for line in errors), checked.stdout
    assert [int(line.split(":")[1]) for line in errors] == [4, 5, 6, 7, 8], checked.stdout + checked.stderr
    assert 'Unexpected keyword argument "ttl_seconds"' in checked.stdout
    assert 'Unexpected keyword argument "timeout" for "try_acquire"' in checked.stdout


def test_py_typed_ships() -> None:
    setup = (ROOT / "setup.cfg").read_text(encoding="utf-8")
    assert "lease_lock = py.typed" in setup
    assert (ROOT / "lease_lock" / "py.typed").is_file()


def _installs(requirement: str, extras: frozenset[str] = frozenset(), seen: set[str] | None = None) -> set[str]:
    """The distributions that installing ``requirement[extras]`` brings, read from the metadata of
    what this environment has installed (the environment holds every extra's dependencies)."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen = set() if seen is None else seen
    name = canonicalize_name(requirement)
    if name in seen:
        return seen
    seen.add(name)
    for line in metadata.requires(requirement) or []:
        needed = Requirement(line)
        wanted = needed.marker is None or any(
            needed.marker.evaluate({"extra": extra}) for extra in (extras or {""})
        )
        if wanted:
            _installs(needed.name, frozenset(needed.extras), seen)
    return seen


def test_the_celery_install_line_gives_a_worker_its_redis_transport_needs() -> None:
    # kombu's Redis transport imports packaging, which kombu lists only under its own redis
    # extra: without it a worker of `pip install -e '.[celery,redis]'` dies at start.
    assert "packaging" in _installs("lease_lock", frozenset({"celery", "redis"}))
