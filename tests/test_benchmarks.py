"""Every benchmark still runs end to end, in miniature, against real private servers.

Nothing here judges speed (figures from a few hundred cycles mean nothing): the point is that a
change to the library or to a driver cannot quietly break the scripts whose tables the docs
quote. Each runs as ``python -m benchmarks.<name>`` from the repository root, as documented.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.mongo_server import MongoServer
from tests.support.polling import wait_until
from tests.support.postgres_server import PostgresServer
from tests.support.redis_server import RedisServer

ROOT = Path(__file__).resolve().parent.parent


# Under callgrind the interpreter runs some fifty times slower, and several interpreters at once
# on a busy machine: minutes, where the suite's default timeout is made for seconds.
VALGRIND_TIMEOUT = 600


def run_benchmark(name: str, *args: str) -> str:
    """Run one benchmark module and return what it printed; fail with its output otherwise."""
    completed = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{name}", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=VALGRIND_TIMEOUT - 60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert completed.returncode == 0, f"{name} failed:\n{completed.stdout}\n{completed.stderr}"
    return completed.stdout


def table_rows(output: str, *names: str) -> dict[str, list[str]]:
    """The whitespace-split cells after each named row label (the label must be present)."""
    rows: dict[str, list[str]] = {}
    for name in names:
        lines = [line for line in output.splitlines() if line.strip().startswith(name)]
        assert lines, f"no row {name!r} in:\n{output}"
        rows[name] = lines[0].strip()[len(name):].split()
    return rows


def test_metrics_overhead_prints_every_row() -> None:
    output = run_benchmark("metrics_overhead", "--cycles", "200", "--repeat", "1")
    names = ("no on_event hook", "PrometheusMetrics", "OpenTelemetryMetrics", "both, as an on_event list")
    rows = table_rows(output, *names)
    assert rows["no on_event hook"][-1] == "1.00x"
    assert all(float(rows[name][0]) > 0 for name in names)


def test_overhead_prints_every_cycle() -> None:
    output = run_benchmark("overhead", "--cycles", "200", "--repeat", "1")
    rows = table_rows(output, "backend.acquire + release (floor)", "locker.acquire + lock.release")
    assert float(rows["locker.acquire + lock.release"][-1]) > 0


def test_sqlite_cycle_pairs_each_contestant_with_the_floor(tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    output = run_benchmark("sqlite_cycle", "--seconds", "0.2", "--json", str(results / "sqlite_cycle.json"))
    rows = table_rows(output, "backend acquire/release", "backend fenced", "Locker fenced")
    for cells in rows.values():
        assert cells[-1].endswith("x") and float(cells[-1][:-1]) > 0
    # Its JSON becomes the table of the docs page that marks it, with the command under it.
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "page.md").write_text("<!-- table: sqlite-cycles -->\n<!-- /table -->\n", encoding="utf-8")
    run_benchmark("tables", "--results", str(results), "--docs", str(docs))
    page = (docs / "page.md").read_text(encoding="utf-8")
    assert [line.split(" | ")[0] for line in page.splitlines() if line.startswith("| ")][1:] == [
        "| backend acquire/release", "| backend fenced", "| Locker fenced"
    ]
    assert "`python -m benchmarks.sqlite_cycle --seconds 0.2` on " in page


def test_redis_cycle_and_handoffs(redis_server: RedisServer) -> None:
    output = run_benchmark("redis_cycle", "--url", redis_server.url, "--seconds", "0.2", "--handoffs", "3")
    rows = table_rows(
        output, "lease_lock backend (fenced)", "lease_lock Locker: with lock()",
        "lease_lock Locker: acquire().release()", "lease_lock Locker (fenced)", "redis-py Lock",
    )
    assert all(cells[-1].endswith("x") for cells in rows.values())
    handoff = table_rows(output.split("Hand-off latency", 1)[1], "bare BLPOP wake-up", "lease_lock Locker")
    assert all(len(cells) == 2 for cells in handoff.values())


def test_redis_heartbeat_loses_nothing_in_miniature(redis_server: RedisServer) -> None:
    output = run_benchmark(
        "redis_heartbeat", "--url", redis_server.url, "--locks", "50", "--ttl", "1",
        "--seconds", "2", "--peer-locks", "5",
    )
    lost = [line.split()[-1] for line in output.splitlines() if line.strip().startswith("lost")]
    assert lost and all(count == "0" for count in lost), output


def test_postgres_cycle_and_handoffs(postgres_server: PostgresServer) -> None:
    output = run_benchmark("postgres_cycle", "--url", postgres_server.url, "--seconds", "0.2", "--handoffs", "3")
    rows = table_rows(output, "backend acquire/release", "backend fenced", "Locker fenced", "raw SQL, UNLOGGED table")
    assert all(cells[-1].endswith("x") for cells in rows.values())
    handoffs = table_rows(
        output.split("Hand-off latency", 1)[1],
        "bare LISTEN/NOTIFY wake-up", "bare durable update + NOTIFY wake-up", "Locker hand-off, LISTEN/NOTIFY",
        "Locker hand-off, direct_handoff=True",
    )
    assert all(float(cells[0]) > 0 for cells in handoffs.values())
    # The Locker's hand-offs are set against the durable floor; the bare rows are the floors.
    assert [cells[2] for name, cells in handoffs.items() if name.startswith("bare")] == ["-", "-"]
    assert all(float(cells[2]) > 0 for name, cells in handoffs.items() if name.startswith("Locker"))
    core = table_rows(
        output.split("CPU per Locker cycle", 1)[1], "between PostgreSQL round trips", "hot loop on the memory backend"
    )
    assert all(float(cells[0]) > 0 and float(cells[1]) > 0 for cells in core.values())


def test_mongo_cycle_against_the_statements_typed_by_hand(mongo_server: MongoServer, mongo_database: str) -> None:
    output = run_benchmark("mongo_cycle", "--url", mongo_server.url(mongo_database), "--seconds", "0.2")
    rows = table_rows(output, "backend acquire/release", "Locker", "backend fenced", "Locker fenced")
    assert all(float(cells[0].replace(",", "")) > 0 and cells[-1].endswith("x") for cells in rows.values())


def test_http_cycle_against_the_bare_floor_and_handoffs(redis_server: RedisServer) -> None:
    output = run_benchmark(
        "http_cycle", "--seconds", "0.3", "--clients", "2", "--processes", "1,2",
        "--stores", "memory,redis", "--redis-url", redis_server.url, "--handoffs", "2",
    )
    cycles = [line.split() for line in output.splitlines() if line.startswith(("memory ", "redis "))]
    # memory: one server process only; redis: 1 and 2.
    configurations = [(row[0], row[1], row[2]) for row in cycles]
    assert configurations == [("memory", "1", "2"), ("redis", "1", "2"), ("redis", "2", "2")]
    assert all(float(row[3]) > 0 and float(row[4]) > 0 for row in cycles)
    # The store-only app (the bare app plus the raw Redis calls) and the backend-only app (plus
    # the service's store calls) run on Redis rows only.
    assert cycles[0][-4:] == ["-", "-", "-", "-"]
    assert all(float(cell) > 0 for row in cycles[1:] for cell in row[-4:])
    # A hand-off row of each store, with the wait extension and without it, and on Redis the
    # wake-up floor, against which the row with the extension is set.
    modes = ("with Prefer: wait", "without (--max-waits 0)")
    names = [f"{store}, {mode}" for store in ("memory", "redis") for mode in modes]
    floor = "redis, wake-up floor (BLPOP, SET NX)"
    handoff = table_rows(output.split("Hand-off latency", 1)[1], *names, floor)
    assert all(len(cells) == 3 and float(cells[0]) > 0 for cells in handoff.values())
    assert float(handoff["redis, with Prefer: wait"][2]) > 0
    assert [handoff[name][2] for name in names if name != "redis, with Prefer: wait"] == ["-", "-", "-"]
    # The floor's hand-offs are woken, not polled: far below the 100 ms of the row without waits.
    assert float(handoff[floor][0]) < float(handoff["redis, without (--max-waits 0)"][0]) / 4


def test_heartbeat_scale_in_miniature() -> None:
    output = run_benchmark("heartbeat_scale", "--sizes", "10", "--seconds", "1")
    # locks, threads, heartbeat threads, RSS/lock, CPU, ext/s, lost, ...
    (cells,) = (line.split() for line in output.splitlines() if line.split()[:1] == ["10"])
    assert cells[2] == "1", output
    assert cells[6] == "0", output


def test_json_results_become_figures(tmp_path: Path, redis_server: RedisServer) -> None:
    data = tmp_path / "data"
    data.mkdir()
    run_benchmark("heartbeat_scale", "--sizes", "10", "--seconds", "1", "--json", str(data / "heartbeat_scale.json"))
    run_benchmark(
        "http_cycle", "--seconds", "0.2", "--clients", "1", "--processes", "1", "--stores", "memory,redis",
        "--redis-url", redis_server.url, "--handoffs", "3", "--json", str(data / "http_cycle.json"),
        "--variant=--log-level warning",
    )
    http_rows = json.loads((data / "http_cycle.json").read_text())["results"]["rows"]
    # The floors are measured on the Redis row only, and the service's ratios to them kept.
    assert ["store_only_rate" in row for row in http_rows] == [False, True]
    assert ["backend_only_rate" in row for row in http_rows] == [False, True]
    assert http_rows[1]["ratio_to_store_only"] > 0 and http_rows[1]["ratio_to_backend_only"] > 0
    # The variant (the service with extra serve arguments) runs in every row, beside the floor.
    assert all(row["variant_rate"] > 0 and row["variant_cpu_us"] > 0 for row in http_rows)
    assert ["variant_to_store_only" in row for row in http_rows] == [False, True]
    handoffs = json.loads((data / "http_cycle.json").read_text())["results"]["handoffs"]
    assert [row["mode"] for row in handoffs if "ratio_to_floor" in row] == ["with Prefer: wait"]
    assert [row["store"] for row in handoffs if "ratio_to_floor" in row] == ["redis"]
    run_benchmark(
        "redis_cycle", "--url", redis_server.url, "--seconds", "0.2", "--handoffs", "3",
        "--json", str(data / "redis_cycle.json"),
    )
    document = json.loads((data / "redis_cycle.json").read_text())
    assert document["benchmark"] == "redis_cycle"
    assert "--seconds 0.2" in document["command"] and document["machine"]["cpus"] >= 1 and document["date"]
    assert {row["name"] for row in document["results"]["handoffs"]} >= {"lease_lock Locker"}
    assert all(row["ratio"] > 0 for row in document["results"]["cycles"])
    out = tmp_path / "figures"
    printed = run_benchmark("plot", "--data", str(data), "--out", str(out))
    written = sorted(path.name for path in out.glob("*.svg"))
    # No PostgreSQL data: its cycle figure is left out, and the hand-off figure shows Redis only.
    assert written == ["handoff-latency.svg", "heartbeat-scale.svg", "http-service.svg", "redis-cycles.svg"]
    assert printed.count(".svg") == 4
    http_figure = (out / "http-service.svg").read_text()
    assert "the bare app plus the raw store calls" in http_figure and "orange: plus the service" in http_figure
    svg = (out / "redis-cycles.svg").read_text()
    assert "benchmarks.redis_cycle" in svg and document["date"] in svg


def test_spinners_run_at_the_lowest_priority_only_while_asked_for() -> None:
    from benchmarks.measure import spinning

    before = set(multiprocessing.active_children())
    with spinning(2):
        spinners = [child for child in multiprocessing.active_children() if child not in before]
        assert len(spinners) == 2
        # Each spinner lowers its own priority as it starts.
        wait_until(
            lambda: all(os.getpriority(os.PRIO_PROCESS, child.pid) == 19 for child in spinners), "spinners at nice 19"
        )
        assert all(child.is_alive() for child in spinners)
    assert not any(child.is_alive() for child in spinners)


def test_contended_in_miniature(tmp_path: Path, redis_server: RedisServer, postgres_server: PostgresServer) -> None:
    output = run_benchmark(
        "contended", "--workers", "3", "--seconds", "0.5", "--rounds", "2", "--redis-url", redis_server.url,
        "--postgres-url", postgres_server.url, "--json", str(tmp_path / "contended.json"), "--spinners", "1",
    )
    assert "; 1 spinning at nice 19" in output.splitlines()[0]
    redis_part, postgres_part = output.split("\npostgres:", 1)
    redis_rows = table_rows(redis_part, "Locker, 1 process", "Locker, 3 processes", "python-redis-lock, 3 processes")
    postgres_rows = table_rows(
        postgres_part, "Locker, 1 process", "Locker, 3 processes", "pg_advisory_lock, 3 processes",
        "Locker direct_handoff, 3 processes",
    )
    for cells in [*redis_rows.values(), *postgres_rows.values()]:
        # grants/s, vs 1 proc, handoffs/s, min, max, min/share, p50, p99, overlaps: never two
        # holders at once.
        assert len(cells) == 9 and cells[1].endswith("x") and cells[-1] == "0"
    document = json.loads((tmp_path / "contended.json").read_text())
    assert document["benchmark"] == "contended"
    for store, rows_of_store in (("redis", 3), ("postgres", 4)):
        rows = document["results"][store]
        assert [row["workers"] for row in rows] == [1] + [3] * (rows_of_store - 1)
        assert [row["seconds"] for row in rows] == [0.5] * rows_of_store  # two turns of 0.25 s each
        assert all(row["rate"] > 0 and row["overlaps"] == 0 for row in rows)
        assert rows[0]["p50_ms"] is None  # one process hands nothing to another


def test_crowd_in_miniature(tmp_path: Path, redis_server: RedisServer) -> None:
    # This checkout stands in for the older one that --old names: both codes take turns.
    output = run_benchmark(
        "crowd", "--threads", "2,4", "--seconds", "0.6", "--rounds", "2", "--redis-url", redis_server.url,
        "--old", str(ROOT), "--json", str(tmp_path / "crowd.json"),
    )
    rows = [line.split() for line in output.splitlines() if line.startswith(("with crowds", "without crowds"))]
    # code (two words), threads, grants/s, CPU us/grant, min/share, rate vs, CPU vs, overlaps.
    assert [(row[2], row[-1]) for row in rows] == [("2", "0"), ("4", "0")] * 2
    document = json.loads((tmp_path / "crowd.json").read_text())
    assert document["benchmark"] == "crowd"
    results = document["results"]["rows"]
    assert [(row["threads"], row["vs_threads"]) for row in results] == [(2, 2), (4, 2)] * 2
    assert all(row["grants"] > 0 and row["seconds"] == 0.6 and row["overlaps"] == 0 for row in results)


def _require_valgrind() -> None:
    """Counted, not timed: callgrind is needed, and CI must have it (.ci/run installs it), so
    there a missing valgrind fails the test; elsewhere it skips."""
    if shutil.which("valgrind") is None:
        message = "valgrind is not on PATH (install the valgrind package)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


@pytest.mark.timeout(VALGRIND_TIMEOUT)
def test_instruction_count_in_miniature() -> None:
    _require_valgrind()
    output = run_benchmark("instructions", "--cycles", "5")
    rows = table_rows(
        output,
        "bare backend acquire + release",
        "with locker.lock(key): pass",
        "core (Locker minus bare)",
        "the lease rules alone (floor lock)",
        "their share (floor lock minus bare)",
    )
    bare, locker, core, floor, floor_share = (float(rows[name][0].replace(",", "")) for name in rows)
    # The core's share is what the Locker adds to the same backend calls; the floor lock's, what
    # the lease rules alone add to them.
    assert 0 < bare < locker
    assert 0 < bare < floor
    assert core == pytest.approx(locker - bare, abs=1)
    assert floor_share == pytest.approx(floor - bare, abs=1)


@pytest.mark.timeout(VALGRIND_TIMEOUT)
def test_service_instruction_count_in_miniature(redis_server: RedisServer) -> None:
    _require_valgrind()
    output = run_benchmark("service_instructions", "--cycles", "3", "--redis-url", redis_server.url)
    rows = table_rows(
        output,
        "store-only app",
        "backend-only app",
        "service, access line on",
        "service, --log-level warning",
        "service minus backend-only",
        "service minus store-only",
        "access lines (service minus",
    )
    figures = (float(cells[-1].replace(",", "")) for cells in rows.values())
    store_only, backend_only, service, quiet, own_layer, beyond, lines = figures
    # An access line is not free, and the service's own layer comes on top of its store calls.
    assert store_only > 0 and 0 < backend_only < quiet < service
    assert own_layer == pytest.approx(service - backend_only, abs=1)
    assert beyond == pytest.approx(service - store_only, abs=1) and lines == pytest.approx(service - quiet, abs=1)
