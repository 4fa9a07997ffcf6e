"""How long an etcd election takes, and which ttl an auto-extended lock needs to ride one out.

    python -m benchmarks.etcd_election [--ttls 3,5] [--trials 8] [--json PATH]

Starts a private three-member cluster on loopback (the tests' helper, so the repository's
``tests`` package must be importable). For each ttl and trial: a ``Locker`` on every member
takes a lock with that ttl and keeps it extended; at a random moment within one ttl the leader
is SIGKILLed; the script records how long until another member leads, and whether the lock read
lost within the two ttls after the election; then the killed member is started again on its data.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from lease_lock import connect

from benchmarks.measure import add_json_argument, write_json

__all__ = ["main"]


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Run the trials and print one row per ttl."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--ttls", default="3,5", help="comma-separated lock ttls in seconds")
    parser.add_argument("--trials", type=int, default=8)
    add_json_argument(parser)
    args = parser.parse_args(argv)
    from tests.support.etcd_server import EtcdFactory

    factory = EtcdFactory(Path(tempfile.mkdtemp(prefix="bench-etcd-")))
    chooser = random.Random()
    results: dict[str, Any] = {}
    try:
        cluster = factory.cluster(members=3)
        print(f"{'ttl':>4} {'lost':>6} {'election min':>13} {'max':>6}")
        for ttl in (float(text) for text in args.ttls.split(",")):
            losses, elections = 0, []
            for _ in range(args.trials):
                with connect(cluster.url, ttl=ttl) as locker:
                    lock = locker.acquire(f"bench:election:{uuid.uuid4().hex[:8]}")
                    time.sleep(chooser.uniform(0, ttl))
                    leader = cluster.leader()
                    killed = time.monotonic()
                    leader.kill()
                    elected = cluster.leader()
                    elections.append(time.monotonic() - killed)
                    if lock.lost.wait(2 * ttl):
                        losses += 1
                    assert elected is not leader
                    lock.release()
                leader.start()
                cluster.wait_serving()
            results[f"{ttl:g}"] = {"trials": args.trials, "lost": losses, "elections": elections}
            print(f"{ttl:4g} {losses:>3}/{args.trials:<2} {min(elections):12.2f}s {max(elections):5.2f}s")
    finally:
        factory.close()
    write_json(args.json, "etcd_election", argv, results)


if __name__ == "__main__":
    main()
