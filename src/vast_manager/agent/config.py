"""The agent's settings: one table of ``VM_*`` environment variables, parsed into ``AgentConfig``.

The table (``SETTINGS``) is the single source for defaults, bounds (keyword fields
of the row, checked by ``vast_manager.common.settings_table``), parsing, the
``vast-agent run --help`` text and docs/architecture.md's table (``settings_markdown``;
a test keeps the two in step). Errors name the variable, never a secret's value.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

from vast_manager.common import settings_table
from vast_manager.protocol.signing import is_agent_id

T = TypeVar("T")

NVML_MODES = ("auto", "real", "sim", "off")
PROVIDERS = ("vast", "local")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


@dataclass(frozen=True)
class Setting(settings_table.Bounds):
    """One row: ``Setting(name, default, help)``, bounds of the parsed value by keyword."""

    name: str
    default: str | None  # None: unset (required, or optional with a documented meaning)
    help: str

    @property
    def env(self) -> str:
        return self.name


SETTINGS: tuple[Setting, ...] = (
    Setting("VM_COORDINATOR_URL", None, "base URL of the coordinator (required)"),
    Setting("VM_AGENT_ID", None, "`ag_` + 20 hex (required)"),
    Setting("VM_AGENT_KEY", None, "64 hex characters (required)"),
    Setting("VM_STATE_DIR", "/var/lib/vast-agent", "agent state: spool, cuzk.toml, logs"),
    Setting(
        "VM_PARAMS_DIR",
        "/var/tmp/filecoin-proof-parameters",
        "proof parameter cache (`FIL_PROOFS_PARAMETER_CACHE`)",
    ),
    Setting(
        "VM_PARAMS_CMD",
        None,
        "command that fetches parameters (e.g. `curio fetch-params 32`); unset: built-in "
        "downloader",
    ),
    Setting(
        "VM_PARAMS_MANIFEST",
        None,
        "built-in downloader manifest (path or URL; JSON list of `{name, url, size, sha256}`); "
        "unset: nothing to fetch",
    ),
    Setting("VM_CUZK_BIN", "cuzk", "the cuzk daemon executable"),
    Setting("VM_CUZK_BENCH_BIN", "cuzk-bench", "the cuzk-bench executable"),
    Setting(
        "VM_C1_PATH",
        "/data/zk/c1.json",
        "the C1 output fed to `cuzk-bench batch --c1`: Curio's wrapper JSON (`SectorNum`, "
        "`Phase1Out`, `SectorSize`; docs/cuzk.md), checked before anything is fetched or "
        "proved (a wrong one: the instance fails, naming the file); its `SectorNum` is passed "
        "as `--sector-num`",
    ),
    Setting(
        "VM_C1_MINER_ID",
        "1000",
        "the miner (actor id) the C1 was made for, passed as `--miner-id`; a wrong one fails "
        "the warm-up proof's self-check",
        at_least=0,
    ),
    Setting("VM_BENCH_PROOFS", "12", "`-c/--count` of the benchmark", at_least=1),
    Setting(
        "VM_BENCH_CONCURRENCY",
        "auto",
        "`-j/--concurrency` of the benchmark: `auto` (2 per GPU in the run, so every GPU "
        "stays fed) or a number",
        at_least=1,
    ),
    Setting(
        "VM_WORK_CMD",
        None,
        "the operator's work command while proving; unset: the daemon idles, ready",
    ),
    Setting(
        "VM_ORPHAN_TIMEOUT",
        "1800",
        "seconds without a verified answer before self-destroy",
        above=0,
    ),
    Setting(
        "VM_NVML",
        "auto",
        "`auto` (real NVML if it loads), `real`, `sim` (fake NVML + host fed by the "
        "simulation), `off`",
        choices=NVML_MODES,
    ),
    Setting("VM_SAMPLE_INTERVAL", "1.0", "sampler period, seconds", above=0),
    Setting(
        "VM_PROVIDER",
        None,
        "`vast` (self-destroy through the REST API) or `local` (exit); unset: `vast` when "
        "`CONTAINER_ID` is set, else `local`",
        choices=PROVIDERS,
    ),
    Setting(
        "VM_CUZK_START_TIMEOUT",
        "900",
        "seconds the cuzk daemon may take to answer `GET /status` after it starts",
        above=0,
    ),
    Setting(
        "VM_PCE_WAIT",
        "900",
        "seconds the daemon may take, after the warm-up proof, to finish its background PCE "
        "extraction (`/status` `allocations.pce` lists `porep-32g`); the benchmark then runs "
        "in the same daemon process; longer fails the instance; 0: do not wait",
        at_least=0,
    ),
    Setting(
        "VM_CUZK_MEMORY_BUDGET",
        "auto",
        "cuzk's `[memory] total_budget`: `auto` = the memory this container may use (cgroup v2 "
        "`memory.max` / v1 `memory.limit_in_bytes`, or MemTotal, the smaller) less cuzk's "
        "5 GiB safety margin; or a whole size such as `200GiB`. A budget that cannot hold one "
        "14 GiB partition beside the SRS fails the instance (cuzk would wait for ever)",
    ),
    Setting(
        "VM_SPOOL_MAX_BYTES",
        "67108864",
        "spool bound (results and log batches waiting for a verified `200`); the oldest log "
        "batches are dropped first, never a result",
        at_least=1_048_576,
    ),
    Setting(
        "VM_LOG_LEVEL",
        "INFO",
        "the agent's own log level (`DEBUG` also echoes child output to stderr)",
        choices=LOG_LEVELS,
    ),
    Setting(
        "VM_SIM_PROFILE",
        None,
        "simulation: the offer JSON of the simulated machine (read by the simulator)",
    ),
    Setting(
        "VM_SIM_TIME_SCALE",
        "1",
        "simulation: simulated seconds per real second (read by the simulator)",
    ),
    Setting(
        "VM_SIM_STATE_FILE",
        None,
        "simulation: the live hardware state file (read by the simulator)",
    ),
    Setting(
        "VM_SIM_BUDGET_BLOCK_TIMEOUT",
        "1800",
        "simulation: simulated seconds a proof may wait for memory budget nothing will free "
        "before the simulated daemon fails it (the real one waits for ever)",
    ),
)

SETTINGS_BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}


class ConfigError(ValueError):
    """A setting is missing or malformed; the message names the variable, never its value."""


@dataclass(frozen=True, slots=True)
class AgentConfig:
    coordinator_url: str
    agent_id: str
    agent_key: bytes = field(repr=False)
    state_dir: Path
    params_dir: Path
    params_cmd: str | None
    params_manifest: str | None
    cuzk_bin: str
    cuzk_bench_bin: str
    c1_path: Path
    c1_miner_id: int
    bench_proofs: int
    bench_concurrency: int | None  # None: 2 per GPU in the run
    work_cmd: str | None
    orphan_timeout_s: float
    nvml: str
    sample_interval_s: float
    provider: str
    cuzk_start_timeout_s: float
    pce_wait_s: float
    memory_budget: str | None  # None: auto (from the container's limit); else cuzk's size text
    spool_max_bytes: int
    log_level: str
    # Set by vast.ai inside an instance (docs/vast.md).
    container_id: str | None = None
    container_api_key: str | None = field(default=None, repr=False)
    vast_url: str = "https://console.vast.ai"

    def secrets(self) -> list[str]:
        """Values that must never leave the agent in a log line."""
        out = [self.agent_key.hex()]
        if self.container_api_key:
            out.append(self.container_api_key)
        return out


def _get(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    if value is None or value.strip() == "":
        return SETTINGS_BY_NAME[name].default
    return value.strip()


def _required(env: Mapping[str, str], name: str) -> str:
    value = _get(env, name)
    if value is None:
        raise ConfigError(f"{name} is required but not set")
    return value


def _checked(name: str, value: T) -> T:
    settings_table.check(SETTINGS_BY_NAME[name], value, ConfigError)
    return value


def _int(env: Mapping[str, str], name: str) -> int:
    raw = _required(env, name)
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number, got {raw!r}") from None
    return _checked(name, value)


def _float(env: Mapping[str, str], name: str) -> float:
    raw = _required(env, name)
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from None
    return _checked(name, value)


def _choice(env: Mapping[str, str], name: str, default: str | None = None) -> str:
    value = _get(env, name) or default or ""
    return _checked(name, value.upper() if name == "VM_LOG_LEVEL" else value)


# config.rs parse_size: whole numbers of GiB, MiB, GB or MB, or plain bytes; anything
# else it silently reads as 50 GiB, so the agent refuses it instead.
_SIZE_RE = re.compile(r"^[0-9]+(GiB|MiB|GB|MB)?$")


def _budget(env: Mapping[str, str], name: str) -> str | None:
    value = _required(env, name)
    if value == "auto":
        return None
    if not _SIZE_RE.match(value) or not value.rstrip("GiBM") or int(value.rstrip("GiBM")) == 0:
        raise ConfigError(
            f"{name} must be auto or a whole size such as 200GiB, 204800MiB or bytes, got {value!r}"
        )
    return value


def _url(env: Mapping[str, str], name: str, value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        # The URL is not a secret, but it may embed credentials: do not echo it.
        raise ConfigError(f"{name} must be an http:// or https:// URL")
    return value.rstrip("/")


def load_config(environ: Mapping[str, str] | None = None) -> AgentConfig:
    """Parse the agent's settings from ``environ`` (default: the process environment)."""
    env = os.environ if environ is None else environ

    coordinator_url = _url(env, "VM_COORDINATOR_URL", _required(env, "VM_COORDINATOR_URL"))
    agent_id = _required(env, "VM_AGENT_ID")
    if not is_agent_id(agent_id):
        raise ConfigError("VM_AGENT_ID must be 'ag_' followed by 20 lowercase hex characters")
    key_hex = _required(env, "VM_AGENT_KEY")
    try:
        agent_key = bytes.fromhex(key_hex)
    except ValueError:
        agent_key = b""
    if len(agent_key) != 32:
        raise ConfigError("VM_AGENT_KEY must be 64 hexadecimal characters")

    container_id = (env.get("CONTAINER_ID") or "").strip() or None
    provider = _choice(env, "VM_PROVIDER", "vast" if container_id else "local")
    container_api_key = (env.get("CONTAINER_API_KEY") or "").strip() or None
    if provider == "vast" and not container_id:
        raise ConfigError("VM_PROVIDER is 'vast' but CONTAINER_ID is not set")
    vast_url = _url(env, "VAST_URL", (env.get("VAST_URL") or "").strip() or "https://console.vast.ai")

    manifest = _get(env, "VM_PARAMS_MANIFEST")
    return AgentConfig(
        coordinator_url=coordinator_url,
        agent_id=agent_id,
        agent_key=agent_key,
        state_dir=Path(_required(env, "VM_STATE_DIR")),
        params_dir=Path(_required(env, "VM_PARAMS_DIR")),
        params_cmd=_get(env, "VM_PARAMS_CMD"),
        params_manifest=manifest,
        cuzk_bin=_required(env, "VM_CUZK_BIN"),
        cuzk_bench_bin=_required(env, "VM_CUZK_BENCH_BIN"),
        c1_path=Path(_required(env, "VM_C1_PATH")),
        c1_miner_id=_int(env, "VM_C1_MINER_ID"),
        bench_proofs=_int(env, "VM_BENCH_PROOFS"),
        bench_concurrency=(
            None
            if (env.get("VM_BENCH_CONCURRENCY") or "auto").strip() == "auto"
            else _int(env, "VM_BENCH_CONCURRENCY")
        ),
        work_cmd=_get(env, "VM_WORK_CMD"),
        orphan_timeout_s=_float(env, "VM_ORPHAN_TIMEOUT"),
        nvml=_choice(env, "VM_NVML"),
        sample_interval_s=_float(env, "VM_SAMPLE_INTERVAL"),
        provider=provider,
        cuzk_start_timeout_s=_float(env, "VM_CUZK_START_TIMEOUT"),
        pce_wait_s=_float(env, "VM_PCE_WAIT"),
        memory_budget=_budget(env, "VM_CUZK_MEMORY_BUDGET"),
        spool_max_bytes=_int(env, "VM_SPOOL_MAX_BYTES"),
        log_level=_choice(env, "VM_LOG_LEVEL"),
        container_id=container_id,
        container_api_key=container_api_key,
        vast_url=vast_url,
    )


def settings_help() -> str:
    """The settings table as plain text, for ``vast-agent run --help``."""
    lines = []
    for s in SETTINGS:
        allowed = settings_table.describe(s)
        allowed = f" ({allowed})" if allowed else ""
        default = f" [default: {s.default}]" if s.default is not None else ""
        lines.append(f"{s.name}: {s.help}{allowed}{default}")
    return "\n".join(lines)


def settings_markdown() -> str:
    """The table of docs/architecture.md's agent configuration (a test keeps it in step)."""
    return settings_table.markdown(SETTINGS)
