"""The documentation describes the product: no lab-notebook prose, pages that fit their job, the
performance tables as their benchmarks' results give them, and front pages that name every
backend and extra there is."""

from __future__ import annotations

import configparser
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

# -- no measurement logs ---------------------------------------------------------------------

_MONTHS = "January|February|March|April|May|June|July|August|September|October|November|December"
_ORDINALS = "first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth"

#: Prose that belongs to a log of runs, not to a description of the product. "session" alone is
#: a word of the product (a PostgreSQL session, a ``requests.Session``); a session of work is
#: recognised by the words around it.
_NOTEBOOK = {
    "dated heading": re.compile(
        rf"^#+ .*(\b\d{{4}}-\d{{2}}-\d{{2}}\b|\b\d{{1,2}} ({_MONTHS})\b|\b({_MONTHS}) \d{{1,2}}\b)", re.MULTILINE
    ),
    "a session of work": re.compile(
        rf"\b({_ORDINALS}|this|that|another|earlier|previous|later|last|next) sessions?\b"
        rf"(?!'s? (own )?(search_path|advisory))"
        rf"|\b(in|of|from|during) (the|this|that|an?) (same |earlier |later |previous )?session\b"
        rf"(?! (advisory|of your own))",
        re.IGNORECASE,
    ),
    "this machine": re.compile(r"\bthis machine\b", re.IGNORECASE),
    "latest or earlier runs": re.compile(r"\b(latest runs?|earlier runs|final runs)\b", re.IGNORECASE),
    "a date of a run": re.compile(rf"\b(?i:on|measured|runs?)\b[^.\n]{{0,40}}\b\d{{1,2}} ({_MONTHS})( \d{{4}})?\b"),
    "the machine of a run": re.compile(r"\b(the|this|our|the project's) \d+-core machine\b", re.IGNORECASE),
}

#: Generated blocks carry the command, machine and date that made them; that is their caption.
_GENERATED = re.compile(
    r"<!-- table: [a-z0-9-]+ -->.*?<!-- /table -->|<!-- chaos-table:begin -->.*?<!-- chaos-table:end -->", re.DOTALL
)


def notebook_prose(text: str) -> list[str]:
    """What in ``text`` (generated blocks aside) reads like a log of measurement runs."""
    prose = _GENERATED.sub("", text)
    found = []
    for what, pattern in _NOTEBOOK.items():
        for match in pattern.finditer(prose):
            line = prose.count("\n", 0, match.start()) + 1
            found.append(f"line {line}: {what}: {match.group(0)!r}")
    return found


def _pages() -> list[Path]:
    return sorted([ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "benchmarks" / "README.md", *DOCS.rglob("*.md")])


@pytest.mark.parametrize("page", _pages(), ids=lambda page: str(page.relative_to(ROOT)))
def test_no_page_reads_like_a_log_of_runs(page: Path) -> None:
    assert notebook_prose(page.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize(
    "text",
    [
        "### Earlier runs: the access line's cost (2026-12-03)\n",
        "### A faster machine (7 December)\n",
        "The machine was faster in this session.\n",
        "## Runs of a sixth session\n",
        "A p50 at or below the floor itself in this session.\n",
        "Measured on this machine with two runs.\n",
        "**Latest runs before it.** Two runs.\n",
        "Measured on 1 December 2026 at 14:20, twice.\n",
        "On 1 December 2026 (Python 3.11.7, the 2-core machine, two runs): bare 15,561.\n",
    ],
)
def test_the_check_catches_a_log_of_runs(text: str) -> None:
    assert notebook_prose(text)


@pytest.mark.parametrize(
    "text",
    [
        "A session advisory lock, tied to the session, ends with it.\n",
        "Pass `schema=` if your sessions change their `search_path`.\n",
        "Another server session prepares them again; a `requests.Session` of your own stays open.\n",
        "<!-- table: redis-cycles -->\n*`python -m benchmarks.redis_cycle` on 2 CPUs, 2026-12-07.*\n<!-- /table -->\n",
    ],
)
def test_the_check_leaves_the_product_alone(text: str) -> None:
    assert notebook_prose(text) == []


# -- sizes that fit the pages' jobs ------------------------------------------------------------

_LIMITS = {
    "docs/server.md": 400,
    "docs/explanation/performance.md": 200,
    **{str(page.relative_to(ROOT)): 300 for page in sorted((DOCS / "backends").glob("*.md"))},
}


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def pages_over_their_size(limits: dict[str, int], total_limit: int) -> list[str]:
    """Every page (and the docs as a whole) longer than its limit, as readable lines."""
    over = [f"{name}: {_lines(ROOT / name)} > {limit}" for name, limit in limits.items() if _lines(ROOT / name) > limit]
    total = sum(_lines(page) for page in DOCS.rglob("*.md"))
    if total > total_limit:
        over.append(f"docs/**/*.md: {total} > {total_limit}")
    return over


#: The whole of the docs, in lines: room for what the product does (counting keys added a section
#: to each store's page), none for logs of runs.
_TOTAL_LIMIT = 4800


def test_pages_fit_their_size() -> None:
    assert pages_over_their_size(_LIMITS, _TOTAL_LIMIT) == []


def test_the_size_check_fails_on_a_page_over_its_limit() -> None:
    assert pages_over_their_size({"docs/server.md": 10}, _TOTAL_LIMIT) != []
    assert pages_over_their_size({}, 10) != []


def _release_section(changelog: str, version: str) -> list[str]:
    lines = changelog.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"## {version}"))
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return lines[start:end]


