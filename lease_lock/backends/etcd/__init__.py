"""The etcd backend: leases kept by an etcd v3 cluster, over its JSON gateway with ``requests``.

``connect("etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379")`` or
``EtcdBackend(["http://10.0.0.1:2379", ...], session=requests.Session())``. See
:mod:`lease_lock.backends.etcd._backend` for the layout and the rules.
"""

from __future__ import annotations

from ._backend import DEFAULT_NAMESPACE, MIN_TTL, EtcdBackend, lease_seconds
from ._client import EtcdError

__all__ = ["DEFAULT_NAMESPACE", "MIN_TTL", "EtcdBackend", "EtcdError", "lease_seconds"]
