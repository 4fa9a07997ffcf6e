"""The etcd benchmarks still run end to end, in miniature, against real private clusters.

Nothing here judges speed: the point is that a change cannot quietly break the scripts whose
tables the etcd backend page quotes.
"""

from __future__ import annotations

import importlib.util

from tests.support.etcd_server import EtcdCluster, require_etcd_binary
from tests.test_benchmarks import run_benchmark, table_rows


def test_etcd_cycle_prints_every_row(etcd_server: EtcdCluster) -> None:
    output = run_benchmark(
        "etcd_cycle", "--url", etcd_server.url, "--seconds", "0.3", "--handoffs", "5", "--workers", "2"
    )
    names = (
        "backend acquire/release", "Locker fenced", "Locker hand-off (watch)", "bare watch delivery",
        "bare watch delivery, then take", "Locker p50 minus watch", "Locker p50 minus watch, then take",
        "Locker, 1 process", "Locker, 2 processes", "Locker direct_handoff", "Locker hand-off (direct_handoff)",
        "direct p50 minus watch", "Locker direct_handoff, 2 processes",
    )
    rows = table_rows(output, *names)
    assert rows["Locker fenced"][-1].endswith("x") and float(rows["Locker fenced"][0]) > 0
    bare = ("Locker hand-off (watch)", "bare watch delivery", "bare watch delivery, then take")
    handoff, watch, take = (float(rows[name][0]) for name in bare)
    assert handoff > 0 and watch > 0 and take > 0
    # The gaps are the differences of the p50s printed above them (each rounded to 0.01 ms).
    assert abs(float(rows["Locker p50 minus watch"][0]) - (handoff - watch)) < 0.03
    assert abs(float(rows["Locker p50 minus watch, then take"][0]) - (handoff - take)) < 0.03
    direct = float(rows["Locker hand-off (direct_handoff)"][0])
    assert direct > 0 and abs(float(rows["direct p50 minus watch"][0]) - (direct - watch)) < 0.03
    assert rows["Locker direct_handoff"][-1].endswith("x")
    for contended in ("Locker, 2 processes", "Locker direct_handoff, 2 processes"):
        grants, _ratio, fewest, refused = rows[contended]
        assert float(grants) > 0 and 0 <= float(fewest) <= 1 and float(refused) >= 0
    tooz = table_rows(output, "tooz (etcd3gw driver)", "tooz (etcd3gw driver) hand-off (polls)")
    if importlib.util.find_spec("tooz") and importlib.util.find_spec("etcd3gw"):
        # Installed (the bench extra): the peer must have run, not been reported missing.
        assert tooz["tooz (etcd3gw driver)"][-1].endswith("x"), output
        assert float(tooz["tooz (etcd3gw driver) hand-off (polls)"][0]) > 0, output
    else:
        assert tooz["tooz (etcd3gw driver)"][:2] == ["not", "run:"], output


def test_etcd_election_prints_a_row_per_ttl() -> None:
    require_etcd_binary()
    output = run_benchmark("etcd_election", "--ttls", "2", "--trials", "1")
    lost, _slash, trials = table_rows(output, "2")["2"][0].partition("/")
    assert trials == "1" and lost in ("0", "1")
