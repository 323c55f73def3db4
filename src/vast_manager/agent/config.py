"""The agent's settings, each declared once: a field of ``AgentConfig`` (or, for the
simulation's, of ``SimSettings``).

A field's type, default and ``msgspec.Meta`` (help text, bounds, and in ``extra`` its
``VM_*`` variable and any reader of its own) are the whole declaration; ``SETTINGS`` is read
off it (``vast_manager.common.settings_table``) and drives the parsing (``load_config``),
the ``vast-agent run --help`` text and docs/architecture.md's table (``settings_markdown``;
a test keeps the two in step). Errors name the variable, never a secret's value.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import msgspec
from msgspec import Meta

from vast_manager.common import settings_table
from vast_manager.protocol.signing import is_agent_id

VAST_URL = "https://console.vast.ai"


class ConfigError(ValueError):
    """A setting is missing or malformed; the message names the variable, never its value."""


def _env(name: str, **extra: Any) -> dict[str, Any]:
    """``Meta(extra=...)`` of a setting: its variable, and how its text is read when not by
    its type (``parse``), or which word means its None default (``shown``)."""
    return {"env": name, **extra}


# --- readers of the settings whose text is more than a number or a word ------------------


def _url(name: str, value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        # The URL is not a secret, but it may embed credentials: do not echo it.
        raise ConfigError(f"{name} must be an http:// or https:// URL")
    return value.rstrip("/")


def _agent_id(name: str, value: str) -> str:
    if not is_agent_id(value):
        raise ConfigError(f"{name} must be 'ag_' followed by 20 lowercase hex characters")
    return value


def _key(name: str, value: str) -> bytes:
    try:
        key = bytes.fromhex(value)
    except ValueError:
        key = b""
    if len(key) != 32:
        raise ConfigError(f"{name} must be 64 hexadecimal characters")
    return key


def _upper(name: str, value: str) -> str:
    return value.upper()


# config.rs parse_size: whole numbers of GiB, MiB, GB or MB, or plain bytes; anything
# else it silently reads as 50 GiB, so the agent refuses it instead.
_SIZE_RE = re.compile(r"^[0-9]+(GiB|MiB|GB|MB)?$")


def _budget(name: str, value: str) -> str:
    if not _SIZE_RE.match(value) or not value.rstrip("GiBM") or int(value.rstrip("GiBM")) == 0:
        raise ConfigError(
            f"{name} must be auto or a whole size such as 200GiB, 204800MiB or bytes, got {value!r}"
        )
    return value


class AgentConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Every agent setting, declared once: type, default, and a ``Meta`` with the help
    text, the bounds and the variable (``extra``). No default: required."""

    coordinator_url: Annotated[str, Meta(
        description="base URL of the coordinator (required)",
        extra=_env("VM_COORDINATOR_URL", parse=_url))]
    agent_id: Annotated[str, Meta(
        description="`ag_` + 20 hex (required)", extra=_env("VM_AGENT_ID", parse=_agent_id))]
    agent_key: Annotated[bytes, Meta(
        description="64 hex characters (required)", extra=_env("VM_AGENT_KEY", parse=_key))]
    state_dir: Annotated[Path, Meta(
        description="agent state: spool, cuzk.toml, logs",
        extra=_env("VM_STATE_DIR"))] = Path("/var/lib/vast-agent")
    params_dir: Annotated[Path, Meta(
        description="proof parameter cache (`FIL_PROOFS_PARAMETER_CACHE`)",
        extra=_env("VM_PARAMS_DIR"))] = Path("/var/tmp/filecoin-proof-parameters")
    params_cmd: Annotated[str | None, Meta(
        description="command that fetches parameters (e.g. `curio fetch-params 32`); unset: "
        "built-in downloader",
        extra=_env("VM_PARAMS_CMD"))] = None
    params_manifest: Annotated[str | None, Meta(
        description="built-in downloader manifest (path or URL; JSON list of `{name, url, "
        "size, sha256}`); unset: nothing to fetch",
        extra=_env("VM_PARAMS_MANIFEST"))] = None
    cuzk_bin: Annotated[str, Meta(
        description="the cuzk daemon executable", extra=_env("VM_CUZK_BIN"))] = "cuzk"
    cuzk_bench_bin: Annotated[str, Meta(
        description="the cuzk-bench executable", extra=_env("VM_CUZK_BENCH_BIN"))] = "cuzk-bench"
    c1_path: Annotated[Path, Meta(
        description="the C1 output fed to `cuzk-bench batch --c1`: Curio's wrapper JSON "
        "(`SectorNum`, `Phase1Out`, `SectorSize`; docs/cuzk.md), checked before anything is "
        "fetched or proved (a wrong one: the instance fails, naming the file); its `SectorNum` "
        "is passed as `--sector-num`",
        extra=_env("VM_C1_PATH"))] = Path("/data/zk/c1.json")
    c1_miner_id: Annotated[int, Meta(
        ge=0,
        description="the miner (actor id) the C1 was made for, passed as `--miner-id`; a wrong "
        "one fails the warm-up proof's self-check",
        extra=_env("VM_C1_MINER_ID"))] = 1000
    bench_proofs: Annotated[int, Meta(
        ge=1, description="`-c/--count` of the benchmark", extra=_env("VM_BENCH_PROOFS"))] = 12
    bench_concurrency: Annotated[Annotated[int, Meta(ge=1)] | None, Meta(
        description="`-j/--concurrency` of the benchmark: `auto` (2 per GPU in the run, so "
        "every GPU stays fed) or a number",
        extra=_env("VM_BENCH_CONCURRENCY", shown="auto"))] = None
    work_cmd: Annotated[str | None, Meta(
        description="the operator's work command while proving; unset: the daemon idles, ready",
        extra=_env("VM_WORK_CMD"))] = None
    orphan_timeout_s: Annotated[float, Meta(
        gt=0, description="seconds without a verified answer before self-destroy",
        extra=_env("VM_ORPHAN_TIMEOUT"))] = 1800.0
    nvml: Annotated[Literal["auto", "real", "sim", "off"], Meta(
        description="`auto` (real NVML if it loads), `real`, `sim` (fake NVML + host fed by "
        "the simulation: run by `vm-sim-agent`), `off`",
        extra=_env("VM_NVML"))] = "auto"
    sample_interval_s: Annotated[float, Meta(
        gt=0, description="sampler period, seconds", extra=_env("VM_SAMPLE_INTERVAL"))] = 1.0
    provider: Annotated[Literal["vast", "local"] | None, Meta(
        description="`vast` (self-destroy through the REST API) or `local` (exit); unset: "
        "`vast` when `CONTAINER_ID` is set, else `local`",
        extra=_env("VM_PROVIDER"))] = None
    cuzk_start_timeout_s: Annotated[float, Meta(
        gt=0, description="seconds the cuzk daemon may take to answer `GET /status` after it "
        "starts",
        extra=_env("VM_CUZK_START_TIMEOUT"))] = 900.0
    pce_wait_s: Annotated[float, Meta(
        ge=0,
        description="seconds the daemon may take, after the warm-up proof, to finish its "
        "background PCE extraction (`/status` `allocations.pce` lists `porep-32g`); the "
        "benchmark then runs in the same daemon process; longer fails the instance; 0: do not "
        "wait",
        extra=_env("VM_PCE_WAIT"))] = 900.0
    memory_budget: Annotated[str | None, Meta(
        description="cuzk's `[memory] total_budget`: `auto` = the memory this container may "
        "use (cgroup v2 `memory.max` / v1 `memory.limit_in_bytes`, or MemTotal, the smaller) "
        "less cuzk's 5 GiB safety margin; or a whole size such as `200GiB`. A budget that "
        "cannot hold one 14 GiB partition beside the SRS fails the instance (cuzk would wait "
        "for ever)",
        extra=_env("VM_CUZK_MEMORY_BUDGET", parse=_budget, shown="auto"))] = None
    spool_max_bytes: Annotated[int, Meta(
        ge=1_048_576,
        description="spool bound (results and log batches waiting for a verified `200`); the "
        "oldest log batches are dropped first, never a result",
        extra=_env("VM_SPOOL_MAX_BYTES"))] = 67108864
    ack_retention_s: Annotated[float, Meta(
        ge=0,
        description="seconds results and log batches are kept after the coordinator "
        "acknowledged them, to send again to a coordinator restored from its replica "
        "(docs/protocol.md, \"Replay\"); 0 (no replay) or at least the orphan timeout, so a "
        "coordinator restored within it finds them",
        extra=_env("VM_ACK_RETENTION"))] = 7200.0
    log_level: Annotated[Literal["DEBUG", "INFO", "WARNING", "ERROR"], Meta(
        description="the agent's own log level (`DEBUG` also echoes child output to stderr)",
        extra=_env("VM_LOG_LEVEL", parse=_upper))] = "INFO"
    # Set by vast.ai inside an instance (docs/vast.md): not settings of the agent's own.
    container_id: str | None = None
    container_api_key: str | None = None
    vast_url: str = VAST_URL

    def __repr__(self) -> str:  # never print the key (logs, tracebacks)
        return f"AgentConfig(agent_id={self.agent_id!r}, coordinator_url={self.coordinator_url!r})"

    def secrets(self) -> list[str]:
        """Values that must never leave the agent in a log line."""
        out = [self.agent_key.hex()]
        if self.container_api_key:
            out.append(self.container_api_key)
        return out


