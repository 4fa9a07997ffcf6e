"""What recording metrics from the events costs per lock cycle.

    python -m benchmarks.metrics_overhead [--cycles 20000] [--repeat 5]

Each row runs ``--cycles`` acquire+release cycles on one key of a ``MemoryBackend`` (the
cheapest store, so the hooks' share is as large as it gets) and keeps the best of ``--repeat``
runs: no hook, the Prometheus exporter, the OpenTelemetry exporter (SDK meter provider with an
in-memory reader), and both through one ``on_event`` list. Reported: cycles per second,
microseconds per cycle, and the ratio to the row without a hook. Needs the ``prometheus`` and
``opentelemetry`` extras and ``opentelemetry-sdk``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from lease_lock import Locker, MemoryBackend

from .overhead import locker_acquire, measure

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> None:
    """Run every row and print one table."""
    from lease_lock.contrib.opentelemetry import OpenTelemetryMetrics
    from lease_lock.contrib.prometheus import PrometheusMetrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from prometheus_client import CollectorRegistry

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    prometheus = PrometheusMetrics(registry=CollectorRegistry())
    opentelemetry = OpenTelemetryMetrics(MeterProvider(metric_readers=[InMemoryMetricReader()]))
    hooks: list[tuple[str, Any]] = [
        ("no on_event hook", None),
        ("PrometheusMetrics", prometheus),
        ("OpenTelemetryMetrics", opentelemetry),
        ("both, as an on_event list", [prometheus, opentelemetry]),
    ]
    results = []
    for name, hook in hooks:
        with Locker(MemoryBackend(), on_event=hook) as locker:
            results.append((name, measure(locker_acquire(locker), args.cycles, args.repeat)))
    base = results[0][1]
    print(f"MemoryBackend, acquire + release, {args.cycles} cycles per run, best of {args.repeat}")
    print(f"{'':28} {'cycles/s':>10} {'us/cycle':>9} {'vs none':>8}")
    for name, seconds in results:
        print(f"{name:28} {1 / seconds:10.0f} {seconds * 1e6:9.1f} {seconds / base:7.2f}x")


if __name__ == "__main__":
    main()
