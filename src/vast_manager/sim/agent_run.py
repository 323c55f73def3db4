"""`vm-sim-agent run`: the real agent on the simulated machine (``VM_NVML=sim``).

The agent never imports the simulation: this entry point runs the agent's own ``run``
with the simulator's fake NVML and host probe plugged into the seams ``Agent`` has
(``sampler_factory``, ``memory_probe``), both fed by ``VM_SIM_PROFILE`` and
``VM_SIM_STATE_FILE`` (docs/architecture.md). The local provider and the tests start
agents this way; everything else the agent does is its own.
"""

from __future__ import annotations

import click

from vast_manager.agent import cli as agent_cli
from vast_manager.agent.config import AgentConfig
from vast_manager.agent.gpu import Nvml, open_devices
from vast_manager.agent.host import MemoryLimit
from vast_manager.agent.phases.shared import SamplerLike
from vast_manager.agent.sampler import Sampler, Sources, describe_host
from vast_manager.protocol.messages import HostInfo
from vast_manager.sim.fake_host import FakeHostProbe
from vast_manager.sim.fake_nvml import FakeNvml


def sim_sources(params_dir: str, environ: dict[str, str] | None = None) -> Sources:
    """The sampler's sources on the simulated machine: the fake NVML and the fake host
    probe, reading the same live state."""
    fake = FakeNvml(environ=environ)
    nvml = Nvml(fake)
    host = FakeHostProbe(params_dir, reader=fake.reader)
    return Sources("sim", host, nvml, open_devices(nvml), nvml.unavailable_reason)


def sim_sampler_factory(config: AgentConfig) -> tuple[HostInfo, SamplerLike]:
    """The agent's sampler on the simulated machine (``Agent``'s ``sampler_factory``)."""
    sources = sim_sources(str(config.params_dir))
    sampler: SamplerLike = Sampler(sources, interval_s=config.sample_interval_s)
    return describe_host(sources), sampler


def sim_memory_probe(config: AgentConfig) -> MemoryLimit:
    """The memory the simulated container may use (``Agent``'s ``memory_probe``)."""
    return FakeHostProbe(str(config.params_dir)).memory_limit()


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 120})
def cli() -> None:
    """vm-sim-agent: vast-agent on the simulated machine (VM_NVML=sim)."""


@cli.command("run", help=agent_cli.RUN_HELP)
def run_command() -> None:
    agent_cli.run(sampler_factory=sim_sampler_factory, memory_probe=sim_memory_probe)


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
