"""A missing driver, in a real ``python`` process: ``connect()`` names the extra to install and
``python -m lease_lock`` exits 2 with one line. The in-process setup errors are unit tests
(``tests/unit/test_setup_errors.py``).

A missing driver is simulated the way Python itself reports one: the driver's name maps to
``None`` in ``sys.modules`` (from a ``sitecustomize`` on the path of the process, so the command
runs exactly as a user would start it).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

DEADLINE = 60.0

MISSING_DRIVERS = [
    ("redis", "redis://127.0.0.1:6379/0", "redis"),
    ("psycopg2", "postgresql://root@127.0.0.1:5432/test", "postgres"),
    ("requests", "http://127.0.0.1:9/", "http"),
]


def _without(module: str, tmp_path: Path) -> dict[str, str]:
    """An environment whose Python cannot import ``module``."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(f"import sys\nsys.modules[{module!r}] = None\n")
    path = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    return dict(os.environ, PYTHONPATH=path, XDG_STATE_HOME=str(tmp_path / "state"))


@pytest.mark.parametrize(("module", "url", "extra"), MISSING_DRIVERS)
def test_connect_without_the_driver_names_the_extra(module: str, url: str, extra: str, tmp_path: Path) -> None:
    script = (
        "from lease_lock import connect, ValidationError\n"
        "try:\n"
        f"    connect({url!r})\n"
        "except ValidationError as error:\n"
        "    print(error)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], env=_without(module, tmp_path), capture_output=True, text=True,
        timeout=DEADLINE, check=True,
    )
    assert f"pip install 'lease_lock[{extra}]'" in result.stdout
    assert result.stderr == ""


@pytest.mark.parametrize(("module", "url", "extra"), MISSING_DRIVERS)
def test_cli_without_the_driver_exits_2_with_one_line(module: str, url: str, extra: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "lease_lock", "status", "k", "--url", url], env=_without(module, tmp_path),
        capture_output=True, text=True, timeout=DEADLINE, check=False,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert f"pip install 'lease_lock[{extra}]'" in lines[0]
