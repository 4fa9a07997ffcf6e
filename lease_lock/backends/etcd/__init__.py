"""The etcd backend: leases kept by an etcd v3 cluster, over its JSON gateway.

``connect("etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379")`` or
``EtcdBackend(["http://10.0.0.1:2379", ...])`` (with ``session=requests.Session()``, every
request goes through that session; without, all but the watch streams go over the backend's
own connections). Each lock is one
etcd key on an etcd lease of its own, checked and written in single transactions; its fence is
the key's ``create_revision`` (or, for a key a release handed straight to a waiter with
``direct_handoff``, the one its value carries); a counting key (``limit`` > 1) keeps one key per
holder's place beside it, each on a lease of its own. The etcd backend page of the documentation gives the layout, the
TTL rules (whole seconds, at least 2 s; a leader change restarts every lease) and the failure
behaviour.
"""

from __future__ import annotations

from ._backend import DEFAULT_NAMESPACE, MIN_TTL, EtcdBackend, lease_seconds
from ._client import EtcdError
from ._handoff import READY_MARGIN

__all__ = ["DEFAULT_NAMESPACE", "MIN_TTL", "READY_MARGIN", "EtcdBackend", "EtcdError", "lease_seconds"]