class SimSettings(msgspec.Struct, frozen=True, kw_only=True):
    """The simulation's settings of an agent's environment (read by ``vast_manager.sim``,
    declared here so the agent's table lists them)."""

    profile: Annotated[str | None, Meta(
        description="simulation: the offer JSON of the simulated machine (read by the "
        "simulator)",
        extra=_env("VM_SIM_PROFILE"))] = None
    time_scale: Annotated[float, Meta(
        description="simulation: simulated seconds per real second (read by the simulator)",
        extra=_env("VM_SIM_TIME_SCALE"))] = 1.0
    state_file: Annotated[str | None, Meta(
        description="simulation: the live hardware state file (read by the simulator)",
        extra=_env("VM_SIM_STATE_FILE"))] = None
    budget_block_timeout_s: Annotated[float, Meta(
        description="simulation: simulated seconds a proof may wait for memory budget "
        "nothing will free before the simulated daemon fails it (the real one waits for ever)",
        extra=_env("VM_SIM_BUDGET_BLOCK_TIMEOUT"))] = 1800.0


def _env_name(name: str, extra: Mapping[str, Any]) -> str:
    return str(extra["env"])


#: Fields vast.ai sets (``CONTAINER_ID``...), not settings.
VAST_FIELDS = ("container_id", "container_api_key", "vast_url")
Setting = settings_table.Declared
SETTINGS: tuple[Setting, ...] = (
    settings_table.declared(AgentConfig, _env_name, VAST_FIELDS)
    + settings_table.declared(SimSettings, _env_name)
)
_AGENT_SETTINGS = SETTINGS[: len(SETTINGS) - len(msgspec.structs.fields(SimSettings))]
#: By variable (``VM_STATE_DIR``).
SETTINGS_BY_NAME: dict[str, Setting] = {s.env: s for s in SETTINGS}
SIM_DEFAULTS = SimSettings()
#: ``VM_BENCH_PROOFS``'s default, for the coordinator's estimates of a benchmark.
BENCH_PROOFS: int = SETTINGS_BY_NAME["VM_BENCH_PROOFS"].default

