"""The coordinator's settings: one table of ``Setting(name, default, help)``.

``SETTINGS`` drives the defaults, the ``VM_*`` environment variables (the
name upper-cased behind ``VM_``: ``db_path`` -> ``VM_DB_PATH``), the parsing,
the bounds (keyword fields of the row, checked by ``vast_manager.common.settings_table``)
and the docs (``settings_markdown``). ``Settings.from_env(env, **overrides)``
resolves them, including the fleet secret file and a generated admin token.
Errors name the variable, never a secret's value.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vast_manager.common import settings_table
from vast_manager.protocol.signing import fleet_id as derive_fleet_id
from vast_manager.protocol.signing import parse_secrets

ENV_PREFIX = "VM_"
MIN_ADMIN_TOKEN_CHARS = 16
#: A token of one character repeated, or two or three in turn, is as long as a good one
#: and as easy to guess as a short one. A random 16-character hex token has fewer than 6
#: distinct characters about once in 70,000 draws.
MIN_ADMIN_TOKEN_DISTINCT_CHARS = 6
FLEET_SECRET_FILE = "fleet-secret"


@dataclass(frozen=True)
class Setting(settings_table.Bounds):
    """One row: ``Setting(name, default, help)``, bounds by keyword (``at_least=1``...)."""

    name: str
    default: Any  # None: unset, with the meaning the help text gives
    help: str
    kind: type | None = None  # parse type; None: the type of the default

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def parse_type(self) -> type:
        if self.kind is not None:
            return self.kind
        return type(self.default) if self.default is not None else str


SETTINGS: tuple[Setting, ...] = (
    Setting("db_path", "./vast-manager.db", "SQLite database file"),
    Setting("host", "127.0.0.1", "listen address"),
    Setting("port", 8420, "listen port (0: any free port)", at_least=0, at_most=65535),
    Setting(
        "public_url",
        None,
        "the coordinator URL handed to agents (VM_COORDINATOR_URL); unset: http://HOST:PORT",
    ),
    Setting(
        "admin_token",
        None,
        f"operator API bearer token: at least {MIN_ADMIN_TOKEN_CHARS} printable ASCII "
        f"characters, no spaces, at least {MIN_ADMIN_TOKEN_DISTINCT_CHARS} of them different "
        "(e.g. `openssl rand -hex 24`); unset: generated at start and printed once to stderr",
    ),
    Setting(
        "fleet_secret",
        None,
        "fleet secrets, hex, comma-separated, newest first; unset: generated on first start "
        "into a 0600 file in the config directory",
    ),
    Setting(
        "config_dir",
        None,
        "where the generated fleet secret lives; unset: $XDG_CONFIG_HOME/vast-manager "
        "(~/.config/vast-manager); never beside the database",
    ),
    Setting("fleet_id", None, "fleet id in vast.ai labels; unset: derived from the newest secret"),
    Setting(
        "max_usd_per_proof", 0.008, "minimum rate = dph_total / this, unless set at deploy", above=0
    ),
    Setting(
        "next_heartbeat_s",
        15,
        "base heartbeat pace the coordinator asks of agents, seconds: the least, which "
        "holds while the fleet stays under max_heartbeats_per_second (docs/operations.md, "
        "Heartbeat pace)",
        at_least=1,
    ),
    Setting(
        "max_heartbeats_per_second",
        1000.0,
        "heartbeats a second the whole fleet is paced to stay under: beyond "
        "next_heartbeat_s x this many agents, their pace stretches (warming and "
        "benchmarking agents keep theirs first)",
        above=0,
    ),
    Setting(
        "max_next_heartbeat_s",
        300,
        "longest heartbeat pace, seconds (never below next_heartbeat_s): past "
        "max_heartbeats_per_second x this many agents the budget is exceeded rather than "
        "silence found later; at most a third of the agents' VM_ORPHAN_TIMEOUT default",
        at_least=1,
        at_most=600,
    ),
    Setting(
        "no_hello_timeout_s",
        900.0,
        "deployed instance without hello, or an agent stuck in booting: destroyed after (seconds)",
        above=0,
    ),
    Setting(
        "params_timeout_s", 5400.0, "longest parameter fetch (fetching_params), seconds", above=0
    ),
    Setting("warmup_timeout_s", 1200.0, "longest warm-up (warming), seconds", above=0),
    Setting(
        "benchmark_timeout_s", 2700.0, "longest benchmark run (benchmarking), seconds", above=0
    ),
    Setting(
        "silence_grace_s",
        30.0,
        "silence TTL = 3 x the pace last given to the agent + this; then the instance "
        "is `lost`",
        at_least=0,
    ),
    Setting(
        "lost_timeout_s", 1800.0, "a `lost` instance silent this long is destroyed", above=0
    ),
    Setting(
        "terminate_grace_s",
        15.0,
        "after a terminate directive, seconds before the provider destroy (the agent gets "
        "its answer first)",
        at_least=0,
    ),
    Setting("monitor_interval_s", 60.0, "monitor loop period, seconds", above=0),
    Setting(
        "log_lines_per_instance", 20000, "shipped log lines kept per instance", at_least=1
    ),
    Setting(
        "heartbeat_history_interval_s",
        300.0,
        "heartbeat history keeps at most one row per agent per this many seconds",
        at_least=0,
    ),
    Setting("heartbeat_history_rows", 288, "heartbeat history rows kept per agent", at_least=1),
    Setting(
        "max_deploy_dph_total", 5.0, "deploy refuses offers above this price, $/hour", above=0
    ),
    Setting(
        "deploy_disk_gb",
        250,
        "disk of a deployed instance unless the deploy says, GB (vast.ai: also priced into "
        "the offers' dph_total; the image needs at least 250)",
        at_least=1,
    ),
    Setting(
        "unowned_grace_s",
        900.0,
        "our fleet id on an instance no agent owns: destroyed after",
        at_least=0,
    ),
    Setting(
        "min_instance_ram_gb",
        128.0,
        "least RAM an offer's instance must get, GB as vast.ai counts cpu_ram (MB / 1000): "
        "its share of the host, cpu_ram x cpu_cores_effective / cpu_cores, not the host's "
        "whole; offers below it are flagged and deploys refused (cuzk needs 128 GiB and "
        "proves far faster with 256; 0: no check)",
        at_least=0,
    ),
    Setting(
        "vast_image",
        None,
        "vast.ai: the instance image (built from image/Dockerfile, e.g. "
        "ghcr.io/you/vast-agent:1.0); required with --provider vast",
    ),
    Setting(
        "vast_onstart",
        None,
        "vast.ai: the onstart script text (ssh run type; vast.ai takes 4048 characters, a "
        "longer script is sent gzip+base64 in a wrapper that unpacks it); unset: the "
        "template's, which runs `/usr/local/bin/vast-agent-onstart start`",
    ),
    Setting(
        "vast_runtype",
        "ssh_direc ssh_proxy",
        "vast.ai: run type sent at create: `ssh_direc ssh_proxy` (vast.ai runs the onstart "
        "script) or `args` (the image ENTRYPOINT runs)",
    ),
    Setting(
        "vast_env",
        None,
        'vast.ai: extra environment for every instance, a JSON object (e.g. '
        '`{"VM_PARAMS_CMD": "curio fetch-params 32"}`); the agent\'s own VM_* values win',
    ),
    Setting(
        "vast_image_login",
        None,
        "vast.ai: registry login for a private image (`-u USER -p TOKEN REGISTRY`)",
    ),
    Setting(
        "vast_filter",
        None,
        "vast.ai: default offer filter in the CLI's syntax; unset: the original manager's",
    ),
    Setting(
        "max_concurrency_per_gpu",
        8,
        "plausibility: most proofs one GPU can have in flight at once",
        at_least=1,
    ),
    Setting(
        "rate_tolerance",
        0.05,
        "plausibility: relative slack between reported and recomputed numbers",
        at_least=0,
        at_most=1,
    ),
    Setting(
        "max_rate_per_gpu_per_hour",
        300.0,
        "plausibility: most proofs/hour one GPU the host reported can make, over every GPU "
        "model's own ceiling (docs/reliability.md) and alone for a model it does not know "
        "(about three times the best the operator has seen, 90-110/h); a faster claim is "
        "implausible",
        above=0,
    ),
    Setting(
        "verdict_early",
        True,
        "early benchmark verdicts (docs/policy.md): judge the running benchmark from its proof "
        "times and terminate a host below its minimum with the configured confidence; the "
        "finished benchmark is judged on its steady-state rate. false: only the batch rate "
        "after the full benchmark",
    ),
    Setting(
        "verdict_confidence",
        0.95,
        "early verdicts: confidence of a terminate or pass, over every look at one benchmark "
        "(chosen by bench/verdict.py --sweep)",
        above=0.5,
        below=1,
    ),
    Setting(
        "verdict_min_proofs",
        2,
        "early verdicts: completed proofs before the proof times may decide (a benchmark "
        "that stalls is caught sooner)",
        at_least=1,
    ),
    Setting(
        "verdict_sigma_floor",
        0.15,
        "early verdicts: smallest per-proof noise assumed (sd of log proof time; the "
        "observed noise is 5-15%)",
        above=0,
    ),
    Setting(
        "sim_time_scale",
        1.0,
        "simulation only: simulated seconds per real second of the local fleet; the "
        "plausibility check scales the time it observed of a deployed instance by it "
        "(never of a bring-your-own agent: a real machine)",
        above=0,
    ),
    Setting("nonces_per_agent", 2000, "nonce memory per agent (beyond it: 429)", at_least=1),
    Setting(
        "write_batch_max", 512, "most write jobs the writer commits in one transaction", at_least=1
    ),
    Setting(
        "commit_window_ms",
        20.0,
        "how long writes gather before the writer commits them together: one fsync'ed "
        "commit per window (or per 64 writes), not per request (0: at the end of each "
        "event-loop turn; past a second every write would wait long enough to look hung)",
        at_least=0,
        at_most=1000,
    ),
    Setting("tls_cert", None, "PEM certificate chain: serve HTTPS directly (needs tls_key)"),
    Setting("tls_key", None, "PEM private key of tls_cert"),
    Setting(
        "admin_listen",
        None,
        "HOST:PORT for the operator API, dashboard and /metrics; when set, the main "
        "host:port serves only the agent endpoints (/v1/*)",
    ),
    Setting("metrics_public", False, "serve /metrics without the admin token"),
    Setting(
        "log_format",
        "text",
        "server log lines: text, or json (one object per line)",
        choices=("text", "json"),
    ),
    Setting("session_ttl_s", 43200.0, "dashboard login session lifetime, seconds", above=0),
    Setting(
        "admin_failures_per_minute",
        10,
        "failed admin-token attempts (dashboard logins, bearer tokens) one client address "
        "may make in a minute; beyond it `429` with Retry-After, the token not even compared",
        at_least=1,
    ),
    Setting(
        "model_refit_interval_s",
        30.0,
        "the rate model (docs/discovery.md) refits when measurements arrive, at most once "
        "this many seconds, off the event loop; requests use the latest fit",
        above=0,
    ),
    Setting(
        "plan_horizon_hours",
        168.0,
        "plan and autopilot: how long a host worth keeping is expected to run, hours (its "
        "saving over this pays for its trial)",
        above=0,
    ),
    Setting(
        "idle_after_s",
        900.0,
        "a proving instance that completes no proof for this long (cuzk's counter, from its "
        "heartbeats; simulated seconds on the local fleet) shows as idle: not counted as "
        "fleet output, reported in status, the dashboard and /metrics (0: never)",
        at_least=0,
    ),
    Setting(
        "idle_destroy_after_s",
        0.0,
        "destroy a deployed instance idle this long (0: only report it; a bring-your-own "
        "agent is never destroyed)",
        at_least=0,
    ),
    Setting("autopilot", False, "run the autopilot (`serve --autopilot`; docs/discovery.md)"),
    Setting(
        "autopilot_target_rate_per_hour",
        None,
        "autopilot: the fleet's target rate, proofs/hour (required with the autopilot)",
        float,
        above=0,
    ),
    Setting(
        "autopilot_max_dph_total",
        None,
        "autopilot: hard cap on the fleet's price, $/hour, trials included (required)",
        float,
        above=0,
    ),
    Setting(
        "autopilot_max_instances",
        None,
        "autopilot: hard cap on instances billing at once (required)",
        int,
        at_least=1,
    ),
    Setting(
        "autopilot_max_explore_share",
        0.15,
        "autopilot: at its target, it explores only while trials stay within this share of "
        "the spend over autopilot_spend_window_h",
        at_least=0,
        at_most=1,
    ),
    Setting("autopilot_max_concurrent_trials", 2, "autopilot: most trials under way at once",
            at_least=1),
    Setting("autopilot_explore_interval_s", 3600.0,
            "autopilot: least time between two explorations, seconds", at_least=0),
    Setting("autopilot_interval_s", 120.0, "autopilot: seconds between two decisions",
            above=0),
    Setting(
        "autopilot_spend_window_h",
        168.0,
        "autopilot: the spend the exploration share is measured on, the last this many hours",
        above=0,
    ),
    Setting(
        "autopilot_filter",
        None,
        "autopilot: offer filter of its searches, vast.ai CLI syntax; unset: VM_VAST_FILTER "
        "or the provider's default",
    ),
    # The whole bill (docs/operations.md, "What an instance costs" and "The account").
    Setting(
        "setup_download_gb",
        50.0,
        "GB a fresh instance downloads before it proves (the image and the ~45 GiB of "
        "parameters): priced at each offer's inet_down_cost and spread over "
        "plan_horizon_hours in every $/hour figure",
        at_least=0,
    ),
    Setting(
        "balance_warn_usd",
        20.0,
        "vast.ai balance below this: a warning on the dashboard, in status and the log",
    ),
    Setting(
        "balance_pause_usd",
        2.0,
        "vast.ai balance below this: deploys and the autopilot pause until it is back above",
    ),
    Setting(
        "strike_limit",
        3,
        "failed trials (stuck loading, no hello, timeouts, crashes, implausible results) "
        "within strike_window_s that block a machine",
        at_least=1,
    ),
    Setting("strike_window_s", 7 * 86400.0, "strikes older than this no longer count",
            above=0),
    Setting("strike_block_s", 7 * 86400.0, "how long a struck-out machine stays blocked",
            above=0),
    Setting(
        "interruptible_trials",
        False,
        "the autopilot's trials rent interruptible instances at a bid (vast.ai only; "
        "docs/operations.md, Interruptible trials)",
    ),
    Setting(
        "interruptible_bid_share",
        0.6,
        "an interruptible trial bids this share of the offer's on-demand rent (at least "
        "the offer's min_bid)",
        above=0,
        at_most=1,
    ),
)

_BY_NAME = {s.name: s for s in SETTINGS}


def default_config_dir(env: Mapping[str, str]) -> Path:
    """$XDG_CONFIG_HOME/vast-manager, else ~/.config/vast-manager."""
    base = env.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "vast-manager"


def load_or_create_fleet_secret(config_dir: Path) -> list[bytes]:
    """Read the fleet secret file, creating it (32 random bytes, hex, mode 0600) if absent.

    Created with O_EXCL so two coordinators starting at once agree on one secret.
    """
    path = config_dir / FLEET_SECRET_FILE
    if not path.exists():
        config_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32) + "\n")
                f.flush()
                os.fsync(f.fileno())
    try:
        return parse_secrets(path.read_text().strip())
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None


_KIND_WORDS = {int: "a whole number", float: "a number", str: "text", bool: "true or false"}


def _parse(setting: Setting, raw: Any) -> Any:
    if raw is None:
        return None
    kind = setting.parse_type
    if not isinstance(raw, str):
        if kind is float and isinstance(raw, int) and not isinstance(raw, bool):
            return float(raw)
        if isinstance(raw, kind):
            return raw
        raise ValueError(f"{setting.env} must be {_KIND_WORDS.get(kind, kind.__name__)}")
    text = raw.strip()
    if kind is str:
        return text or None
    if kind is bool:
        # bool("false") is True: spell the accepted words out.
        word = text.lower()
        if word in ("1", "true", "yes", "on"):
            return True
        if word in ("0", "false", "no", "off", ""):
            return False
        raise ValueError(f"{setting.env} must be true or false, got {text!r}")
    try:
        value = kind(text)
    except ValueError:
        words = _KIND_WORDS.get(kind, kind.__name__)
        raise ValueError(f"{setting.env} must be {words}, got {text!r}") from None
    return value


@dataclass(frozen=True, slots=True)
class Settings:
    db_path: str
    host: str
    port: int
    public_url: str | None
    admin_token: str
    fleet_secrets: tuple[bytes, ...]
    config_dir: str
    fleet_id: str
    max_usd_per_proof: float
    next_heartbeat_s: int
    max_heartbeats_per_second: float
    max_next_heartbeat_s: int
    no_hello_timeout_s: float
    params_timeout_s: float
    warmup_timeout_s: float
    benchmark_timeout_s: float
    silence_grace_s: float
    lost_timeout_s: float
    terminate_grace_s: float
    monitor_interval_s: float
    log_lines_per_instance: int
    heartbeat_history_interval_s: float
    heartbeat_history_rows: int
    max_deploy_dph_total: float
    deploy_disk_gb: int
    unowned_grace_s: float
    max_concurrency_per_gpu: int
    rate_tolerance: float
    max_rate_per_gpu_per_hour: float
    sim_time_scale: float
    nonces_per_agent: int
    write_batch_max: int
    commit_window_ms: float
    tls_cert: str | None = None
    tls_key: str | None = None
    admin_listen: str | None = None
    metrics_public: bool = False
    log_format: str = "text"
    session_ttl_s: float = 43200.0
    admin_failures_per_minute: int = 10
    vast_image: str | None = None
    vast_onstart: str | None = None
    vast_runtype: str = "ssh_direc ssh_proxy"
    vast_env: str | None = None
    vast_image_login: str | None = None
    vast_filter: str | None = None
    verdict_early: bool = True
    verdict_confidence: float = 0.95
    verdict_min_proofs: int = 2
    verdict_sigma_floor: float = 0.15
    min_instance_ram_gb: float = 128.0
    model_refit_interval_s: float = 30.0
    plan_horizon_hours: float = 168.0
    idle_after_s: float = 900.0
    idle_destroy_after_s: float = 0.0
    autopilot: bool = False
    autopilot_target_rate_per_hour: float | None = None
    autopilot_max_dph_total: float | None = None
    autopilot_max_instances: int | None = None
    autopilot_max_explore_share: float = 0.15
    autopilot_max_concurrent_trials: int = 2
    autopilot_explore_interval_s: float = 3600.0
    autopilot_interval_s: float = 120.0
    autopilot_spend_window_h: float = 168.0
    autopilot_filter: str | None = None
    setup_download_gb: float = 50.0
    balance_warn_usd: float = 20.0
    balance_pause_usd: float = 2.0
    strike_limit: int = 3
    strike_window_s: float = 7 * 86400.0
    strike_block_s: float = 7 * 86400.0
    interruptible_trials: bool = False
    interruptible_bid_share: float = 0.6
    admin_token_generated: bool = False

    @property
    def newest_secret(self) -> bytes:
        return self.fleet_secrets[0]

    @property
    def coordinator_url(self) -> str:
        """The URL agents are told to use."""
        if self.public_url:
            return self.public_url.rstrip("/")
        scheme = "https" if self.tls_cert else "http"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}"

    def with_values(self, **values: Any) -> Settings:
        return dataclasses.replace(self, **values)

    def __repr__(self) -> str:  # never print secrets (logs, tracebacks)
        return f"Settings(db_path={self.db_path!r}, host={self.host!r}, port={self.port})"

    @classmethod
    def from_env(cls, env: Mapping[str, str], **overrides: Any) -> Settings:
        """Resolve every setting: ``overrides`` (by setting name) over ``VM_*`` over defaults.

        When no fleet secret is given, it is read from (or created in) the config
        directory; when no admin token is given, a random one is generated and
        ``admin_token_generated`` is set so the server prints it once.
        """
        unknown = set(overrides) - set(_BY_NAME)
        if unknown:
            raise ValueError(f"unknown setting(s): {', '.join(sorted(unknown))}")
        values: dict[str, Any] = {}
        for setting in SETTINGS:
            if setting.name in overrides and overrides[setting.name] is not None:
                raw = overrides[setting.name]
            elif setting.env in env and env[setting.env].strip() != "":
                raw = env[setting.env]
            else:
                raw = setting.default
            value = _parse(setting, raw)
            if value is not None:
                settings_table.check(setting, value)
            values[setting.name] = value

        # Rules across settings, or of a shape bounds cannot say.
        if bool(values["tls_cert"]) != bool(values["tls_key"]):
            raise ValueError("VM_TLS_CERT and VM_TLS_KEY go together: set both or neither")
        if values["admin_listen"]:
            parse_listen(values["admin_listen"])  # raises with the variable's name

        _check_discovery(values)

        config_dir = (
            Path(values["config_dir"]) if values["config_dir"] else default_config_dir(env)
        )
        values["config_dir"] = str(config_dir)
        secret_text = values.pop("fleet_secret")
        if secret_text:
            try:
                fleet_secrets = parse_secrets(secret_text)
            except ValueError as err:
                raise ValueError(f"VM_FLEET_SECRET: {err}") from None
        else:
            fleet_secrets = load_or_create_fleet_secret(config_dir)
        values["fleet_secrets"] = tuple(fleet_secrets)
        if not values["fleet_id"]:
            values["fleet_id"] = derive_fleet_id(fleet_secrets[0])

        token = values["admin_token"]
        generated = False
        if token is None:
            token = secrets.token_urlsafe(32)
            generated = True
        else:
            check_admin_token(token)
        values["admin_token"] = token
        values["admin_token_generated"] = generated
        return cls(**values)


def _check_discovery(values: dict[str, Any]) -> None:
    """The autopilot's caps: hard limits with no default, so required to run it (their
    bounds are in their rows)."""
    for name in ("autopilot_target_rate_per_hour", "autopilot_max_dph_total",
                 "autopilot_max_instances"):
        if values[name] is None and values["autopilot"]:
            raise ValueError(f"{_BY_NAME[name].env} must be set to run the autopilot "
                             "(its caps are hard limits, with no default)")


def check_admin_token(token: str) -> None:
    """Refuse a token too weak to stand guessing (ValueError naming the rule, never the
    token): with failed attempts throttled per address (``vast_manager.coordinator.web.guard``), 16
    random hex characters (64 bits) take longer than the universe's age to guess."""
    if len(token) < MIN_ADMIN_TOKEN_CHARS:
        raise ValueError(f"VM_ADMIN_TOKEN must be at least {MIN_ADMIN_TOKEN_CHARS} characters")
    if not all("!" <= c <= "~" for c in token):
        raise ValueError("VM_ADMIN_TOKEN must be printable ASCII without spaces")
    if len(set(token)) < MIN_ADMIN_TOKEN_DISTINCT_CHARS:
        raise ValueError(
            f"VM_ADMIN_TOKEN must hold at least {MIN_ADMIN_TOKEN_DISTINCT_CHARS} different "
            "characters (generate one: openssl rand -hex 24)"
        )


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[V6]:PORT`` -> (host, port); ValueError naming VM_ADMIN_LISTEN."""
    host, sep, port_text = text.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"VM_ADMIN_LISTEN must be HOST:PORT, got {text!r}")
    return host, int(port_text)


def settings_markdown() -> str:
    """The settings table for the docs (variable, default, allowed values, meaning)."""
    return settings_table.markdown(SETTINGS)
