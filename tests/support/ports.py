"""Free loopback TCP ports for the private servers the tests start.

A port probed free can be taken before the server binds it, and three sources of that race
were seen: the kernel handing the same ephemeral port to two probes of one process (an etcd
member's client port was another member's peer port), an outgoing connection of any process
taking a probed ephemeral port, and two pytest-xdist workers probing the same port. So ports
are drawn below the kernel's ephemeral range (no outgoing connection gets one), from a slice of
that range of the worker's own, and never twice in one process.
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

__all__ = ["free_port"]

# Redis Cluster listens for its node-to-node bus on the client port plus 10000, so a cluster
# node's port comes from a band of its own whose bus ports land above every plain port.
CLUSTER_BUS_OFFSET = 10000
_PLAIN_BAND = (10000, 20000)
_CLUSTER_BAND = (20000, 30000)

_handed_out: set[int] = set()
_chooser = random.Random()


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _ephemeral_floor() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _worker_slice(low: int, high: int) -> range:
    """This xdist worker's share of ``[low, high)`` (all of it outside xdist)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    width = (high - low) // max(count, 1)
    start = low + (index % max(count, 1)) * width
    return range(start, start + width)


def free_port(*, with_cluster_bus: bool = False) -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago and that this process never handed out.

    With ``with_cluster_bus`` the port is low enough for a Redis Cluster node, and the port
    ``CLUSTER_BUS_OFFSET`` above it was free too.
    """
    low, high = _CLUSTER_BAND if with_cluster_bus else _PLAIN_BAND
    if not with_cluster_bus:
        # A system whose ephemeral range starts lower keeps plain ports below it where it can.
        high = min(high, max(_ephemeral_floor(), low + 1000))
    candidates = _worker_slice(low, high)
    for _attempt in range(500):
        port = _chooser.choice(candidates)
        if port in _handed_out or not _bindable(port):
            continue
        if with_cluster_bus and not _bindable(port + CLUSTER_BUS_OFFSET):
            continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port on 127.0.0.1 in {candidates.start}..{candidates.stop - 1}")
