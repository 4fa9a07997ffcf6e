"""The unit suite keeps to its rules: no server and no real time (a fake clock moves instead).

Tests that need a server or the real clock belong in ``tests/backends`` or
``tests/integration``. This check catches the plain cases (a server fixture, a real sleep); a
wait that only ends when real time passes must be caught in review.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support import http_server, postgres_server, redis_server

UNIT = Path(__file__).resolve().parent


def _server_fixtures() -> set[str]:
    names: set[str] = set()
    for module in (http_server, postgres_server, redis_server):
        tree = ast.parse(Path(str(module.__file__)).read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and any("fixture" in ast.unparse(d) for d in node.decorator_list):
                names.add(node.name)
    return names


def _offences(path: Path, servers: set[str]) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef):
            found += [f"{node.name} takes {arg.arg}" for arg in node.args.args if arg.arg in servers]
        elif isinstance(node, ast.Constant) and node.value in servers:
            found.append(f"names the fixture {node.value!r}")  # request.getfixturevalue(...)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests.support.") and (
            node.module or ""
        ).rsplit(".", 1)[-1] in {"http_server", "postgres_server", "redis_server"}:
            found.append(f"imports {node.module}")
        elif (
            isinstance(node, ast.Call)
            and ast.unparse(node.func) == "time.sleep"
            and not (node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value == 0)
        ):
            found.append(f"sleeps on the real clock at line {node.lineno}")
    return [f"{path.name}: {offence}" for offence in found]


def test_unit_tests_use_no_server_and_do_not_sleep() -> None:
    servers = _server_fixtures()
    assert {"redis_server", "postgres_server", "lock_service"} <= servers
    offences = [
        offence for path in sorted(UNIT.glob("*.py")) if path.name != Path(__file__).name
        for offence in _offences(path, servers)
    ]
    assert offences == []


def test_the_check_finds_a_server_and_a_sleep(tmp_path: Path) -> None:
    sample = tmp_path / "test_sample.py"
    sample.write_text(
        "import time\n"
        "def test_a(redis_server): pass\n"
        "def test_b(request): request.getfixturevalue('postgres_server')\n"
        "def test_c(): time.sleep(0.1)\n"
        "def test_d(): time.sleep(0)\n",
        encoding="utf-8",
    )
    assert sorted(_offences(sample, _server_fixtures())) == [
        "test_sample.py: names the fixture 'postgres_server'",
        "test_sample.py: sleeps on the real clock at line 4",
        "test_sample.py: test_a takes redis_server",
    ]
