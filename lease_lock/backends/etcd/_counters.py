"""Fixed-window counters on etcd, shared by every lock-server process that uses one cluster.

etcd keeps no clock a client can read, so windows are aligned to multiples of ``window`` on the
wall clock of the process that counts: server processes on several hosts need clocks that agree
(NTP), else a boundary falls at slightly different moments for each and a budget may be spent
twice around it. The count itself is exact: each addition is a compare-and-swap on the counter
key's ``mod_revision`` inside one transaction, tried again when another client won the race.

A counter is the key ``COUNTER_PREFIX + namespace + NUL + name + NUL + window number`` holding
its total as decimal digits. It starts with a NUL byte, which no namespace does, so it lies
outside every namespace's range; it rides on a lease one second longer than its window, so etcd
drops it once its window is over.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Optional

from ...errors import ValidationError
from ...validation import check_duration
from ..service import check_amount
from ._client import EtcdClient, b64, unb64

__all__ = ["COUNTER_PREFIX", "count_in_window"]

#: The first bytes of every counter key (a NUL first: never inside a namespace's range).
COUNTER_PREFIX = b"\x00lease_lock/window/"
# Lost races in a row before giving up: each one means another client's addition committed.
_MAX_TRIES = 1000


def _check(name: object, window: object, amount: object) -> float:
    if not isinstance(name, str) or not name:
        raise ValidationError("name must be a non-empty str")
    seconds = check_duration(window, "window")
    if seconds < 0.001:
        raise ValidationError("window must be at least 0.001 seconds")
    check_amount(amount)
    return seconds


def _try_add(client: EtcdClient, key: bytes, amount: int, lease_seconds: int,
             revoke: Callable[[Optional[str]], None]) -> Optional[int]:
    """One attempt: the new total, or ``None`` when another client changed the counter first."""
    kvs = client.call("/v3/kv/range", {"key": b64(key)}).get("kvs", [])
    lease: Optional[str] = None
    if kvs:
        total = int(unb64(kvs[0].get("value")) or b"0") + amount
        compare: dict[str, Any] = {"target": "MOD", "result": "EQUAL", "mod_revision": kvs[0]["mod_revision"]}
        put: dict[str, Any] = {"key": b64(key), "value": b64(str(total).encode()), "ignore_lease": True}
    else:
        total = amount
        lease = str(client.call("/v3/lease/grant", {"TTL": lease_seconds})["ID"])
        compare = {"target": "CREATE", "result": "EQUAL", "create_revision": "0"}
        put = {"key": b64(key), "value": b64(str(total).encode()), "lease": lease}
    answer = client.call("/v3/kv/txn", {"compare": [{"key": b64(key), **compare}], "success": [{"request_put": put}]})
    if answer.get("succeeded"):
        return total
    revoke(lease)
    return None


def count_in_window(
    client: EtcdClient,
    namespace: bytes,
    name: str,
    window: float,
    amount: int,
    revoke: Callable[[Optional[str]], None],
    now: Callable[[], float] = time.time,
) -> tuple[int, float]:
    """Add ``amount`` to counter ``name`` in the current window; its new total and the seconds
    left in the window. ``revoke`` drops a lease granted for a counter another client created
    first."""
    seconds = _check(name, window, amount)
    moment = now()
    number = math.floor(moment / seconds)
    key = COUNTER_PREFIX + namespace + b"\x00" + name.encode() + b"\x00" + str(number).encode()
    lease_seconds = math.ceil(seconds) + 1
    for _attempt in range(_MAX_TRIES):
        total = _try_add(client, key, amount, lease_seconds, revoke)
        if total is not None:
            return total, max(0.0, (number + 1) * seconds - moment)
    raise RuntimeError(f"counter {name!r} kept changing under {_MAX_TRIES} additions in a row")
