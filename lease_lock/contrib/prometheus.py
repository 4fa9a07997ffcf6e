"""Prometheus metrics from lock events (extra ``prometheus``: ``prometheus_client``).

::

    from lease_lock import connect
    from lease_lock.contrib.prometheus import PrometheusMetrics

    locker = connect(url, on_event=PrometheusMetrics())

Series (with the default ``namespace="lease_lock"``): ``lease_lock_acquisitions_total{outcome}``,
``lease_lock_wait_seconds`` and ``lease_lock_hold_seconds`` (histograms),
``lease_lock_extensions_total``, ``lease_lock_extension_failures_total``,
``lease_lock_losses_total{reason}`` and ``lease_lock_held`` (gauge). What each counts is
described on :class:`~lease_lock.contrib.metrics.EventMetrics`.
"""

from __future__ import annotations

from typing import Any, Optional

from .metrics import DURATION_BUCKETS, EventMetrics, KeyLabel

__all__ = ["PrometheusMetrics"]


class PrometheusMetrics(EventMetrics):
    """An ``on_event`` hook recording lock metrics in a Prometheus ``CollectorRegistry``.

    ``registry`` defaults to ``prometheus_client``'s global registry (what its HTTP exporter
    serves); a registry takes one set of these metrics per ``namespace``, so build one
    instance per process and share it between lockers. ``key_label`` adds a ``lock`` label,
    see :class:`~lease_lock.contrib.metrics.EventMetrics`.
    """

    def __init__(
        self,
        registry: Optional[Any] = None,
        namespace: str = "lease_lock",
        key_label: Optional[KeyLabel] = None,
    ) -> None:
        super().__init__(key_label)
        import prometheus_client

        registry = prometheus_client.REGISTRY if registry is None else registry
        common: dict[str, Any] = {"namespace": namespace, "registry": registry}
        lock = list(self.label_names)
        self.acquisitions = prometheus_client.Counter(
            "acquisitions", "Acquisition attempts by outcome: acquired, contended, late, timeout.",
            [*lock, "outcome"], **common,
        )
        self.wait_seconds = prometheus_client.Histogram(
            "wait_seconds", "Time from the first attempt to the grant.", lock,
            buckets=DURATION_BUCKETS, **common,
        )
        self.hold_seconds = prometheus_client.Histogram(
            "hold_seconds", "How long a lock was held, observed at its release or loss.", lock,
            buckets=DURATION_BUCKETS, **common,
        )
        self.extensions = prometheus_client.Counter(
            "extensions", "Lease extensions that succeeded.", lock, **common
        )
        self.extension_failures = prometheus_client.Counter(
            "extension_failures", "Lease extensions that failed (the store could not be asked).",
            lock, **common,
        )
        self.losses = prometheus_client.Counter(
            "losses", "Locks lost while held, by reason.", [*lock, "reason"], **common
        )
        self.held = prometheus_client.Gauge(
            "held", "Locks this process holds now.", lock, multiprocess_mode="livesum", **common
        )

    @staticmethod
    def _child(metric: Any, labels: dict[str, str]) -> Any:
        return metric.labels(**labels) if labels else metric

    def count_acquisition(self, outcome: str, labels: dict[str, str]) -> None:
        """Add one to ``acquisitions_total{outcome}``."""
        self.acquisitions.labels(**labels, outcome=outcome).inc()

    def observe_wait(self, seconds: float, labels: dict[str, str]) -> None:
        """Observe ``wait_seconds``."""
        self._child(self.wait_seconds, labels).observe(seconds)

    def observe_hold(self, seconds: float, labels: dict[str, str]) -> None:
        """Observe ``hold_seconds``."""
        self._child(self.hold_seconds, labels).observe(seconds)

    def count_extension(self, succeeded: bool, labels: dict[str, str]) -> None:
        """Add one to ``extensions_total`` or ``extension_failures_total``."""
        self._child(self.extensions if succeeded else self.extension_failures, labels).inc()

    def count_loss(self, reason: str, labels: dict[str, str]) -> None:
        """Add one to ``losses_total{reason}``."""
        self.losses.labels(**labels, reason=reason).inc()

    def add_held(self, delta: int, labels: dict[str, str]) -> None:
        """Move the ``held`` gauge."""
        self._child(self.held, labels).inc(delta)
