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
    # A fault cell reads "cut ×12": the fault, then how many times it was injected.
    return [(row.split("|")[1].strip(), row.split("|")[2].split()[0]) for row in rows]


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


def test_the_written_table_is_narrow_enough_to_read_without_scrolling(tmp_path: Path) -> None:
    report = Report(
        "redis", "restart", faults_injected=12, grants=135, overlaps_after_data_loss=10, holder_overlaps=9,
        writes_accepted=3714, late_writes=24, late_writes_accepted=17, stale_accepted=7, losses_signalled=36,
        lost_at_backend=35, expiry_to_signal=[0.236, 0.55], max_lateness=-1.311, max_hook_lateness=-1.3, errors=1,
    )
    path = page(tmp_path)
    write_docs(path, "python -m benchmarks.chaos --backends redis", [report])
    table = [line for line in path.read_text().splitlines() if line.startswith("|")]
    header, row = table[0], next(line for line in table if line.startswith("| redis |"))
    assert len(header.split("|")) == len(row.split("|")) <= 12  # at most 10 columns
    assert [cell.strip() for cell in row.strip("|").split("|")] == [
        "redis", "restart ×12", "135", "0/0/0/0", "10/9", "3714/24 (17)/7", "36/35", "236/550/550",
        "-1311/-1300", "1",
    ]
