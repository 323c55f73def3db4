"""The agent's phases are composed, not inherited: each is a class of its own, given the
context and the phases it uses, and none reads another's private state; the loop's
``Orders`` take directives only where docs/policy.md says."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import vast_manager.agent.lifecycle as lifecycle
from vast_manager.agent.phases.benchmark import Benchmarking
from vast_manager.agent.phases.context import AgentContext, Orders
from vast_manager.agent.phases.ending import Ending
from vast_manager.agent.phases.fetch import Fetching
from vast_manager.agent.phases.proving import Proving
from vast_manager.agent.phases.reporting import Reporting
from vast_manager.agent.phases.warmup import Warming
from vast_manager.protocol import Directive

AGENT = Path(lifecycle.__file__).parent
SOURCES = [*sorted((AGENT / "phases").glob("*.py")), AGENT / "lifecycle.py"]
PHASES = [Reporting, Fetching, Warming, Proving, Benchmarking, Ending]
#: The only bases a class of the phases may have: none of them is a phase.
ALLOWED_BASES = {"Exception", "Protocol"}


def _classes(path: Path) -> list[ast.ClassDef]:
    return [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)]


def test_no_class_of_the_phases_or_the_loop_inherits_another() -> None:
    found = {
        f"{path.name}:{cls.name}": [ast.unparse(b) for b in cls.bases]
        for path in SOURCES for cls in _classes(path)
    }
    assert "lifecycle.py:Agent" in found and len(found) >= len(PHASES) + 3
    inherited = {name: bases for name, bases in found.items()
                 if set(bases) - ALLOWED_BASES}
    assert inherited == {}


def test_nothing_reads_another_objects_private_state() -> None:
    """``x._name`` only on ``self``: a phase uses another's public methods and fields."""
    reaches = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__")
                    and not (isinstance(node.value, ast.Name) and node.value.id == "self")):
                reaches.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    assert reaches == []


@pytest.mark.parametrize("phase", PHASES, ids=lambda p: p.__name__)
def test_each_phase_is_given_the_context_and_typed_dependencies(phase: type) -> None:
    params = list(inspect.signature(phase.__init__).parameters.values())[1:]
    assert params[0].name == "ctx" and params[0].annotation == "AgentContext"
    assert all(p.annotation is not inspect.Parameter.empty for p in params)


def _directive(action: str, benchmark_id: str | None = None) -> Directive:
    return Directive(action, "test", 30.0, None, benchmark_id)  # type: ignore[arg-type]


async def test_orders_take_benchmark_only_while_proving_or_failed() -> None:
    orders = Orders()
    for plan in ("hello", "prepare", "benchmark"):
        orders.plan = plan
        orders.obey(_directive("benchmark", "b1"), "benchmarking")
        assert not orders.rebenchmark and not orders.wake.is_set()
        assert not orders.interrupts(plan)
    assert orders.benchmark_id == "b1"
    for plan in ("prove", "failed"):
        orders = Orders()
        orders.plan = plan
        orders.obey(_directive("benchmark"), "proving")
        assert orders.rebenchmark and orders.wake.is_set() and orders.interrupts(plan)
        assert orders.benchmark_id is None


async def test_orders_terminate_orphan_and_signal_interrupt_every_plan() -> None:
    for interrupt in ("terminate", "orphan", "signal"):
        orders = Orders()
        orders.obey(_directive("continue"), "booting")
        assert not orders.wake.is_set() and not orders.interrupts("prove")
        if interrupt == "terminate":
            orders.obey(_directive("terminate"), "proving")
        elif interrupt == "orphan":
            orders.orphan()
        else:
            orders.stop(15)
        assert orders.wake.is_set()
        assert all(orders.interrupts(p) for p in ("hello", "prepare", "benchmark", "prove"))


async def test_set_phase_wakes_the_heartbeats_only_on_a_change(tmp_path: Path) -> None:
    from vast_manager.agent.config import load_config
    from vast_manager.agent.coordinator_client import CoordinatorClient

    config = load_config({
        "VM_COORDINATOR_URL": "http://127.0.0.1:9", "VM_AGENT_ID": "ag_" + "0" * 20,
        "VM_AGENT_KEY": "ab" * 32, "VM_STATE_DIR": str(tmp_path / "state"),
    })
    client = CoordinatorClient(config.coordinator_url, config.agent_id, config.agent_key)
    try:
        ctx = AgentContext(config, client, lambda: 0.0)
        ctx.set_phase("booting")
        assert not ctx.phase_changed.is_set()
        ctx.set_phase("warming")
        assert ctx.phase == "warming" and ctx.phase_changed.is_set()
    finally:
        await client.close()
