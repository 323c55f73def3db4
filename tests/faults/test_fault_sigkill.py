"""Real processes, the simulated fleet, the coordinator SIGKILLed
several times under load and restarted on the same database.

``vast-manager serve --provider local`` runs as its own process; the operator API deploys
the whole local catalog (9 real agents on the simulated cuzk). Once every agent is past
its parameter download (the local provider's file server dies with the coordinator) and one
is proving, each round asks every proving instance to benchmark again (new results in flight), then
SIGKILLs the coordinator mid-flight and restarts it on the same port and database. The
agents survive (their own sessions), retry with backoff and replay their spools.
Afterwards every result an agent produced is stored exactly once, every result it saw
acknowledged is stored, and no spool holds a result.
"""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from vast_manager.coordinator.providers.local.catalog import local_offers

from support.fault_support import (
    TEST_MARKER_ENV,
    CoordinatorProcess,
    admin_call,
    audit_results,
    fleet_settled,
    gone_instances,
    kill_marked,
    process_env,
    spooled_results,
    wait_until,
)

KILLS = 4


def listing(coord: CoordinatorProcess) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    return (admin_call(coord.url, "GET", "/api/instances"),
            admin_call(coord.url, "GET", "/api/scaling"))


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_sigkill_under_load_every_result_stored_exactly_once(tmp_path: Path) -> None:
    rng = random.Random(20240605)
    env = process_env(tmp_path, VM_NEXT_HEARTBEAT_S="1", VM_MONITOR_INTERVAL_S="1",
                      VM_TERMINATE_GRACE_S="3")
    coord = CoordinatorProcess(tmp_path, env, provider="local")
    instances_dir = tmp_path / "local-instances"
    try:
        coord.start()
        for o in local_offers():
            admin_call(coord.url, "POST", "/api/deploy", {"offer_id": o["id"]})

        def past_params() -> bool:
            instances = listing(coord)[0]
            # The first round needs a proving instance to ask for a new benchmark.
            return any(i["phase"] == "proving" and i["state"] not in (
                "terminating", "destroyed", "failed") for i in instances) and all(
                i["state"] in ("destroyed", "terminating")
                or i["phase"] in ("benchmarking", "proving") for i in instances)

        wait_until(past_params, "every agent past its parameter download, one proving",
                   240, poll_s=0.5)
        rebenchmarks = 0
        for _ in range(KILLS):
            for inst in listing(coord)[0]:
                if inst["phase"] == "proving" and inst["state"] not in (
                        "terminating", "destroyed", "failed"):
                    admin_call(coord.url, "POST", f"/api/instances/{inst['id']}/rebenchmark")
                    rebenchmarks += 1
            # Let results get under way, then kill mid-flight.
            time.sleep(rng.uniform(1.0, 4.0))
            coord.kill(signal.SIGKILL)
            time.sleep(rng.uniform(0.5, 2.5))  # agents retry against a dead port meanwhile
            coord.start()
        assert coord.starts == KILLS + 1
        assert rebenchmarks > 0

        def done() -> bool:
            instances, scaling = listing(coord)
            return fleet_settled(instances, scaling) and not spooled_results(
                instances_dir, instances)

        wait_until(done, "the fleet to settle with every live spool empty", 240, poll_s=1.0)
        totals = audit_results(instances_dir, coord.db_path,
                               gone_instances(listing(coord)[0]))
        retries = sum(p.read_text(errors="replace").count("; retry ")
                      for p in instances_dir.glob("instance-*/agent.log"))
        print(f"SIGKILL x{KILLS}: {totals}; {rebenchmarks} rebenchmarks; "
              f"{retries} agent retries")
        assert totals["agents"] == len(local_offers())
        assert totals["produced"] > totals["agents"], "the rebenchmarks produced more results"
        assert retries > 0, "the agents saw the coordinator die"
    finally:
        coord.kill(signal.SIGKILL)
        left = kill_marked(env[TEST_MARKER_ENV])
        print(f"cleaned up {len(left)} agent processes")
    # The marker reached the agents (else they would outlive the test, unfound).
    assert left, "no marked agent process was found to clean up"
