"""The etcd cycle of this code against another version of lease_lock, in turns, in one run.

    git clone --quiet . /tmp/lease-lock-before && git -C /tmp/lease-lock-before checkout <commit>
    python -m benchmarks.etcd_versions --baseline /tmp/lease-lock-before
                                       [--members 1 3] [--seconds 4] [--json PATH]

The ``lease_lock`` package of ``--baseline`` (a checkout of the version to compare with) is
loaded next to this one under another name, so both run in the same process, on the same
private cluster (the tests' helper, one per ``--members`` count, on loopback), against the same
member. Each row alternates the two versions one cycle at a time and compares their median cycle
times (see ``measure.py``): the baseline is the floor, so ``ratio`` is this version's speed as a
multiple of the baseline's. Rows: the backend's bare ``acquire``/``release``, and
``locker.acquire(key).release()`` plain, with ``fencing=True`` and on a backend with
``direct_handoff=True``; every backend is built from its URL, as ``connect`` builds it.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Optional

from lease_lock.backends.etcd import EtcdBackend
from lease_lock.locker import Locker

from benchmarks.measure import add_json_argument, grant_cycle, locker_cycle, paired, write_json

__all__ = ["main"]

TTL = 30.0
TOKEN = "v" * 32
_ALIAS = "baseline_lease_lock"


def _load_baseline(checkout: Path) -> ModuleType:
    """The ``lease_lock`` package of ``checkout``, imported as :data:`_ALIAS` (the package
    imports its own modules relatively, so none of this version's modules is shared)."""
    package = checkout / "lease_lock"
    spec = importlib.util.spec_from_file_location(
        _ALIAS, package / "__init__.py", submodule_search_locations=[str(package)]
    )
    if spec is None or spec.loader is None:
        raise SystemExit(f"no lease_lock package under {checkout}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[_ALIAS] = module
    spec.loader.exec_module(module)
    return module


def _describe(checkout: Path) -> str:
    """The baseline's commit, as git names it (or the directory when it is no git checkout)."""
    try:
        return subprocess.run(
            ["git", "-C", str(checkout), "log", "-1", "--format=%h %s"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()[:100]
    except (OSError, subprocess.CalledProcessError):
        return str(checkout)


def _contestants(backend_class: Any, locker_class: Any, url: str) -> tuple[dict[str, Callable[[], None]], list[Any]]:
    """One version's rows on ``url``, and its backends (each to close after its locker, if any)."""
    backend = backend_class.from_url(url)
    lockers = [
        locker_class(backend_class.from_url(url), ttl=TTL),
        locker_class(backend_class.from_url(url), ttl=TTL, fencing=True),
        locker_class(backend_class.from_url(url + "?direct_handoff=true"), ttl=TTL),
    ]
    rows = {
        "backend acquire/release": grant_cycle(backend.acquire, backend.release, TOKEN, TTL),
        "Locker": locker_cycle(lockers[0]),
        "Locker fenced": locker_cycle(lockers[1]),
        "Locker direct_handoff": locker_cycle(lockers[2]),
    }
    return rows, [*lockers, backend]


def _close(items: list[Any]) -> None:
    for item in items:
        item.close()
        if hasattr(item, "backend"):  # a Locker: then its backend
            item.backend.close()


def _run(url: str, baseline: ModuleType, seconds: float) -> dict[str, Any]:
    # Both versions on the same one member, so that neither gains from a closer one.
    first = EtcdBackend.from_url(url).endpoints[0]
    single = "etcd://" + first.split("://", 1)[1]
    old_backend = importlib.import_module(f"{_ALIAS}.backends.etcd").EtcdBackend
    old_locker = importlib.import_module(f"{_ALIAS}.locker").Locker
    new_rows, new_items = _contestants(EtcdBackend, Locker, single)
    old_rows, old_items = _contestants(old_backend, old_locker, single)
    rows: dict[str, Any] = {}
    try:
        for name, contestant in new_rows.items():
            pairing = paired(old_rows[name], contestant, seconds)
            rows[name] = {"rate": pairing.rate, "baseline_rate": pairing.floor_rate, "ratio": pairing.ratio}
            print(f"  {name:30} {pairing.rate:9.0f} {pairing.floor_rate:9.0f} {pairing.ratio:6.2f}x")
    finally:
        _close(new_items)
        _close(old_items)
    return rows


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Start a private cluster of each size, compare the two versions on it, print the rows."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--baseline", required=True, type=Path, help="a checkout of the version to compare with")
    parser.add_argument("--members", type=int, nargs="+", default=[1, 3],
                        help="cluster sizes, one run on each (the docs' table shows 1 and 3)")
    parser.add_argument("--seconds", type=float, default=4.0, help="seconds per row")
    add_json_argument(parser)
    args = parser.parse_args(argv)
    from tests.support.etcd_server import EtcdFactory

    baseline = _load_baseline(args.baseline)
    described = _describe(args.baseline)
    results: dict[str, Any] = {"baseline": described, "members": {}}
    factory = EtcdFactory(Path(tempfile.mkdtemp(prefix="bench-etcd-versions-")))
    try:
        for members in args.members:
            cluster = factory.cluster(members=members)
            print(f"{members} member(s); baseline {described}")
            print(f"  {'row':30} {'this/s':>9} {'before/s':>9} {'ratio':>7}")
            results["members"][str(members)] = _run(cluster.url, baseline, args.seconds)
            cluster.close()
    finally:
        factory.close()
    write_json(args.json, "etcd_versions", argv, results)


if __name__ == "__main__":
    main()
