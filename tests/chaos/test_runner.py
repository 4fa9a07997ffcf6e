"""The runner's plumbing that no scenario exercises by itself: the docs table a partial run
writes, and the proxied URL of a backend with several servers."""

from __future__ import annotations

from pathlib import Path

from benchmarks.chaos import BEGIN, END, write_docs
from benchmarks.chaos_harness.checker import Report
from benchmarks.chaos_harness.scenario import Target

OLD_RUN = "python -m benchmarks.chaos --seconds 30"


def page(tmp_path: Path) -> Path:
    """A docs page whose table came from one run of sqlite and redis (the older one-line form)."""
    lines = [
        "# Reliability", "", BEGIN, f"Produced by `{OLD_RUN}` on 2026-11-30:", "",
        "| backend | fault |", "|---|---|", "| sqlite | none |", "| redis | none |", "| redis | pause |", END,
        "", "after the table",
    ]
    path = tmp_path / "reliability.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def backends_and_faults(path: Path) -> list[tuple[str, str]]:
    block = path.read_text().partition(BEGIN)[2].partition(END)[0]
    rows = [line for line in block.splitlines() if line.startswith("| ") and not line.startswith("| backend |")]
    return [(row.split("|")[1].strip(), row.split("|")[2].strip()) for row in rows]


def test_a_run_of_one_backend_keeps_the_other_rows_and_says_which_command_made_which(tmp_path: Path) -> None:
    path = page(tmp_path)
    write_docs(path, "python -m benchmarks.chaos --backends etcd", [Report("etcd", "none"), Report("etcd", "cut")])
    assert backends_and_faults(path) == [("sqlite", "none"), ("redis", "none"), ("redis", "pause"),
                                         ("etcd", "none"), ("etcd", "cut")]
    text = path.read_text()
    assert f"- sqlite, redis: `{OLD_RUN}` on 2026-11-30" in text
    assert "- etcd: `python -m benchmarks.chaos --backends etcd` on " in text
    assert text.endswith(f"{END}\n\nafter the table\n")
    # A rerun of redis replaces redis's rows only, in table order, and its provenance line.
    write_docs(path, "python -m benchmarks.chaos --backends redis", [Report("redis", "kill")])
    assert backends_and_faults(path) == [("sqlite", "none"), ("redis", "kill"), ("etcd", "none"), ("etcd", "cut")]
    text = path.read_text()
    assert f"- sqlite: `{OLD_RUN}` on 2026-11-30" in text
    assert "- redis: `python -m benchmarks.chaos --backends redis`" in text
    assert text.count("- etcd: ") == 1


def test_an_etcd_url_is_proxied_member_by_member() -> None:
    target = Target("etcd", "etcd://u:p@127.0.0.1:2379,127.0.0.1:2380,localhost:2381?namespace=x/", "sqlite:///r.db")
    assert target.servers() == [("127.0.0.1", 2379), ("127.0.0.1", 2380), ("localhost", 2381)]
    assert target.via([7001, 7002, 7003]) == "etcd://u:p@127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003?namespace=x/"
    assert Target("redis", "redis://127.0.0.1:6379/0", "sqlite:///r.db").via([7001]) == "redis://127.0.0.1:7001/0"
