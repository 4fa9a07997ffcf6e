"""Prometheus and OpenTelemetry metrics from lock events, on a real SQLite store.

One scripted sequence (acquire, extend, contend, time out, lose by force_release, acquire and
release again) feeds both exporters through one ``on_event`` list; the counts are exact and
every histogram bucket holds exactly the observations at or below its bound (the observed
values are taken from the same events, recorded by a third hook).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from lease_lock import Locker, LockEvent, LockHeldError, MemoryBackend, connect
from lease_lock.contrib.metrics import DURATION_BUCKETS
from lease_lock.contrib.opentelemetry import OpenTelemetryMetrics
from lease_lock.contrib.prometheus import PrometheusMetrics
from lease_lock.errors import ValidationError
from lease_lock.events import combine
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry


def group(key: str) -> str:
    return key.split(":")[0]


def scripted(url: str, hooks: list[Any]) -> list[LockEvent]:
    """The sequence; returns every event it produced, in order."""
    seen: list[LockEvent] = []
    holder = connect(url, on_event=[*hooks, seen.append], owner="holder")
    other = connect(url, on_event=[*hooks, seen.append], owner="other")
    try:
        lock = holder.acquire("report:daily", ttl=30)
        lock.extend()
        assert other.try_acquire("report:daily") is None
        with pytest.raises(LockHeldError) as timed_out:
            other.acquire("report:daily", timeout=0.3)
        assert timed_out.value.reason == "timeout"
        assert other.force_release("report:daily")
        assert not lock.is_held()
        second = holder.acquire("email:weekly")
        second.release()
    finally:
        holder.close()
        other.close()
    return seen


def values(events: list[LockEvent], kind: str, field: str) -> list[float]:
    return [getattr(event, field) for event in events if event.type == kind]


def expected_buckets(observations: list[float]) -> list[int]:
    return [sum(1 for value in observations if value <= bound) for bound in DURATION_BUCKETS]


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'metrics.db'}"


def test_prometheus_and_opentelemetry_count_the_same_scripted_sequence(url: str) -> None:
    registry = CollectorRegistry()
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    events = scripted(
        url,
        [PrometheusMetrics(registry=registry, key_label=group), OpenTelemetryMetrics(provider, key_label=group)],
    )
    contended = [event for event in events if event.type == "contended"]
    assert contended and all(event.reason == "held" for event in contended)
    waits = values(events, "acquired", "waited")
    holds = [event.held_for for event in events if event.type in ("released", "lost")]
    assert len(waits) == 2 and len(holds) == 2

    def sample(name: str, **labels: str) -> float:
        value = registry.get_sample_value(f"lease_lock_{name}", labels)
        return 0.0 if value is None else value

    report = {"lock": "report"}
    assert sample("acquisitions_total", **report, outcome="acquired") == 1
    assert sample("acquisitions_total", lock="email", outcome="acquired") == 1
    assert sample("acquisitions_total", **report, outcome="contended") == len(contended)
    assert sample("acquisitions_total", **report, outcome="timeout") == 1
    assert sample("acquisitions_total", **report, outcome="late") == 0
    assert sample("extensions_total", **report) == 1
    assert sample("extension_failures_total", **report) == 0
    assert sample("losses_total", **report, reason="observed") == 1
    assert sample("held", **report) == 0
    assert sample("held", lock="email") == 0
    for name, observed in (("wait_seconds", waits), ("hold_seconds", holds)):
        for lock, value in zip(("report", "email"), observed):
            buckets = [sample(f"{name}_bucket", lock=lock, le=str(bound)) for bound in DURATION_BUCKETS]
            assert buckets == expected_buckets([value])
            assert sample(f"{name}_bucket", lock=lock, le="+Inf") == 1
            assert sample(f"{name}_sum", lock=lock) == pytest.approx(value)

    data = reader.get_metrics_data()
    points: dict[str, list[Any]] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                points[metric.name] = list(metric.data.data_points)

    def total(name: str, **attributes: str) -> float:
        return sum(point.value for point in points.get(name, []) if dict(point.attributes) == attributes)

    assert total("lease_lock.acquisitions", **report, outcome="acquired") == 1
    assert total("lease_lock.acquisitions", **report, outcome="contended") == len(contended)
    assert total("lease_lock.acquisitions", **report, outcome="timeout") == 1
    assert total("lease_lock.extensions", **report) == 1
    assert "lease_lock.extension_failures" not in points
    assert total("lease_lock.losses", **report, reason="observed") == 1
    assert total("lease_lock.held", **report) == 0
    for name, observed in (("lease_lock.wait", waits), ("lease_lock.hold", holds)):
        for lock, value in zip(("report", "email"), observed):
            (point,) = [p for p in points[name] if dict(p.attributes) == {"lock": lock}]
            assert tuple(point.explicit_bounds) == DURATION_BUCKETS
            assert point.count == 1 and point.sum == pytest.approx(value)
            # Per-bucket counts (OpenTelemetry's are not cumulative).
            index = next((i for i, bound in enumerate(DURATION_BUCKETS) if value <= bound), len(DURATION_BUCKETS))
            assert list(point.bucket_counts) == [1 if i == index else 0 for i in range(len(DURATION_BUCKETS) + 1)]


def test_without_key_label_there_is_no_key_in_any_label(url: str) -> None:
    registry = CollectorRegistry()
    scripted(url, [PrometheusMetrics(registry=registry, namespace="jobs")])
    assert registry.get_sample_value("jobs_acquisitions_total", {"outcome": "acquired"}) == 2
    assert registry.get_sample_value("jobs_losses_total", {"reason": "observed"}) == 1
    for metric in registry.collect():
        for found in metric.samples:
            assert set(found.labels) <= {"outcome", "reason", "le"}, found


def test_the_held_gauge_counts_locks_held_now(url: str) -> None:
    registry = CollectorRegistry()
    with connect(url, on_event=PrometheusMetrics(registry=registry)) as locker:
        first = locker.acquire("a")
        second = locker.acquire("b")
        assert registry.get_sample_value("lease_lock_held") == 2
        first.release()
        assert registry.get_sample_value("lease_lock_held") == 1
        second.release()
        assert registry.get_sample_value("lease_lock_held") == 0


def test_a_failing_hook_does_not_starve_the_next_one(url: str) -> None:
    seen: list[str] = []

    def broken(event: LockEvent) -> None:
        raise RuntimeError("broken hook")

    with connect(url, on_event=[broken, lambda event: seen.append(event.type)]) as locker:
        locker.acquire("k").release()
    assert seen == ["acquired", "released"]


def test_combine_and_bad_hooks() -> None:
    assert combine(None, []) is None
    assert combine(print) is print
    with pytest.raises(ValidationError, match="callable"):
        combine([print, "not a hook"])  # type: ignore[list-item]
    with pytest.raises(ValidationError, match="on_event"):
        Locker(MemoryBackend(), on_event=42)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="key_label"):
        PrometheusMetrics(registry=CollectorRegistry(), key_label="lock")  # type: ignore[arg-type]


def test_flask_and_django_settings_switch_the_exporters_on(url: str) -> None:
    import prometheus_client
    from flask import Flask
    from lease_lock.contrib._config import connect_options
    from lease_lock.contrib.flask import LeaseLock

    def acquired() -> float:
        value = prometheus_client.REGISTRY.get_sample_value("lease_lock_acquisitions_total", {"outcome": "acquired"})
        return 0.0 if value is None else value

    before = acquired()
    for _ in range(2):  # a second app shares the process-wide exporter (no duplicate metrics)
        app = Flask(__name__)
        app.config.update(LEASE_LOCK_URL=url, LEASE_LOCK_METRICS="prometheus")
        extension = LeaseLock(app)
        with app.app_context():
            extension.locker.acquire("flask-job").release()
            extension.locker.close()
    assert acquired() == before + 2
    # Django reads LEASE_LOCK["METRICS"] through the same function; another hook is kept.
    seen: list[LockEvent] = []
    options = connect_options(
        {"METRICS": "opentelemetry"}, {"on_event": seen.append}, prefix="", options_name="OPTIONS"
    )
    with connect(url, **options) as locker:
        locker.acquire("django-job").release()
    assert [event.type for event in seen] == ["acquired", "released"]
    with pytest.raises(ValidationError, match="METRICS setting must be 'prometheus' or 'opentelemetry'"):
        connect_options({"LEASE_LOCK_METRICS": "statsd"}, {}, prefix="LEASE_LOCK_", options_name="LEASE_LOCK_OPTIONS")


def test_the_documented_alert_rules_use_series_the_exporter_writes(url: str) -> None:
    import re

    import yaml

    text = (Path(__file__).resolve().parents[2] / "docs" / "operating.md").read_text()
    (block,) = re.findall(r"```yaml\n(.*?)```", text, flags=re.DOTALL)
    rules = yaml.safe_load(block)["groups"][0]["rules"]
    assert {rule["alert"] for rule in rules} >= {"LeaseLockLost", "LeaseLockHeldTooLong"}
    registry = CollectorRegistry()
    scripted(url, [PrometheusMetrics(registry=registry)])
    written = {sample.name: sample.labels for metric in registry.collect() for sample in metric.samples}
    for rule in rules:
        for name in re.findall(r"lease_lock_\w+", rule["expr"]):
            assert name in written, (rule["alert"], name)
        for bound in re.findall(r'le="([^"]+)"', rule["expr"]):
            assert registry.get_sample_value("lease_lock_hold_seconds_bucket", {"le": bound}) is not None
