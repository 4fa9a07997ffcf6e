"""The package's shape: modules import each other in one direction, and no module reaches into
another module's private names.

Both rules are checked on the source (``ast``), so type-only imports (under ``TYPE_CHECKING``) and
imports inside functions count like any other. The layer rules themselves are import-linter
contracts in setup.cfg (``lint-imports`` in ``.ci/run``); these tests catch what those contracts
cannot say: cycles between modules of the same layer, and private reaches.

The private-name rule, as enforced here: in a module of ``lease_lock``,

* ``from .x import _y`` (or ``from lease_lock.x import _y``) is an error, and so is
  ``x._y`` where ``x`` is a module imported by name;
* ``obj._y`` where ``obj`` is not ``self``/``cls``/``super()`` is an error unless this same
  module defines ``_y`` (a ``def _y``, a ``self._y = ...`` or a class-level ``_y``): a private
  attribute may be read only by the module that owns the class it belongs to;
* ``self._a._y`` (reaching through one of our attributes into another object's private) follows
  the same rule.

Dunder names (``__x__``) are public protocol names and never count, nor do documented
standard-library names such as ``os._exit``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import lease_lock

PACKAGE = Path(lease_lock.__file__).parent
#: Standard-library names that start with an underscore yet are documented public API.
STDLIB_PUBLIC = {("os", "_exit"), ("sys", "_getframe")}


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base.pop()
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    """Every lease_lock module that ``module`` imports, anywhere in its source."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    targets: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, is_package, node)
            targets.add(source)
            targets.update(f"{source}.{alias.name}" for alias in node.names)
    return {target for target in targets if target in known and target != module}


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle in ``graph`` (empty when there is none)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return [*stack[stack.index(target):], target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return []


def test_no_import_cycles_inside_lease_lock() -> None:
    modules = _modules()
    # A package's __init__ only re-exports; importing a submodule runs it first, which is no
    # dependency of the submodule on its siblings. Parents are dropped from the graph's targets.
    known = set(modules)
    graph = {
        name: {target for target in _imports(name, path, known) if not name.startswith(target + ".")}
        for name, path in modules.items()
    }
    packages = {name for name, path in modules.items() if path.name == "__init__.py"}
    graph = {name: targets - packages for name, targets in graph.items() if name not in packages}
    assert _cycle(graph) == []


def _owned_names(tree: ast.Module) -> set[str]:
    owned: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            owned.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if isinstance(node.value, ast.Name) and node.value.id in {"self", "cls"}:
                owned.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            owned.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            owned.add(node.target.id)
        elif isinstance(node, ast.ClassDef):
            owned.add(node.name)
    for node in ast.walk(tree):
        # __slots__ = ("_a", "_b") declares attributes owned here.
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__slots__" for target in node.targets
        ):
            for element in ast.walk(node.value):
                if isinstance(element, ast.Constant) and isinstance(element.value, str):
                    owned.add(element.value)
    return owned


def _private_reaches(module: str, path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    owned = _owned_names(tree)
    imported_modules: set[str] = set()
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = _resolve(module, is_package, node)
            for alias in node.names:
                # A package may import its own private submodules (``from ._scripts import ...``
                # inside ``backends/redis/__init__.py``): they are its parts, not another's.
                own_part = is_package and source == module
                if source.startswith("lease_lock") and _is_private(alias.name) and not own_part:
                    problems.append(f"{path.name}:{node.lineno} imports {source}.{alias.name}")
                if alias.name[:1].islower():
                    imported_modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                imported_modules.add((alias.asname or alias.name).split(".")[0])
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not _is_private(node.attr):
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in {"self", "cls"}:
            continue
        if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
            continue
        if isinstance(owner, ast.Name) and (owner.id, node.attr) in STDLIB_PUBLIC:
            continue
        if isinstance(owner, ast.Name) and owner.id in imported_modules and node.attr not in owned:
            problems.append(f"{path.name}:{node.lineno} reads module attribute {owner.id}.{node.attr}")
        elif node.attr not in owned:
            problems.append(f"{path.name}:{node.lineno} reads {ast.unparse(node)} (not defined in this module)")
    return problems


def test_no_module_reaches_into_another_modules_private_names() -> None:
    problems = []
    for module, path in _modules().items():
        problems.extend(_private_reaches(module, path))
    assert problems == []


def test_the_checks_catch_what_they_promise(tmp_path: Path) -> None:
    # The scanner itself: a cross-module private import and a reach into a foreign private are
    # found, while self's own privates and a same-module class's privates are not.
    source = (
        "from .lock import _hidden\n"
        "class A:\n"
        "    def __init__(self, other):\n"
        "        self._mine = 1\n"
        "        self._other = other\n"
        "    def go(self, peer):\n"
        "        return self._mine, peer._mine, self._other._foreign, peer._foreign\n"
    )
    path = tmp_path / "sample.py"
    tree = ast.parse(source)
    owned = _owned_names(tree)
    assert "_mine" in owned and "_foreign" not in owned
    path.write_text(source)
    tree_problems = _private_reaches("lease_lock.sample", path)
    assert len(tree_problems) == 3
    assert "lease_lock.lock._hidden" in tree_problems[0]
    assert _cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) == []