def test_the_first_release_is_a_feature_list_that_fits() -> None:
    section = _release_section((ROOT / "CHANGELOG.md").read_text(encoding="utf-8"), "0.1.0")
    assert len(section) <= 200, len(section)
    # A feature list names what the release does, not how fast a run went.
    timed = [line for line in section if re.search(r"\d\s?(ms|µs)\b|\d\.\d+x\b|\d+(\.\d+)?×", line)]
    assert timed == []


# -- the performance tables are what the results say --------------------------------------------


def test_the_performance_tables_are_what_the_results_give() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.tables", "--check"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_table_has_its_results_and_a_place() -> None:
    from benchmarks.tables import RESULTS, TABLES

    marked = set()
    for page in DOCS.rglob("*.md"):
        marked |= set(re.findall(r"<!-- table: ([a-z0-9-]+) -->", page.read_text(encoding="utf-8")))
    assert marked == set(TABLES)
    needed = {benchmark for benchmark, _header, _rows in TABLES.values()}
    missing = sorted(needed - {path.stem for path in RESULTS.glob("*.json")})
    assert missing == []


# -- the front pages name every backend and extra ------------------------------------------------

#: How the front pages name each built-in backend class of the URL registry.
_BACKEND_NAMES = {
    "MemoryBackend": "memory",
    "SqliteBackend": "SQLite",
    "RedisBackend": "Redis",
    "PostgresBackend": "PostgreSQL",
    "EtcdBackend": "etcd",
    "MongoBackend": "MongoDB",
    "HttpBackend": "HTTP",
}


def _registered_backends() -> set[str]:
    """The backend classes the URL registry names; the Django stand-ins only build one of them."""
    from lease_lock.backends import SCHEMES

    classes = set()
    for target in SCHEMES.values():
        if isinstance(target, str):
            module, _, name = target.partition(":")
        else:
            module, name = target.__module__, target.__name__
        if not module.startswith("lease_lock.contrib."):
            classes.add(name)
    return classes


def _extras() -> set[str]:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg", encoding="utf-8")
    return set(config["options.extras_require"])


def _backends_sentence(page: Path) -> str:
    text = page.read_text(encoding="utf-8")
    match = re.search(r"Backends[,:][^.]*\.", text.replace("\n", " "))
    assert match, f"{page.name} has no sentence that lists the backends"
    return match.group(0)


@pytest.mark.parametrize("page", [ROOT / "README.md", DOCS / "index.md"], ids=lambda page: page.name)
def test_the_front_pages_name_every_backend_of_the_registry(page: Path) -> None:
    registered = _registered_backends()
    unnamed = registered - set(_BACKEND_NAMES)
    assert not unnamed, f"name the new backends on the front pages and in _BACKEND_NAMES: {unnamed}"
    sentence = _backends_sentence(page)
    names = [_BACKEND_NAMES[name] for name in sorted(registered)]
    missing = [name for name in names if not re.search(rf"\b{name}\b", sentence)]
    assert missing == [], sentence


@pytest.mark.parametrize("page", [ROOT / "README.md", DOCS / "index.md"], ids=lambda page: page.name)
def test_the_front_pages_name_every_extra_of_setup_cfg(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    named = set(re.findall(r"`([a-z][a-z0-9-]*)`", text))
    assert sorted(_extras() - named) == []
    if page.name == "README.md":
        # The README's table says what each extra adds, one row per extra or group of extras.
        rows = re.findall(r"^\| (`[^|]*`) \|", text, flags=re.MULTILINE)
        assert {extra for row in rows for extra in re.findall(r"`([a-z][a-z0-9-]*)`", row)} == _extras()


def test_a_table_is_replaced_by_a_rerun_never_appended_to(tmp_path: Path) -> None:
    import json

    from benchmarks.tables import rewrite

    page = "Before.\n\n<!-- table: sqlite-cycles -->\nstale figures\n<!-- /table -->\n\nAfter.\n"

    def results(rate: float) -> Path:
        folder = tmp_path / str(rate)
        folder.mkdir()
        document = {
            "benchmark": "sqlite_cycle",
            "command": f"python -m benchmarks.sqlite_cycle --seconds 1 --json {folder}/sqlite_cycle.json",
            "machine": {"host": "h", "system": "Linux", "cpus": 2, "processor": "x86_64", "python": "3.11"},
            "date": "2030-01-02T03:04:05+00:00",
            "results": {"cycles": [{"name": "backend", "rate": rate, "floor_rate": 2 * rate, "ratio": 0.5}]},
        }
        (folder / "sqlite_cycle.json").write_text(json.dumps(document), encoding="utf-8")
        return folder

    first = rewrite(page, results(1000.0))
    second = rewrite(first, results(3000.0))
    assert "stale figures" not in first and "| backend | 1,000 | 2,000 | 0.50x |" in first
    assert "| backend | 3,000 | 6,000 | 0.50x |" in second and "1,000" not in second
    assert second.startswith("Before.") and second.endswith("After.\n")
    assert rewrite(second, tmp_path / "3000.0") == second
    # The caption names the command without where it wrote, the machine and the date.
    assert "`python -m benchmarks.sqlite_cycle --seconds 1` on 2 CPUs" in second and "2030-01-02" in second