_KIND_WORDS = {int: "a whole number", float: "a number"}


def _value(row: Setting, env: Mapping[str, str]) -> Any:
    """One setting from ``env``: its default when unset (required: none), else its text
    read by the row's reader or type, then checked against its bounds."""
    text = (env.get(row.env) or "").strip()
    if not text or text == row.extra.get("shown"):
        if row.default is None and not row.optional:
            raise ConfigError(f"{row.env} is required but not set")
        return row.default
    parse = row.extra.get("parse")
    if parse is not None:
        value = parse(row.env, text)
    elif row.kind in (int, float):
        try:
            value = row.kind(text)
        except ValueError:
            raise ConfigError(
                f"{row.env} must be {_KIND_WORDS[row.kind]}, got {text!r}") from None
    else:
        value = row.kind(text)  # str or Path
    settings_table.check(row, value, ConfigError)
    return value


def load_config(environ: Mapping[str, str] | None = None) -> AgentConfig:
    """Parse the agent's settings from ``environ`` (default: the process environment)."""
    env = os.environ if environ is None else environ
    values = {row.name: _value(row, env) for row in _AGENT_SETTINGS}
    container_id = (env.get("CONTAINER_ID") or "").strip() or None
    if values["provider"] is None:
        values["provider"] = "vast" if container_id else "local"
    if values["provider"] == "vast" and not container_id:
        raise ConfigError("VM_PROVIDER is 'vast' but CONTAINER_ID is not set")
    # A coordinator restored within the orphan timeout asks for what it lost; a shorter
    # retention would have forgotten results it acknowledged (docs/protocol.md, "Replay").
    # 0 is the operator's explicit "no replay".
    if 0 < values["ack_retention_s"] < values["orphan_timeout_s"]:
        raise ConfigError(
            f"VM_ACK_RETENTION ({values['ack_retention_s']:g} s) must be 0 or at least "
            f"VM_ORPHAN_TIMEOUT ({values['orphan_timeout_s']:g} s)")
    return AgentConfig(
        **values,
        container_id=container_id,
        container_api_key=(env.get("CONTAINER_API_KEY") or "").strip() or None,
        vast_url=_url("VAST_URL", (env.get("VAST_URL") or "").strip() or VAST_URL),
    )


def settings_help() -> str:
    """The settings table as plain text, for ``vast-agent run --help``."""
    return settings_table.help_text(SETTINGS)


def settings_markdown() -> str:
    """The table of docs/architecture.md's agent configuration (a test keeps it in step)."""
    return settings_table.markdown(SETTINGS)
