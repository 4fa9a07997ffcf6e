"""Prometheus text metrics of one server process (``GET /metrics`` with ``--metrics``).

Labels are route templates, methods, statuses and project ids only: never a lock name, a token
or a key, and every label value comes from a small fixed set or from the keys file, so the
number of series stays bounded. Each process counts its own requests; with ``--workers`` a
scrape sees the process that answered it.
"""

from __future__ import annotations

import threading
from typing import Callable

__all__ = ["DURATION_BUCKETS", "Metrics"]

#: Upper bounds (seconds) of the request duration histogram.
DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_METHODS = frozenset({"GET", "HEAD", "POST", "PATCH", "DELETE", "PUT", "OPTIONS"})


class Metrics:
    """Counters and a latency histogram, safe across threads; ``render()`` gives the text."""

    def __init__(self, current_waits: Callable[[], int]) -> None:
        self._current_waits = current_waits
        self._mutex = threading.Lock()
        self._requests: dict[tuple[str, str, int, str], int] = {}
        self._buckets: dict[str, list[int]] = {}
        self._sums: dict[str, float] = {}
        self._rate_limited: dict[str, int] = {}
        self._store_errors = 0

    def observe(self, route: str, method: str, status: int, project: str, seconds: float) -> None:
        """Count one answered request."""
        method = method if method in _METHODS else "OTHER"
        with self._mutex:
            key = (route, method, status, project)
            self._requests[key] = self._requests.get(key, 0) + 1
            buckets = self._buckets.setdefault(route, [0] * (len(DURATION_BUCKETS) + 1))
            for index, bound in enumerate(DURATION_BUCKETS):
                if seconds <= bound:
                    buckets[index] += 1
            buckets[-1] += 1
            self._sums[route] = self._sums.get(route, 0.0) + seconds
            if status == 429:
                self._rate_limited[project] = self._rate_limited.get(project, 0) + 1

    def store_error(self) -> None:
        """Count one store call that failed because the store could not be reached."""
        with self._mutex:
            self._store_errors += 1

    def render(self) -> str:
        """The Prometheus text exposition (format 0.0.4)."""
        with self._mutex:
            requests = sorted(self._requests.items())
            buckets = {route: list(counts) for route, counts in sorted(self._buckets.items())}
            sums = dict(self._sums)
            limited = sorted(self._rate_limited.items())
            store_errors = self._store_errors
        lines = [
            "# HELP lease_lock_requests_total Requests answered, by route, method, status and project.",
            "# TYPE lease_lock_requests_total counter",
        ]
        for (route, method, status, project), count in requests:
            labels = f'route="{route}",method="{method}",status="{status}",project="{project}"'
            lines.append(f"lease_lock_requests_total{{{labels}}} {count}")
        lines += [
            "# HELP lease_lock_request_duration_seconds Time to answer a request, by route.",
            "# TYPE lease_lock_request_duration_seconds histogram",
        ]
        for route, counts in buckets.items():
            for bound, count in zip(DURATION_BUCKETS, counts):
                lines.append(f'lease_lock_request_duration_seconds_bucket{{route="{route}",le="{bound}"}} {count}')
            lines.append(f'lease_lock_request_duration_seconds_bucket{{route="{route}",le="+Inf"}} {counts[-1]}')
            lines.append(f'lease_lock_request_duration_seconds_sum{{route="{route}"}} {sums[route]:.6f}')
            lines.append(f'lease_lock_request_duration_seconds_count{{route="{route}"}} {counts[-1]}')
        lines += [
            "# HELP lease_lock_rate_limited_total Requests refused with 429, by project.",
            "# TYPE lease_lock_rate_limited_total counter",
        ]
        lines += [f'lease_lock_rate_limited_total{{project="{project}"}} {count}' for project, count in limited]
        lines += [
            "# HELP lease_lock_store_errors_total Store calls that failed because the store was unreachable.",
            "# TYPE lease_lock_store_errors_total counter",
            f"lease_lock_store_errors_total {store_errors}",
            "# HELP lease_lock_waits_current Requests waiting under Prefer: wait=N right now.",
            "# TYPE lease_lock_waits_current gauge",
            f"lease_lock_waits_current {self._current_waits()}",
        ]
        return "\n".join(lines) + "\n"
