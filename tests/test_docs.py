"""The documentation stays true: generated pages are current and the README's example runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_generated_pages_are_current() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "generate.py"), "--check"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr


def test_readme_example_runs_and_checks_its_claim(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "contend.py"), f"sqlite:///{tmp_path / 'example.db'}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "6 holds, none overlapping, fences rising with every grant" in result.stdout
    # The README promises the demo needs only the core install.
    assert "python -m pip install -e . && python examples/contend.py" in (ROOT / "README.md").read_text()


def test_tutorial_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LEASE_LOCK_URL", f"sqlite:///{tmp_path / 'tutorial.db'}")
    text = (ROOT / "docs" / "tutorial.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    assert len(blocks) >= 6
    namespace: dict[str, object] = {}
    for number, block in enumerate(blocks, start=1):
        exec(compile(block, f"docs/tutorial.md block {number}", "exec"), namespace)  # noqa: S102
    printed = capsys.readouterr().out
    assert "busy: timeout" in printed
    assert "lost because: observed" in printed


def _python_blocks() -> list[tuple[str, int, str]]:
    found = []
    for page in sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]):
        text = page.read_text(encoding="utf-8")
        for number, block in enumerate(re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL), start=1):
            found.append((str(page.relative_to(ROOT)), number, block))
    return found


@pytest.mark.parametrize(("page", "number", "block"), _python_blocks(), ids=lambda value: str(value)[:40])
def test_every_python_example_in_the_docs_is_valid_python(page: str, number: int, block: str) -> None:
    # Pages whose examples need a framework or a server are compiled here; the tutorial and the
    # Redis page are also executed by their own tests.
    compile(block, f"{page} block {number}", "exec")


def test_recipes_run_as_written() -> None:
    text = (ROOT / "docs" / "howto" / "recipes.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    assert len(blocks) >= 9
    namespace: dict[str, object] = {}
    for number, block in enumerate(blocks, start=1):
        exec(compile(block, f"docs/howto/recipes.md block {number}", "exec"), namespace)  # noqa: S102
    assert namespace["done"] == [0, 1]
