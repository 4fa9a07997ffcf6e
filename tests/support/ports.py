"""Free loopback TCP ports for the private servers the tests start."""

from __future__ import annotations

import random
import socket

__all__ = ["free_port"]

# Redis Cluster listens for its node-to-node bus on the client port plus 10000, so a cluster
# node's port must leave room for that: the kernel's ephemeral range (often up to 60999) does not.
CLUSTER_BUS_OFFSET = 10000
_HIGHEST_CLUSTER_PORT = 65535 - CLUSTER_BUS_OFFSET
_LOWEST_CHOSEN_PORT = 20000


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port(*, with_cluster_bus: bool = False) -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago.

    With ``with_cluster_bus`` the port is low enough for a Redis Cluster node, and the port
    ``CLUSTER_BUS_OFFSET`` above it was free too.
    """
    if not with_cluster_bus:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("127.0.0.1", 0))
            return int(probe.getsockname()[1])
    chooser = random.Random()
    for _attempt in range(500):
        port = chooser.randint(_LOWEST_CHOSEN_PORT, _HIGHEST_CLUSTER_PORT)
        if _bindable(port) and _bindable(port + CLUSTER_BUS_OFFSET):
            return port
    raise RuntimeError("no free port pair for a Redis Cluster node on 127.0.0.1")
