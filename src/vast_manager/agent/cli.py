"""`vast-agent`: the agent's command line (runs on each rented instance)."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from typing import Any, NoReturn

import click

from vast_manager.agent.config import ConfigError, load_config, settings_help
from vast_manager.agent.lifecycle import (
    EXIT_CONFIG,
    EXIT_DESTROY_FAILED,
    EXIT_FAILED,
    EXIT_ORPHANED,
    EXIT_TERMINATED,
    Agent,
    state_dir_writable,
)
from vast_manager.agent.sampler import SIM_ONLY

RUN_HELP = f"""Run the agent: hello, fetch parameters, warm cuzk, benchmark, report, then
keep proving or terminate, as the coordinator directs. Configured from the
environment only.

\b
Exit status:
  {EXIT_TERMINATED}    terminated on the coordinator's directive; instance destroyed
  {EXIT_FAILED}    failed (reported as phase `failed`, then terminated), or crashed
  {EXIT_CONFIG}    bad configuration (the message names the variable)
  {EXIT_ORPHANED}    orphan rule: no coordinator for VM_ORPHAN_TIMEOUT; instance destroyed
  {EXIT_DESTROY_FAILED}    self-destroy failed: the instance survives (vast.ai refused the key
       or the destroy, or still listed it after every attempt)
  130  stopped by SIGINT; 143 stopped by SIGTERM (children stopped, no self-destroy)

\b
Environment:
""" + "\n".join("  " + line for line in settings_help().splitlines())


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 120})
def cli() -> None:
    """vast-agent: the program each rented GPU instance runs for vast-manager."""


async def _run_agent(agent: Agent) -> int:
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, agent.request_stop, int(signum))
    try:
        return await agent.run()
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)


def run(**seams: Any) -> NoReturn:
    """``vast-agent run``: the agent configured from the environment, on ``seams`` (the
    ``Agent``'s: the simulator plugs its sampler and memory probe in here); exits with
    the agent's status."""
    try:
        config = load_config()
    except ConfigError as exc:
        click.echo(f"vast-agent: {exc}", err=True)
        sys.exit(EXIT_CONFIG)
    if config.nvml == "sim" and "sampler_factory" not in seams:
        click.echo(f"vast-agent: {SIM_ONLY}", err=True)
        sys.exit(EXIT_CONFIG)
    logging.basicConfig(
        level=getattr(logging, config.log_level),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        state_dir_writable(config.state_dir)
    except OSError as exc:
        click.echo(f"vast-agent: VM_STATE_DIR cannot be used: {exc.strerror}", err=True)
        sys.exit(EXIT_CONFIG)
    try:
        code = asyncio.run(_run_agent(Agent(config, **seams)))
    except Exception:
        logging.getLogger("vast_manager.agent").exception("the agent crashed")
        code = EXIT_FAILED
    sys.exit(code)


@cli.command("run", help=RUN_HELP)
def run_command() -> None:
    run()


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
