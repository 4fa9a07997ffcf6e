"""Turn the benchmarks' JSON results (`benchmarks/results`) into SVG figures.

Run the benchmarks with ``--json`` into one directory, then::

    python -m benchmarks.plot --data benchmarks/results --out figures

Each figure is drawn from the files that exist (a missing benchmark leaves its figure out) and
carries, under the plot, the command, machine and date that produced its numbers. The SVGs are
written without a timestamp and with fixed element ids, so re-plotting the same data gives the
same files.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

__all__ = ["FIGURES", "main", "plot_all"]


def _load(data: Path, name: str) -> Optional[dict[str, Any]]:
    path = data / f"{name}.json"
    if not path.exists():
        return None
    document: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return document


def _provenance(*documents: dict[str, Any]) -> str:
    lines = []
    for document in documents:
        machine = document["machine"]
        lines.append(
            f"{document['command']}\n  on {machine['host']} ({machine['system']}, {machine['cpus']} CPUs, "
            f"Python {machine['python']}), {document['date']}"
        )
    return "\n".join(lines)


def _figure(height: float) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.hashsalt": "lease_lock", "font.size": 9, "svg.fonttype": "none"})
    figure, axes = plt.subplots(figsize=(7.5, height))
    return figure, axes


def _save(figure: Any, out: Path, name: str, footer: str) -> Path:
    figure.text(0.01, 0.01, footer, fontsize=6.5, color="#555555", va="bottom", ha="left", family="monospace")
    lines = footer.count("\n") + 1
    figure.tight_layout(rect=(0, 0.035 * lines + 0.02, 1, 1))
    path = out / f"{name}.svg"
    figure.savefig(path, format="svg", metadata={"Date": None})
    import matplotlib.pyplot as plt

    plt.close(figure)
    return path


def _value_column(axes: Any, bars: Any, labels: list[str]) -> None:
    """Each bar's figures as a column of tick labels right of the plot, on the bar's line.

    Written beside the bars, a figure runs into the reference line or into a marker drawn past
    the bar's end, and the longest ones leave the plot; outside it nothing can cover them.
    """
    column = axes.twinx()
    column.set_ylim(axes.get_ylim())
    column.set_yticks([bar.get_y() + bar.get_height() / 2 for bar in bars], labels, fontsize=7.5)
    column.tick_params(axis="y", length=0)
    for side in ("top", "right"):
        axes.spines[side].set_visible(False)
        column.spines[side].set_visible(False)
    column.spines["left"].set_visible(False)
    column.spines["bottom"].set_visible(False)


def _ratio_bars(out: Path, name: str, document: dict[str, Any], title: str) -> Path:
    rows = document["results"]["cycles"][::-1]
    names = [row["name"] for row in rows]
    ratios = [row["ratio"] for row in rows]
    figure, axes = _figure(0.42 * len(rows) + 1.6)
    bars = axes.barh(names, ratios, color=["#3b6ea5" if "lease_lock" in n or "Locker" in n or "backend" in n
                                           else "#9aa5b1" for n in names])
    axes.axvline(1.0, color="#c0392b", linewidth=1)
    axes.text(1.02, -0.75, "floor = 1.0", color="#c0392b", va="center", fontsize=8)
    axes.set_xlim(0, max(1.25, max(ratios) * 1.05))
    axes.set_xlabel("speed relative to the floor (median cycle times, paired)")
    axes.set_title(title)
    _value_column(axes, bars, [f"{row['ratio']:.2f}x  ({row['rate']:,.0f}/s)" for row in rows])
    return _save(figure, out, name, _provenance(document))


def _handoffs(out: Path, documents: list[tuple[str, dict[str, Any]]]) -> Path:
    rows = [(f"{label}: {row['name']}", row["p50_ms"], row["p99_ms"])
            for label, document in documents for row in document["results"]["handoffs"]][::-1]
    figure, axes = _figure(0.34 * len(rows) + 1.8)
    positions = range(len(rows))
    axes.barh([p + 0.2 for p in positions], [row[1] for row in rows], height=0.4, label="p50", color="#3b6ea5")
    axes.barh([p - 0.2 for p in positions], [row[2] for row in rows], height=0.4, label="p99", color="#9aa5b1")
    axes.set_yticks(list(positions), [row[0] for row in rows])
    axes.set_xscale("log")
    axes.set_xlabel("release -> waiter holds the key, ms (log scale)")
    axes.set_title("Hand-off latency")
    axes.legend(loc="lower right")
    return _save(figure, out, "handoff-latency", _provenance(*(document for _, document in documents)))


def _heartbeat(out: Path, document: dict[str, Any]) -> Path:
    rows = document["results"]["rows"]
    locks = [row["locks"] for row in rows]
    figure, axes = _figure(3.4)
    axes.plot(locks, [row["cpu"] * 100 for row in rows], marker="o", color="#3b6ea5", label="CPU while holding, %")
    axes.set_xscale("log")
    axes.set_xlabel("locks held by one Locker (one heartbeat thread; log scale)")
    axes.set_ylabel("CPU, % of one core", color="#3b6ea5")
    second = axes.twinx()
    second.plot(locks, [row["rss_per_lock"] / 1024 for row in rows], marker="s", color="#9a6324", label="RSS per lock")
    second.set_ylabel("RSS per lock, KB", color="#9a6324")
    # Headroom on both axes, so that no marker sits on the frame.
    axes.set_ylim(0, 1.15 * max(row["cpu"] * 100 for row in rows))
    second.set_ylim(0, 1.15 * max(row["rss_per_lock"] / 1024 for row in rows))
    # Each size's outcome goes under its tick: written beside the points it ran into the lines
    # and past the plot's edge.
    outcomes = [f"{row['locks']:,} locks\n{row['lost']} lost, {row['ext_per_s']:,.0f} ext/s" for row in rows]
    axes.set_xticks(locks, outcomes)
    axes.minorticks_off()
    axes.margins(x=0.12)
    axes.set_title(f"Heartbeat scale (memory backend, ttl {document['results']['ttl']:g} s)")
    return _save(figure, out, "heartbeat-scale", _provenance(document))


def _http(out: Path, document: dict[str, Any]) -> Path:
    rows = document["results"]["rows"][::-1]
    figure, axes = _figure(0.3 * len(rows) + 1.8)
    names = [f"{row['store']}, {row['processes']} proc, {row['clients']} clients" for row in rows]
    bars = axes.barh(names, [row["ratio"] for row in rows], color="#3b6ea5")
    # Where the bare app lands once it makes store calls too (Redis rows of runs that measured
    # it): the raw calls (store-only), and the service's own calls through its backend
    # (backend-only). The rest of the gap to a tick is the service's own work.
    floors = (
        ("store_only_rate", "#c0392b", "red tick: the bare app plus the raw store calls"),
        ("backend_only_rate", "#e67e22", "orange: plus the service's store calls"),
    )
    ticks: list[float] = []
    notes = []
    for field, color, note in floors:
        marks = [(bar, row[field] / row["bare_rate"]) for bar, row in zip(bars, rows) if field in row]
        if marks:
            axes.scatter([ratio for _, ratio in marks], [bar.get_y() + bar.get_height() / 2 for bar, _ in marks],
                         marker="|", s=160, color=color, zorder=3)
            ticks += [ratio for _, ratio in marks]
            notes.append(note)
    axes.axvline(1.0, color="#888888", linewidth=0.8)
    axes.set_xlim(0, 1.05 * max([1.0, *(row["ratio"] for row in rows), *ticks]))
    axes.set_xlabel("acquire + release cycles through the service / a bare WSGI app on the same server")
    title = "HTTP lock service against its floor"
    if notes:
        title += f"\n({'; '.join(notes)})"
    axes.set_title(title, fontsize=10)
    _value_column(axes, bars, [f"{row['ratio']:.2f}  ({row['service_rate']:,.0f}/s)" for row in rows])
    return _save(figure, out, "http-service", _provenance(document))


def plot_all(data: Path, out: Path) -> list[Path]:
    """Draw every figure whose data exists; return the files written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    redis_doc = _load(data, "redis_cycle")
    postgres_doc = _load(data, "postgres_cycle")
    if redis_doc is not None:
        written.append(_ratio_bars(out, "redis-cycles", redis_doc, "Redis: uncontended acquire + release"))
    if postgres_doc is not None:
        written.append(_ratio_bars(out, "postgres-cycles", postgres_doc, "PostgreSQL: uncontended acquire + release"))
    handoff_docs = [(label, doc) for label, doc in (("Redis", redis_doc), ("PostgreSQL", postgres_doc)) if doc]
    if handoff_docs:
        written.append(_handoffs(out, handoff_docs))
    heartbeat_doc = _load(data, "heartbeat_scale")
    if heartbeat_doc is not None:
        written.append(_heartbeat(out, heartbeat_doc))
    http_doc = _load(data, "http_cycle")
    if http_doc is not None:
        written.append(_http(out, http_doc))
    return written


#: The figures, by the benchmark whose JSON they need.
FIGURES = {
    "redis-cycles": ["redis_cycle"],
    "postgres-cycles": ["postgres_cycle"],
    "handoff-latency": ["redis_cycle", "postgres_cycle"],
    "heartbeat-scale": ["heartbeat_scale"],
    "http-service": ["http_cycle"],
}


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Plot the figures and name the files written."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", 1)[0])
    parser.add_argument("--data", default="benchmarks/results", help="directory of <benchmark>.json files")
    parser.add_argument("--out", default="figures", help="directory for the SVG files")
    args = parser.parse_args(argv)
    for path in plot_all(Path(args.data), Path(args.out)):
        print(path)


if __name__ == "__main__":
    main()
