"""A newcomer's first command works: a clone of this repository (its committed HEAD, as someone
cloning it gets), a fresh virtual environment that sees none of this one's packages, and the
README's "Try it on a fresh machine" command run as written, with the core install only."""

from __future__ import annotations

import os
import re
import subprocess
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def readme_command(section: str) -> str:
    """The one ``sh`` block of the README's ``## section``."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    [command] = re.findall(r"```sh\n(.*?)\n```", body, flags=re.DOTALL)
    return command


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_try_it_command_runs_on_a_fresh_clone_in_a_fresh_venv(tmp_path: Path) -> None:
    clone = tmp_path / "lease_lock"
    cloned = subprocess.run(
        ["git", "clone", "-q", str(ROOT), str(clone)], capture_output=True, text=True, timeout=300, check=False
    )
    assert cloned.returncode == 0, cloned.stderr
    environment = tmp_path / "venv"
    venv.create(environment, system_site_packages=False, with_pip=True)
    bin_dir = environment / "bin"
    # As if the user had activated the venv: its python first on PATH, nothing of this checkout
    # or of the test run's own environment leaking in.
    env = {name: value for name, value in os.environ.items() if name not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(VIRTUAL_ENV=str(environment), PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}")
    command = readme_command("Try it on a fresh machine")
    assert command == "python -m pip install -e . && python examples/contend.py"
    ran = subprocess.run(
        ["sh", "-c", command], cwd=clone, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "6 holds, none overlapping, fences rising with every grant" in ran.stdout, ran.stdout
    # The demo needed the core only: the install brought no driver with it.
    found = subprocess.run(
        [str(bin_dir / "python"), "-c", "import importlib.util as u; print([m for m in ('redis', 'psycopg2', "
         "'requests', 'waitress') if u.find_spec(m)])"],
        capture_output=True, text=True, timeout=60, check=True, env=env,
    )
    assert found.stdout.strip() == "[]", found.stdout
