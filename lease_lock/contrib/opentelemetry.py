"""OpenTelemetry metrics from lock events (extra ``opentelemetry``: ``opentelemetry-api``).

::

    from lease_lock import connect
    from lease_lock.contrib.opentelemetry import OpenTelemetryMetrics

    locker = connect(url, on_event=OpenTelemetryMetrics())

Instruments (meter ``lease_lock``): ``lease_lock.acquisitions`` (attribute ``outcome``),
``lease_lock.wait`` and ``lease_lock.hold`` (histograms, seconds), ``lease_lock.extensions``,
``lease_lock.extension_failures``, ``lease_lock.losses`` (attribute ``reason``) and
``lease_lock.held`` (up-down counter). What each counts is described on
:class:`~lease_lock.contrib.metrics.EventMetrics`.
"""

from __future__ import annotations

from typing import Any, Optional

from .. import __version__
from .metrics import DURATION_BUCKETS, EventMetrics, KeyLabel

__all__ = ["OpenTelemetryMetrics"]


class OpenTelemetryMetrics(EventMetrics):
    """An ``on_event`` hook recording lock metrics with an OpenTelemetry meter.

    ``meter_provider`` defaults to the global one (``opentelemetry.metrics``); ``key_label``
    adds a ``lock`` attribute, see :class:`~lease_lock.contrib.metrics.EventMetrics`.
    """

    def __init__(self, meter_provider: Optional[Any] = None, key_label: Optional[KeyLabel] = None) -> None:
        super().__init__(key_label)
        from opentelemetry import metrics

        meter = metrics.get_meter("lease_lock", __version__, meter_provider=meter_provider)
        self.acquisitions = meter.create_counter(
            "lease_lock.acquisitions", "{attempt}",
            "Acquisition attempts by outcome: acquired, contended, late, timeout.",
        )
        self.wait = meter.create_histogram(
            "lease_lock.wait", "s", "Time from the first attempt to the grant.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.hold = meter.create_histogram(
            "lease_lock.hold", "s", "How long a lock was held, observed at its release or loss.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.extensions = meter.create_counter(
            "lease_lock.extensions", "{extension}", "Lease extensions that succeeded."
        )
        self.extension_failures = meter.create_counter(
            "lease_lock.extension_failures", "{extension}",
            "Lease extensions that failed (the store could not be asked).",
        )
        self.losses = meter.create_counter(
            "lease_lock.losses", "{lock}", "Locks lost while held, by reason."
        )
        self.held = meter.create_up_down_counter(
            "lease_lock.held", "{lock}", "Locks this process holds now."
        )

    def count_acquisition(self, outcome: str, labels: dict[str, str]) -> None:
        """Add one to ``lease_lock.acquisitions{outcome}``."""
        self.acquisitions.add(1, {**labels, "outcome": outcome})

    def observe_wait(self, seconds: float, labels: dict[str, str]) -> None:
        """Record ``lease_lock.wait``."""
        self.wait.record(seconds, labels)

    def observe_hold(self, seconds: float, labels: dict[str, str]) -> None:
        """Record ``lease_lock.hold``."""
        self.hold.record(seconds, labels)

    def count_extension(self, succeeded: bool, labels: dict[str, str]) -> None:
        """Add one to ``lease_lock.extensions`` or ``lease_lock.extension_failures``."""
        (self.extensions if succeeded else self.extension_failures).add(1, labels)

    def count_loss(self, reason: str, labels: dict[str, str]) -> None:
        """Add one to ``lease_lock.losses{reason}``."""
        self.losses.add(1, {**labels, "reason": reason})

    def add_held(self, delta: int, labels: dict[str, str]) -> None:
        """Move ``lease_lock.held``."""
        self.held.add(delta, labels)
