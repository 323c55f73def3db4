"""The pure rules of the cluster source: which rows are whose (never guessed), the address
vast.ai gives an instance's Curio, and the verdict on what it delivered."""

from __future__ import annotations

from vast_manager.agent.phases.proving import curio_listen
from vast_manager.coordinator.decisions.attribution import (
    Claim,
    Matched,
    Tally,
    Unattributable,
    attribute,
    listed_address,
    node_name,
)
from vast_manager.coordinator.decisions.cluster_verdict import CLUSTER, CUZK, Delivered, judge


def test_rows_are_matched_by_node_name_and_by_the_given_address() -> None:
    claims = [Claim(1, node_name(1), "203.0.113.1:40001"), Claim(2, node_name(2)),
              Claim(3, node_name(3))]
    machines = [("vm-1", "10.0.0.5:12300"), ("vm-2", "198.51.100.2:40002")]
    tallies = {"10.0.0.5:12300": Tally(5, 1, "old", 10.0),
               "203.0.113.1:40001": Tally(3, 1, "new", 20.0),
               "198.51.100.2:40002": Tally(7), "192.0.2.9:12300": Tally(4)}
    found = attribute(claims, machines, tallies)
    one = found.instances[1]
    assert isinstance(one, Matched) and one.tally == Tally(8, 2, "new", 20.0)
    assert found.instances[2] == Matched(("198.51.100.2:40002",), Tally(7))
    assert 3 not in found.instances  # its node never registered: nothing to judge it by
    assert found.unclaimed == {"192.0.2.9:12300": Tally(4)}


def test_an_address_two_instances_claim_is_nobodys() -> None:
    claims = [Claim(1, "vm-1"), Claim(2, "vm-2"), Claim(3, "vm-3", "172.17.0.2:12300")]
    machines = [("vm-1", "172.17.0.2:12300"), ("vm-2", "172.17.0.2:12300"),
                ("vm-3", "10.1.1.1:1")]
    found = attribute(claims, machines, {"172.17.0.2:12300": Tally(9)})
    for ident in (1, 2, 3):
        got = found.instances[ident]
        assert isinstance(got, Unattributable) and "172.17.0.2:12300" in got.reason
    assert "instances 2, 3" in found.instances[1].reason  # type: ignore[union-attr]
    assert found.unclaimed == {}


def test_the_listed_address_is_public_ip_and_mapped_port() -> None:
    listed = {"public_ipaddr": "203.0.113.4", "ports": {"12300/tcp": [{"HostPort": "41230"}],
                                                        "22/tcp": [{"HostPort": "40022"}]}}
    assert listed_address(listed) == "203.0.113.4:41230"
    assert listed_address({"public_ipaddr": "203.0.113.4", "ports": {}}) is None
    assert listed_address({"ports": listed["ports"]}) is None
    assert listed_address({"public_ipaddr": "1.2.3.4", "ports": {"12300/tcp": "x"}}) is None
    # The agent has Curio listen on that port (every interface: it binds what it is
    # given), unless the operator set CURIO_LISTEN.
    env = {"PUBLIC_IPADDR": "203.0.113.4", "VAST_TCP_PORT_12300": "41230"}
    assert curio_listen(env) == "0.0.0.0:41230"
    assert curio_listen({**env, "CURIO_LISTEN": "10.0.0.1:12300"}) is None
    assert curio_listen({"PUBLIC_IPADDR": "203.0.113.4"}) is None


RULES = {"window_s": 3600.0, "min_rate": 50.0, "benchmark_rate": 100.0, "tolerance": 0.05,
         "failures_flag": 3}


def test_the_verdict_reads_only_the_cluster_and_only_after_half_a_window() -> None:
    low = Delivered(10, 0, 3600.0, CLUSTER)
    assert judge(low, proving_s=1700.0, **RULES).terminate is None  # too early
    ended = judge(low, proving_s=1800.0, **RULES)
    assert ended.terminate is not None and "delivered 10.0/h" in ended.terminate
    assert "below_claimed" in ended.flags
    # The agent's own counter is the host's claim: never a reason here.
    assert judge(Delivered(0, 0, 3600.0, CUZK), proving_s=9999.0, **RULES).terminate is None
    honest = judge(Delivered(97, 0, 3600.0, CLUSTER), proving_s=3600.0, **RULES)
    assert honest.terminate is None and honest.flags == {}


def test_repeated_failures_are_flagged_with_the_clusters_error() -> None:
    seen = Delivered(90, 3, 3600.0, CLUSTER, "error: serialization failure")
    verdict = judge(seen, proving_s=3600.0, **RULES)
    assert verdict.terminate is None
    assert "serialization failure" in verdict.flags["task_failures"]
    assert "task_failures" not in judge(Delivered(90, 2, 3600.0, CLUSTER), proving_s=3600.0,
                                        **RULES).flags


def test_a_round_where_none_of_ours_delivered_ends_nobody() -> None:
    """A drought in the cluster's work (or its rows not reaching us) is no host's doing."""
    from vast_manager.coordinator.curio_db import ClusterRows
    from vast_manager.coordinator.operations.cluster import ClusterWatch
    from vast_manager.coordinator.settings import DEFAULTS

    settings = DEFAULTS.with_values(curio_db_url="postgresql://r@127.0.0.1:1/x")
    watch = ClusterWatch(settings, lambda: 10_000.0)
    rows = [{"id": i, "state": "proving", "state_since": 0.0, "rate_per_hour": 100.0,
             "min_rate_per_hour": 50.0, "dph_total": 0.5} for i in (1, 2)]
    machines = (("vm-1", "10.0.0.1:1"), ("vm-2", "10.0.0.2:1"))
    watch.latest = ClusterRows(0.0, machines, {})
    dry = watch.assess(rows, {}, 10_000.0)
    assert all(j.terminate is None for j in dry.judgements.values())
    assert dry.views[1]["delivered_rate_per_hour"] == 0.0
    watch.latest = ClusterRows(0.0, machines, {"10.0.0.2:1": Tally(90)})
    fed = watch.assess(rows, {}, 10_000.0)
    assert fed.judgements[1].terminate is not None and fed.judgements[2].terminate is None
