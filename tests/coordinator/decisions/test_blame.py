"""Whose fault a failed trial is (``decisions.blame``; docs/policy.md, "Blame")."""

from __future__ import annotations

from vast_manager.coordinator.decisions import blame
from vast_manager.coordinator.decisions.blame import Failure, Fault

C1 = ("the agent reported failed: C1 file /data/zk/c1.json cannot be read ([Errno 2] No such "
      "file or directory); no benchmark was started")
WARMUP_TIMEOUT = "warm-up timed out after 1200 s"


def test_one_hardware_failure_on_one_machine_is_the_hosts() -> None:
    judged = blame.judge(Failure("41001", WARMUP_TIMEOUT, blame.TIMEOUT, "warming", 100.0), [])
    assert judged.fault is Fault.HOST and not judged.fleet_wide and judged.fix == ""


def test_an_input_check_before_the_hardware_is_the_operators_and_names_the_fix() -> None:
    judged = blame.judge(Failure("41001", C1, blame.AGENT_FAILED, "booting", 100.0), [])
    assert judged.fault is Fault.OPERATOR and judged.fleet_wide
    assert "before the hardware was touched" in judged.cause and "c1.json" in judged.cause
    assert "VM_C1_PATH" in judged.fix


def test_the_same_failure_on_two_machines_is_the_setups_whatever_the_numbers() -> None:
    earlier = Failure("41001", "warm-up timed out after 1200 s", blame.TIMEOUT, "warming", 0.0)
    judged = blame.judge(Failure("41002", "warm-up timed out after 1201 s", blame.TIMEOUT,
                                 "warming", 600.0), [earlier])
    assert judged.fault is Fault.OPERATOR and judged.fleet_wide
    assert judged.machines == ("41001", "41002")
    assert "2 machines (41001, 41002)" in judged.cause


def test_the_same_failure_twice_on_one_machine_stays_the_hosts() -> None:
    earlier = Failure("41001", WARMUP_TIMEOUT, blame.TIMEOUT, "warming", 0.0)
    judged = blame.judge(Failure("41001", WARMUP_TIMEOUT, blame.TIMEOUT, "warming", 60.0),
                         [earlier])
    assert judged.fault is Fault.HOST


def test_an_old_failure_elsewhere_is_not_the_same_failure_again() -> None:
    earlier = Failure("41001", WARMUP_TIMEOUT, blame.TIMEOUT, "warming", 0.0)
    judged = blame.judge(Failure("41002", WARMUP_TIMEOUT, blame.TIMEOUT, "warming",
                                 blame.FLEET_WINDOW_S + 1), [earlier])
    assert judged.fault is Fault.HOST


def test_a_dead_status_on_several_machines_is_vast_ai_unless_it_names_the_image() -> None:
    dead = "vast.ai status exited, seen in 2 rounds in a row"
    judged = blame.judge(Failure("41002", dead, blame.DEAD_STATUS, "deploying", 10.0),
                         [Failure("41001", "vast.ai status exited, seen in 3 rounds in a row",
                                  blame.DEAD_STATUS, "deploying", 0.0)])
    assert judged.fault is Fault.VAST and judged.fleet_wide
    image = "status created: OCI runtime create failed: pull access denied"
    judged = blame.judge(Failure("41002", image, blame.DEAD_STATUS, "deploying", 10.0),
                         [Failure("41001", image, blame.DEAD_STATUS, "deploying", 0.0)])
    assert judged.fault is Fault.OPERATOR and "VM_VAST_IMAGE" in judged.fix


def test_signatures_drop_what_varies_per_instance() -> None:
    assert blame.signature("Timed out after 900 s") == blame.signature("timed  out after 901.5 s")
    assert blame.signature("C1 file /a/c1.json") != blame.signature("C1 file /b/c1.json")
