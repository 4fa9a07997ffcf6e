"""The documentation stays true: generated pages are current, the README's example runs, the
reference pages agree with the code, and the built site has no broken link."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import urllib.parse
from html.parser import HTMLParser
from pathlib import Path
from typing import Optional

import pytest
from lease_lock import Locker

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


def _run_blocks(blocks: list[str], page: str, namespace: dict[str, object]) -> None:
    """Run a page's blocks in ``namespace`` in order, then close every Locker a block left in it
    and let go of them all: the blocks' functions keep the namespace in a reference cycle, and a
    Locker left open there would warn when the cyclic collector frees it, during whichever test
    runs then. Lockers are gathered after each block, since a later block may rebind the name."""
    made: list[Locker] = []
    try:
        for number, block in enumerate(blocks, start=1):
            exec(compile(block, f"{page} block {number}", "exec"), namespace)  # noqa: S102
            made.extend(value for value in namespace.values() if isinstance(value, Locker) and value not in made)
    finally:
        for locker in made:
            locker.close()


def test_tutorial_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LEASE_LOCK_URL", f"sqlite:///{tmp_path / 'tutorial.db'}")
    text = (ROOT / "docs" / "tutorial.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    assert len(blocks) >= 6
    namespace: dict[str, object] = {}
    _run_blocks(blocks, "docs/tutorial.md", namespace)
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
    _run_blocks(blocks, "docs/howto/recipes.md", namespace)
    assert namespace["done"] == [0, 1]


# -- pages that must say what the code does ------------------------------------------------------


def _table_rows(text: str, first_header: str) -> list[list[str]]:
    """The cells of the Markdown table whose first header cell is ``first_header``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def test_the_events_reference_lists_every_event_type_with_its_level_and_fields() -> None:
    import dataclasses
    import logging

    from lease_lock.events import EVENT_TYPES, LockEvent

    rows = _table_rows((ROOT / "docs" / "reference" / "events.md").read_text(encoding="utf-8"), "`type`")
    documented = {row[0].strip("`"): logging.getLevelName(row[1]) for row in rows}
    assert documented == EVENT_TYPES
    fields = {field.name for field in dataclasses.fields(LockEvent)}
    for row in rows:
        named = set(re.findall(r"`([a-z_]+)`", row[2]))
        assert named <= fields, (row[0], named - fields)


def _command_tree() -> dict[str, argparse.ArgumentParser]:
    """Every ``lease-lock`` command and sub-action by its words (``"service-keys create"``)."""
    from lease_lock.cli import build_parser

    tree: dict[str, argparse.ArgumentParser] = {}

    def walk(parser: argparse.ArgumentParser, words: str) -> None:
        tree[words] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{words} {name}".strip())

    walk(build_parser(), "")
    return tree


def _documented_command_lines() -> list[tuple[str, int, str]]:
    found = []
    for page in sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]):
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1):
            for match in re.finditer(r"lease-lock((?: +[^\s`|;&)\]]+)+)", line):
                found.append((str(page.relative_to(ROOT)), number, match.group(1)))
    return found


def test_every_command_and_option_the_docs_show_exists() -> None:
    tree = _command_tree()
    wrong = []
    for page, number, words in _documented_command_lines():
        # What follows "--" is the guarded command's own line, not lease-lock's.
        given = words.split(" -- ")[0].split()
        command = ""
        while given and not given[0].startswith("-") and f"{command} {given[0]}".strip() in tree:
            command = f"{command} {given.pop(0)}".strip()
        if given and re.fullmatch(r"[a-z][a-z-]*", given[0]) and not command:
            wrong.append(f"{page}:{number}: no command {given[0]!r}")
            continue
        known = {option for action in tree[command]._actions for option in action.option_strings}
        for option in re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", " ".join(given)):
            if option not in known:
                wrong.append(f"{page}:{number}: lease-lock {command} has no {option}")
    assert not wrong, "\n".join(wrong)


