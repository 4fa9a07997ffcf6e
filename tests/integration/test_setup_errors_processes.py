"""A missing driver, in a real ``python`` process: ``connect()`` names the extra to install and
``python -m lease_lock`` exits 2 with one line. The in-process setup errors are unit tests
(``tests/unit/test_setup_errors.py``).

A missing driver is simulated the way Python itself reports one: the driver's name maps to
``None`` in ``sys.modules`` (from a ``sitecustomize`` on the path of the process, so the command
runs exactly as a user would start it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

import lease_lock
import pytest
from lease_lock.validation import install_hint

DEADLINE = 60.0

MISSING_DRIVERS = [
    ("redis", "redis://127.0.0.1:6379/0", "redis"),
    ("psycopg2", "postgresql://root@127.0.0.1:5432/test", "postgres"),
    ("requests", "http://127.0.0.1:9/", "http"),
    ("pymongo", "mongodb://127.0.0.1:9/app", "mongodb"),
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
    assert install_hint(extra) in result.stdout
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
    assert install_hint(extra) in lines[0]


@pytest.mark.parametrize(
    ("origin", "hint"),
    [
        ({"url": "file:///src/lease%20lock", "dir_info": {"editable": True}},
         "pip install -e '/src/lease lock[redis]'"),
        ({"url": "file:///src/lease_lock", "dir_info": {}}, "pip install '/src/lease_lock[redis]'"),
        ({"url": "https://files.example/lease_lock-0.1.0-py3-none-any.whl", "archive_info": {}},
         "pip install 'lease_lock[redis]'"),
        (None, "pip install -e '.[redis]' in the lease_lock checkout (or pip install 'lease_lock[redis]')"),
    ],
)
def test_the_install_hint_says_how_this_copy_was_installed(
    origin: Optional[dict[str, object]], hint: str, tmp_path: Path
) -> None:
    # Installed metadata as pip writes it, found before the test venv's own.
    info = tmp_path / "lease_lock-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: lease_lock\nVersion: 0.1.0\n")
    if origin is not None:
        (info / "direct_url.json").write_text(json.dumps(origin))
    # Without site-packages (-S): the package from its source tree, plus the metadata above.
    source = Path(lease_lock.__file__).resolve().parents[1]
    script = (
        f"import sys; sys.path[:0] = [{str(tmp_path)!r}, {str(source)!r}]\n"
        "from lease_lock.validation import install_hint\n"
        "print(install_hint('redis'))\n"
    )
    result = subprocess.run(
        [sys.executable, "-I", "-S", "-c", script], capture_output=True, text=True, timeout=DEADLINE, check=True,
        cwd=tmp_path,
    )
    assert result.stdout.strip() == hint
