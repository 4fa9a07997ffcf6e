"""The reliability harness, long version: every fault on every backend, with a summary table.

Run from the repository root::

    python -m benchmarks.chaos --workers 8 --seconds 30 --keys 4 --ttl 2 --write docs/reliability.md

Backends: ``sqlite`` (a temp file), ``redis``, ``postgres`` and ``etcd`` (private servers
started here and stopped at the end, so restarts and kills hurt nobody else; etcd is a
three-member cluster, started by the same helper the tests use). Each (backend, fault) pair runs
``--seconds`` with ``--workers`` processes; the logs stay in ``--workdir``. The table is printed
and, with ``--write``, put into the docs page between its generated-table markers, together
with the exact command; rows of backends not run this time stay on the page, with the command
that produced them. Exit status 1 when any run shows a problem (see ``checker.Report``).
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Optional

from benchmarks.chaos_harness.checker import COLUMNS, Report
from benchmarks.chaos_harness.faults import FAULTS, supported
from benchmarks.chaos_harness.scenario import Settings, Target, run_scenario

__all__ = ["BACKENDS", "main", "render_table", "write_docs"]

BEGIN, END = "<!-- chaos-table:begin -->", "<!-- chaos-table:end -->"
#: Every backend the runner knows, in table order.
BACKENDS = ("sqlite", "redis", "postgres", "etcd")


def render_table(reports: list[Report]) -> str:
    """A Markdown table of the reports' rows."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(report.row()) + " |" for report in reports]
    return "\n".join(lines)


def _targets(names: list[str], root: Path, stack: ExitStack) -> dict[str, Target]:
    from tests.support.etcd_server import EtcdFactory, find_etcd_binary
    from tests.support.postgres_server import _remove, start_private_postgres
    from tests.support.redis_server import RedisServer

    targets = {}
    for name in names:
        if name == "sqlite":
            targets[name] = Target("sqlite", f"sqlite:///{root}/locks.db", f"sqlite:///{root}/resource.db")
        elif name == "redis":
            binary = shutil.which("redis-server")
            if binary is None:
                raise SystemExit("redis-server is not on PATH")
            server = RedisServer(binary, root / "redis").start()
            stack.callback(server.stop)
            targets[name] = Target("redis", server.url, f"sqlite:///{root}/resource-redis.db", server)
        elif name == "postgres":
            pg = start_private_postgres()
            stack.callback(_remove, pg)
            targets[name] = Target("postgres", f"{pg.url}?table=chaos_leases", f"{pg.url}?table=chaos_resource", pg)
        elif name == "etcd":
            if find_etcd_binary() is None:
                raise SystemExit("etcd is not on PATH (set ETCD_BIN)")
            (root / "etcd").mkdir(parents=True, exist_ok=True)
            cluster = EtcdFactory(root / "etcd").cluster(members=3)
            stack.callback(cluster.close)
            targets[name] = Target("etcd", cluster.url, f"sqlite:///{root}/resource-etcd.db", cluster)
        else:
            raise SystemExit(f"unknown backend {name!r}")
    return targets


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _earlier_block(block: str) -> tuple[list[str], dict[str, str]]:
    """The table rows of a generated block and, per backend, the line saying what made them.

    A block has ``- backend, backend: `command` on date`` lines; an older one a single
    ``Produced by `command` on date:`` line, which then stands for every backend of its table.
    """
    rows = [line for line in block.splitlines() if line.startswith("| ") and not line.startswith("| backend |")]
    made: dict[str, str] = {}
    for line in block.splitlines():
        if line.startswith("Produced by "):
            made.update((_cells(row)[0], line[len("Produced by "):].rstrip(":")) for row in rows)
        elif line.startswith("- ") and ": `" in line:
            names, _, how = line[2:].partition(": ")
            made.update((name.strip(), how) for name in names.split(","))
    return rows, made


def write_docs(path: Path, command: str, reports: list[Report]) -> None:
    """Put the reports' rows into the page; rows of backends this run did not cover stay, with
    the command that made them, so one backend can be rerun without rerunning the others."""
    text = path.read_text()
    head, _, rest = text.partition(BEGIN)
    block, _, tail = rest.partition(END)
    ran = {report.backend for report in reports}
    rows, made = _earlier_block(block)
    kept = [row for row in rows if _cells(row)[0] not in ran]
    made = {name: how for name, how in made.items() if name not in ran and any(_cells(row)[0] == name for row in kept)}
    made.update((name, f"`{command}` on {time.strftime('%Y-%m-%d')}") for name in sorted(ran))
    groups: dict[str, list[str]] = {}
    for name in dict.fromkeys([_cells(row)[0] for row in kept] + [report.backend for report in reports]):
        groups.setdefault(made[name], []).append(name)
    lines = [f"- {', '.join(names)}: {how}" for how, names in groups.items()]
    table = render_table(reports).splitlines()
    order = {name: index for index, name in enumerate(BACKENDS)}
    table[2:] = sorted(kept + table[2:], key=lambda row: order.get(_cells(row)[0], len(order)))
    path.write_text(f"{head}{BEGIN}\nRows produced by:\n\n" + "\n".join(lines) + "\n\n" + "\n".join(table)
                    + f"\n{END}{tail}")


def main(argv: Optional[list[str]] = None) -> int:
    """Run the selected scenarios; print (and optionally write) the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--faults", default=",".join(FAULTS), help="comma-separated; default: all")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--keys", type=int, default=4)
    parser.add_argument("--ttl", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", type=Path, help="where logs go (default: a new temp dir)")
    parser.add_argument("--write", type=Path, help="docs page to put the table into")
    args = parser.parse_args(argv)
    command = "python -m benchmarks.chaos " + shlex.join(sys.argv[1:] if argv is None else argv)
    settings = Settings(workers=args.workers, seconds=args.seconds, keys=args.keys, ttl=args.ttl, seed=args.seed)
    root = args.workdir or Path(tempfile.mkdtemp(prefix="lease-lock-chaos-"))
    wanted = args.faults.split(",")
    reports = []
    with ExitStack() as stack:
        targets = _targets(args.backends.split(","), root, stack)
        for name, target in targets.items():
            for fault in (fault for fault in supported(name) if fault in wanted):
                report = run_scenario(target, fault, settings, root / f"{name}-{fault}")
                reports.append(report)
                print(" | ".join(report.row()), flush=True)
                for problem in report.problems():
                    print(f"  PROBLEM: {problem}", flush=True)
    table = render_table(reports)
    print(f"\n{table}\n\nlogs: {root}")
    if args.write:
        write_docs(args.write, command, reports)
    return 1 if any(report.problems() for report in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