def test_the_changelog_lists_the_commands_of_lease_lock_help() -> None:
    from lease_lock.cli import build_parser

    (commands,) = [action for action in build_parser()._actions if isinstance(action, argparse._SubParsersAction)]
    shown = [item.dest for item in commands._choices_actions if "deprecated" not in (item.help or "")]
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    line = re.search(r"^- The `lease-lock` command: (.*)\.$", text, flags=re.MULTILINE)
    assert line is not None
    assert re.findall(r"`([a-z-]+)`", line.group(1)) == shown


def test_each_option_states_its_default_once_and_truly() -> None:
    # The command reference shows the help texts without sphinx-argparse's own "Default:" line,
    # so a default that matters must be in the help, and be the parser's.
    wrong = []
    for words, parser in _command_tree().items():
        for action in parser._actions:
            if action.help in (None, argparse.SUPPRESS) or not action.option_strings:
                continue
            if action.default in (None, False, "", argparse.SUPPRESS) or isinstance(action, argparse._HelpAction):
                continue
            text = action.help % {**vars(action), "prog": parser.prog}
            stated = re.search(r"\(default:? ([^;)]+)\)", text)
            if stated is None:
                wrong.append(f"lease-lock {words} {action.option_strings[-1]}: no default in {text!r}")
                continue
            value = action.type(stated.group(1)) if callable(action.type) else stated.group(1)
            if value != action.default:
                wrong.append(f"lease-lock {words} {action.option_strings[-1]}: says {value!r}, is {action.default!r}")
    assert not wrong, "\n".join(wrong)


# -- the built site ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The HTML site as ``tox -e docs`` builds it (every warning an error)."""
    try:
        import sphinx  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("the docs extra (sphinx) is required under CI")
        pytest.skip("needs the docs extra: pip install -e '.[docs]'")
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(ROOT / "docs"), str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def unquote_fragment(parts: urllib.parse.SplitResult) -> str:
    return urllib.parse.unquote(parts.fragment)


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, Optional[str]]]) -> None:
        found = dict(attrs)
        if found.get("id"):
            self.ids.add(str(found["id"]))
        if tag == "a" and found.get("href"):
            self.links.append(str(found["href"]))


def test_no_page_of_the_site_has_a_broken_internal_link(site: Path) -> None:
    pages = {}
    for path in site.rglob("*.html"):
        page = _Page()
        page.feed(path.read_text(encoding="utf-8"))
        pages[path.resolve()] = page
    broken = []
    for path, page in pages.items():
        for href in page.links:
            parts = urllib.parse.urlsplit(href)
            if parts.scheme or parts.netloc:
                continue
            target = (path.parent / urllib.parse.unquote(parts.path)).resolve() if parts.path else path
            if target.suffix != ".html":
                if not target.exists():
                    broken.append(f"{path.relative_to(site)}: {href}")
            elif target not in pages or unquote_fragment(parts) not in pages[target].ids | {""}:
                broken.append(f"{path.relative_to(site)}: {href}")
    assert not broken, f"{len(broken)} broken links:\n" + "\n".join(broken)


def test_the_command_reference_shows_options_as_typed_one_default_each_and_the_exit_table(site: Path) -> None:
    text = (site / "reference" / "command.html").read_text(encoding="utf-8")
    body = text[text.index("<article") : text.index("</article>")]
    # An en dash or curly quote copied from the page breaks the command it is pasted into.
    assert "\u2013" not in body and "\u2018" not in body and "\u2019" not in body
    assert "until --timeout" in body
    assert "Default:" not in body
    assert body.count("(default 30s)") == 1
    run = body[body.index('id="lease-lock-run"') : body.index('id="lease-lock-status"')]
    table = run[run.index("<table") : run.index("</table>")]
    assert table.count("<tr") == 7
    assert "<td><p>75</p></td>" in table
