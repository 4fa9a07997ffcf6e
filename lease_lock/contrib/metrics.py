"""What the metrics exporters count, independent of the metrics library.

:class:`EventMetrics` turns :class:`~lease_lock.LockEvent` objects into six measurements; the
Prometheus and OpenTelemetry exporters (:mod:`lease_lock.contrib.prometheus`,
:mod:`lease_lock.contrib.opentelemetry`) only say how each is recorded. Keeping the mapping in
one place keeps the two exporters' numbers identical.
"""

from __future__ import annotations

from typing import Callable, Optional

from ..errors import ValidationError
from ..events import LockEvent

__all__ = ["DURATION_BUCKETS", "OUTCOMES", "EventMetrics", "KeyLabel"]

#: Histogram bucket bounds (seconds) for wait and hold times: from a few milliseconds (an
#: uncontended grant) to a day (the longest default hold).
DURATION_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    300.0, 900.0, 1800.0, 3600.0, 7200.0, 21600.0, 86400.0,
)

#: The ``outcome`` values of the acquisitions counter: a grant; an attempt that found the key
#: held; an attempt granted too late to be safe (given back); a wait that ran out.
OUTCOMES = ("acquired", "contended", "late", "timeout")

#: Maps a full key (prefix included) to a low-cardinality name for the ``lock`` label.
KeyLabel = Callable[[str], str]


class EventMetrics:
    """An ``on_event`` hook recording lock metrics; subclasses record into a metrics library.

    - acquisitions by ``outcome`` (:data:`OUTCOMES`): ``acquired`` per grant, ``contended`` and
      ``late`` per failed attempt (a wait of many attempts counts each), ``timeout`` per wait
      that gave up because its time ran out;
    - wait time before a grant (histogram, from the ``acquired`` event's ``waited``);
    - hold time (histogram, from ``held_for`` when a lock is released or lost);
    - extensions and failed extensions (counters);
    - losses by ``reason`` (counter; the reasons are lease_lock's fixed codes);
    - locks currently held by this process (gauge: up on a grant, down on a release or loss).

    With ``key_label`` each measurement also carries a ``lock`` label, ``key_label(key)``; it
    must map the unbounded set of keys to a few names (``lambda key: key.split(":")[0]``).
    Without it there is no key label at all. Tokens never reach a label.
    """

    def __init__(self, key_label: Optional[KeyLabel] = None) -> None:
        if key_label is not None and not callable(key_label):
            raise ValidationError(f"key_label must be callable, not {type(key_label).__name__}")
        self.key_label = key_label

    @property
    def label_names(self) -> tuple[str, ...]:
        """The labels every measurement carries besides its own (``("lock",)`` or ``()``)."""
        return ("lock",) if self.key_label is not None else ()

    def _labels(self, key: str) -> dict[str, str]:
        if self.key_label is None:
            return {}
        name = self.key_label(key)
        if not isinstance(name, str):
            raise ValidationError(f"key_label must return a str, not {type(name).__name__}")
        return {"lock": name}

    def __call__(self, event: LockEvent) -> None:
        """Record ``event`` (the ``on_event`` hook)."""
        labels = self._labels(event.key)
        kind = event.type
        if kind == "acquired":
            self.count_acquisition("acquired", labels)
            if event.waited is not None:
                self.observe_wait(max(0.0, event.waited), labels)
            self.add_held(1, labels)
        elif kind == "contended":
            self.count_acquisition("late" if event.reason == "late" else "contended", labels)
        elif kind == "timed_out":
            self.count_acquisition("timeout", labels)
        elif kind == "extended":
            self.count_extension(True, labels)
        elif kind == "extend_failed":
            self.count_extension(False, labels)
        elif kind in ("released", "lost"):
            if event.held_for is not None:
                self.observe_hold(max(0.0, event.held_for), labels)
            if kind == "lost":
                self.count_loss(event.reason or "unknown", labels)
            self.add_held(-1, labels)

    # What a subclass records into its library; ``labels`` holds ``lock`` when configured.

    def count_acquisition(self, outcome: str, labels: dict[str, str]) -> None:
        """Add one to the acquisitions counter for ``outcome``."""
        raise NotImplementedError

    def observe_wait(self, seconds: float, labels: dict[str, str]) -> None:
        """Observe a wait before a grant."""
        raise NotImplementedError

    def observe_hold(self, seconds: float, labels: dict[str, str]) -> None:
        """Observe how long a lock was held when it was released or lost."""
        raise NotImplementedError

    def count_extension(self, succeeded: bool, labels: dict[str, str]) -> None:
        """Add one to the extensions (or failed extensions) counter."""
        raise NotImplementedError

    def count_loss(self, reason: str, labels: dict[str, str]) -> None:
        """Add one to the losses counter for ``reason``."""
        raise NotImplementedError

    def add_held(self, delta: int, labels: dict[str, str]) -> None:
        """Move the locks-held gauge by ``delta``."""
        raise NotImplementedError
