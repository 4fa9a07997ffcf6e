"""Write the documentation's tables of figures from the benchmarks' JSON results.

Each benchmark writes its results with ``--json PATH``; the files kept in ``benchmarks/results``
are the current figures. A page marks where a table goes::

    <!-- table: redis-cycles -->
    ...replaced on every run...
    <!-- /table -->

and ``python -m benchmarks.tables`` rewrites everything between the two markers of every page
under ``docs/`` from those files, with a caption naming the command, the machine and the date
that produced the figures. To refresh a table, rerun its benchmark with
``--json benchmarks/results/<benchmark>.json`` and then this command: the table is replaced,
never appended to, and the history of a figure stays in git. ``--check`` exits 1 when a page
is not what its JSON gives (the test suite runs it).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Optional

__all__ = ["TABLES", "main", "render", "rewrite"]

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DOCS = ROOT / "docs"

_MARKED = re.compile(r"(<!-- table: (?P<name>[a-z0-9-]+) -->\n)(?P<body>.*?)(<!-- /table -->)", re.DOTALL)

Rows = list[list[str]]


def _rate(value: Optional[float]) -> str:
    return "–" if value is None else f"{value:,.0f}"


def _ratio(value: Optional[float]) -> str:
    return "–" if value is None else f"{value:.2f}x"


def _ms(value: Optional[float]) -> str:
    return "–" if value is None else f"{value:.2f}"


def _cycles(results: dict[str, Any]) -> Rows:
    rows = results["cycles"]
    return [[row["name"], _rate(row["rate"]), _rate(row["floor_rate"]), _ratio(row["ratio"])] for row in rows]


def _handoffs(results: dict[str, Any]) -> Rows:
    rows = []
    for row in results["handoffs"]:
        versus = row.get("ratio_to_durable_floor")
        rows.append([row["name"], _ms(row["p50_ms"]), _ms(row["p99_ms"]), "–" if versus is None else f"{versus:.2f}"])
    return rows


def _latencies(results: dict[str, Any]) -> Rows:
    return [[row["name"], _ms(row["p50_ms"]), _ms(row["p99_ms"])] for row in results["handoffs"]]


def _contended(results: dict[str, Any]) -> Rows:
    rows = []
    for store, runs in results.items():
        for row in runs:
            handoffs = row["handoffs_per_second"]  # None on a counting key, whose holders overlap
            rows.append([
                store, row["name"], _rate(row["rate"]), _ratio(row["vs_single"]),
                _rate(handoffs) if row["workers"] > 1 and handoffs is not None else "–",
                f"{row['min_share']:.2f}" if row["workers"] > 1 else "–",
                _ms(row["p50_ms"]), _ms(row["p99_ms"]), str(row["overlaps"]),
            ])
    return rows


def _heartbeat(results: dict[str, Any]) -> Rows:
    return [
        [f"{row['locks']:,}", str(row["threads"]), f"{row['rss_per_lock'] / 1024:.2f}", f"{row['cpu'] * 100:.1f}%",
         _rate(row["ext_per_s"]), str(row["lost"])]
        for row in results["rows"]
    ]


def _http(results: dict[str, Any]) -> Rows:
    rows = []
    for row in results["rows"]:
        rows.append([
            row["store"], str(row["processes"]), str(row["clients"]), _rate(row["bare_rate"]),
            _rate(row.get("store_only_rate")), _rate(row["service_rate"]), _ratio(row["ratio"]),
            _ms(row["p50_ms"]), _ms(row["p99_ms"]),
        ])
    return rows


def _http_handoffs(results: dict[str, Any]) -> Rows:
    return [[row["store"], row["mode"], _ms(row["p50_ms"]), _ms(row["p99_ms"])] for row in results["handoffs"]]


def _etcd_cycles(results: dict[str, Any]) -> Rows:
    rows = []
    for name, row in results["cycles"].items():
        if "not_run" not in row:  # a peer that is not installed has no row
            rows.append([name, _rate(row["rate"]), _rate(row["floor_rate"]), _ratio(row["ratio"])])
    return rows


def _etcd_handoffs(results: dict[str, Any]) -> Rows:
    rows = []
    for name, row in results["handoffs"].items():
        if "not_run" not in row:
            rows.append([name, _ms(row["p50"] * 1000), _ms(row["p99"] * 1000)])
    for label, key in (("Locker", "contended"), ("Locker direct_handoff", "contended_direct_handoff")):
        row = results[key]
        rows.append([
            f"{label}, {row['workers']} processes on one key: grants/s (vs one process)",
            _rate(row["total"]), _ratio(row["total"] / row["alone"]) if row["alone"] else "–",
        ])
    return rows


def _etcd_versions(results: dict[str, Any]) -> Rows:
    # One row per cycle; a rate, the baseline's rate and the ratio for one member, then three.
    runs = [results["members"].get(members, {}) for members in ("1", "3")]
    rows = []
    for name in dict.fromkeys(name for run in runs for name in run):
        row = [name]
        for run in runs:
            cycle = run.get(name)
            row += [_rate(cycle["rate"]), _rate(cycle["baseline_rate"]), _ratio(cycle["ratio"])] if cycle else ["–"] * 3
        rows.append(row)
    return rows


def _crowd(results: dict[str, Any]) -> Rows:
    rows = []
    for row in results["rows"]:
        versus = row["threads"] != row["vs_threads"]
        rows.append([
            row["code"], str(row["threads"]), _rate(row["rate"]), _rate(row["cpu_per_grant_us"]),
            f"{row['min_share']:.2f}", _ratio(row["vs_fewest_rate"]) if versus else "–",
            _ratio(row["vs_fewest_cpu"]) if versus else "–", str(row["overlaps"]),
        ])
    return rows


def _instructions(results: dict[str, Any]) -> Rows:
    return [[row["name"], f"{row['instructions']:,.0f}"] for row in results["rows"]]


#: Each table: the benchmark whose JSON it reads, its header, and how its rows are made.
TABLES: dict[str, tuple[str, list[str], Callable[[dict[str, Any]], Rows]]] = {
    "redis-cycles": ("redis_cycle", ["contestant", "cycles/s", "floor/s", "vs floor"], _cycles),
    "redis-handoffs": ("redis_cycle", ["hand-off", "p50 ms", "p99 ms"], _latencies),
    "postgres-cycles": ("postgres_cycle", ["contestant", "cycles/s", "floor/s", "vs floor"], _cycles),
    "postgres-handoffs": ("postgres_cycle", ["hand-off", "p50 ms", "p99 ms", "vs durable floor"], _handoffs),
    "sqlite-cycles": ("sqlite_cycle", ["contestant", "cycles/s", "floor/s", "vs floor"], _cycles),
    "mongodb-cycles": ("mongo_cycle", ["contestant", "cycles/s", "floor/s", "vs floor"], _cycles),
    "etcd-cycles": ("etcd_cycle", ["contestant", "cycles/s", "floor/s", "vs floor"], _etcd_cycles),
    "etcd-handoffs": ("etcd_cycle", ["row", "p50 ms (or grants/s)", "p99 ms (or vs 1 process)"], _etcd_handoffs),
    "etcd-versions": ("etcd_versions", ["cycle", "1 member/s", "before/s", "vs before", "3 members/s", "before/s",
                                        "vs before"], _etcd_versions),
    "contended": ("contended", ["store", "contestant", "grants/s", "vs 1 process", "hand-offs/s", "min/share",
                                "p50 ms", "p99 ms", "overlaps"], _contended),
    "crowd": ("crowd", ["code", "threads", "grants/s", "CPU us/grant", "min/share", "grants/s vs fewest",
                        "CPU/grant vs fewest", "overlaps"], _crowd),
    "instructions": ("instructions", ["cycle on the memory backend", "instructions per cycle"], _instructions),
    "heartbeat-scale": ("heartbeat_scale", ["locks", "threads", "KiB per lock", "CPU", "extensions/s", "lost"],
                        _heartbeat),
    "http-cycles": ("http_cycle", ["store", "processes", "clients", "bare app/s", "store-only/s", "service/s",
                                   "vs bare", "p50 ms", "p99 ms"], _http),
    "http-handoffs": ("http_cycle", ["store", "hand-off", "p50 ms", "p99 ms"], _http_handoffs),
}


def _load(results: Path, benchmark: str) -> Optional[dict[str, Any]]:
    path = results / f"{benchmark}.json"
    if not path.exists():
        return None
    document: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return document


def _command(document: dict[str, Any]) -> str:
    """The command that made the figures, without where it wrote them (that is the refresh's part)."""
    words = shlex.split(document["command"])
    kept = []
    skip = False
    for word in words:
        if skip:
            skip = False
        elif word == "--json":
            skip = True
        elif not word.startswith("--json="):
            kept.append(word)
    return shlex.join(kept)


def render(name: str, results: Path = RESULTS) -> str:
    """The Markdown of table ``name`` (with its caption) from the JSON file in ``results``."""
    benchmark, header, make_rows = TABLES[name]
    document = _load(results, benchmark)
    if document is None:
        return f"*No results yet: run `python -m benchmarks.{benchmark} --json benchmarks/results/{benchmark}.json`.*\n"
    rows = make_rows(document["results"])
    # Figures are right-aligned, names left-aligned.
    numeric = [all(re.fullmatch(r"[-–0-9.,x%]+", row[column]) for row in rows) for column in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "".join("---:|" if flag else "---|" for flag in numeric)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    machine = document["machine"]
    lines += [
        "",
        f"*`{_command(document)}` on {machine['cpus']} CPUs ({machine['system']}, {machine['processor']}, "
        f"Python {machine['python']}), {document['date'][:10]}; a shared machine, so rates move between "
        f"runs: read the ratios. Refreshed by rerunning it with `--json benchmarks/results/{benchmark}.json`, "
        "then `python -m benchmarks.tables`.*",
    ]
    return "\n".join(lines) + "\n"


def rewrite(text: str, results: Path = RESULTS) -> str:
    """``text`` with every marked table replaced by its current rendering."""

    def replace(match: re.Match[str]) -> str:
        name = match.group("name")
        if name not in TABLES:
            raise KeyError(f"unknown table {name!r}; known: {', '.join(sorted(TABLES))}")
        return match.group(1) + render(name, results) + match.group(4)

    return _MARKED.sub(replace, text)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Rewrite (or, with ``--check``, compare) the marked tables of every page under ``docs/``."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", 1)[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help="directory of <benchmark>.json files")
    parser.add_argument("--docs", type=Path, default=DOCS, help="pages to rewrite (every *.md below)")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a table is stale")
    args = parser.parse_args(argv)
    stale = []
    for page in sorted(args.docs.rglob("*.md")):
        text = page.read_text(encoding="utf-8")
        new = rewrite(text, args.results)
        if new != text:
            stale.append(page)
            if not args.check:
                page.write_text(new, encoding="utf-8")
    for page in stale:
        print(f"{'stale' if args.check else 'rewrote'}: {page}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
