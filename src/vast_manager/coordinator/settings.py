"""The coordinator's settings, each declared once: a field of the ``Settings`` struct.

A field's type, default and ``msgspec.Meta`` (help text and bounds) are the whole
declaration; ``SETTINGS`` is read off it (``vast_manager.common.settings_table``) and drives
the ``VM_*`` environment variables (the name upper-cased behind ``VM_``: ``db_path`` ->
``VM_DB_PATH``), the parsing, the bounds check, the docs (``settings_markdown``) and
``vast-manager serve --help`` (``settings_help``). ``Settings.from_env(env, **overrides)``
resolves them, including the fleet secret file and a generated admin token. Errors name
the variable, never a secret's value. docs/architecture.md, "Settings", says why msgspec.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

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
#: Fields ``from_env`` fills in, not settings of their own.
RESOLVED_FIELDS = ("fleet_secrets", "admin_token_generated")

Setting = settings_table.Declared


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    """Every coordinator setting (``admin_token``, ``config_dir`` and ``fleet_id`` read ""
    as unset; ``from_env`` fills them in)."""

    db_path: Annotated[
        str,
        Meta(description=(
            "SQLite database file"
        )),
    ] = "./vast-manager.db"
    replica_url: Annotated[
        str | None,
        Meta(description=(
            "where Litestream replicates the database (a folder, `s3://BUCKET/PATH`, "
            "`sftp://HOST/PATH`: any replica URL Litestream takes; docs/operations.md, "
            "\"Losing the coordinator\"); unset: the state is on one disk"
        )),
    ] = None
    host: Annotated[
        str,
        Meta(description=(
            "listen address"
        )),
    ] = "127.0.0.1"
    port: Annotated[
        int,
        Meta(ge=0, le=65535, description=(
            "listen port (0: any free port)"
        )),
    ] = 8420
    public_url: Annotated[
        str | None,
        Meta(description=(
            "the coordinator URL handed to agents (VM_COORDINATOR_URL); unset: http://HOST:PORT"
        )),
    ] = None
    admin_token: Annotated[
        str,
        Meta(description=(
            f"operator API bearer token: at least {MIN_ADMIN_TOKEN_CHARS} printable ASCII "
            f"characters, no spaces, at least {MIN_ADMIN_TOKEN_DISTINCT_CHARS} of them different "
            "(e.g. `openssl rand -hex 24`); unset: generated at start and printed once to stderr"
        )),
    ] = ""
    fleet_secret: Annotated[
        str | None,
        Meta(description=(
            "fleet secrets, hex, comma-separated, newest first; unset: generated on first start "
            "into a 0600 file in the config directory"
        )),
    ] = None
    config_dir: Annotated[
        str,
        Meta(description=(
            "where the generated fleet secret lives; unset: $XDG_CONFIG_HOME/vast-manager "
            "(~/.config/vast-manager); never beside the database"
        )),
    ] = ""
    fleet_id: Annotated[
        str,
        Meta(description=(
            "fleet id in vast.ai labels; unset: derived from the newest secret"
        )),
    ] = ""
    max_usd_per_proof: Annotated[
        float,
        Meta(gt=0, description=(
            "minimum rate = dph_total / this, unless set at deploy"
        )),
    ] = 0.008
    next_heartbeat_s: Annotated[
        int,
        Meta(ge=1, description=(
            "base heartbeat pace the coordinator asks of agents, seconds: the least, which "
            "holds while the fleet stays under max_heartbeats_per_second (docs/operations.md, "
            "Heartbeat pace)"
        )),
    ] = 15
    max_heartbeats_per_second: Annotated[
        float,
        Meta(gt=0, description=(
            "heartbeats a second the whole fleet is paced to stay under: beyond "
            "next_heartbeat_s x this many agents, their pace stretches (warming and "
            "benchmarking agents keep theirs first)"
        )),
    ] = 1000.0
    max_next_heartbeat_s: Annotated[
        int,
        Meta(ge=1, le=600, description=(
            "longest heartbeat pace, seconds (never below next_heartbeat_s): past "
            "max_heartbeats_per_second x this many agents the budget is exceeded rather than "
            "silence found later; at most a third of the agents' VM_ORPHAN_TIMEOUT default"
        )),
    ] = 300
    no_hello_timeout_s: Annotated[
        float,
        Meta(gt=0, description=(
            "deployed instance without hello, or an agent stuck in booting: destroyed after "
            "(seconds)"
        )),
    ] = 900.0
    params_timeout_s: Annotated[
        float,
        Meta(gt=0, description=(
            "longest parameter fetch (fetching_params), seconds"
        )),
    ] = 5400.0
    warmup_timeout_s: Annotated[
        float,
        Meta(gt=0, description=(
            "longest warm-up (warming), seconds"
        )),
    ] = 1200.0
    benchmark_timeout_s: Annotated[
        float,
        Meta(gt=0, description=(
            "longest benchmark run (benchmarking), seconds"
        )),
    ] = 2700.0
    silence_grace_s: Annotated[
        float,
        Meta(ge=0, description=(
            "silence TTL = 3 x the pace last given to the agent + this; then the instance "
            "is `lost`"
        )),
    ] = 30.0
    lost_timeout_s: Annotated[
        float,
        Meta(gt=0, description=(
            "a `lost` instance silent this long is destroyed"
        )),
    ] = 1800.0
    terminate_grace_s: Annotated[
        float,
        Meta(ge=0, description=(
            "after a terminate directive, seconds before the provider destroy (the agent gets "
            "its answer first)"
        )),
    ] = 15.0
    monitor_interval_s: Annotated[
        float,
        Meta(gt=0, description=(
            "monitor loop period, seconds"
        )),
    ] = 60.0
    log_lines_per_instance: Annotated[
        int,
        Meta(ge=1, description=(
            "shipped log lines kept per instance"
        )),
    ] = 20000
    heartbeat_history_interval_s: Annotated[
        float,
        Meta(ge=0, description=(
            "heartbeat history keeps at most one row per agent per this many seconds"
        )),
    ] = 300.0
    heartbeat_history_rows: Annotated[
        int,
        Meta(ge=1, description=(
            "heartbeat history rows kept per agent"
        )),
    ] = 288
    max_deploy_dph_total: Annotated[
        float,
        Meta(gt=0, description=(
            "deploy refuses offers above this price, $/hour"
        )),
    ] = 5.0
    deploy_disk_gb: Annotated[
        int,
        Meta(ge=1, description=(
            "disk of a deployed instance unless the deploy says, GB (vast.ai: also priced into "
            "the offers' dph_total; the image needs at least 250)"
        )),
    ] = 250
    unowned_grace_s: Annotated[
        float,
        Meta(ge=0, description=(
            "our fleet id on an instance no agent owns: destroyed after"
        )),
    ] = 900.0
    min_instance_ram_gb: Annotated[
        float,
        Meta(ge=0, description=(
            "least RAM an offer's instance must get, GB as vast.ai counts cpu_ram (MB / 1000): "
            "its share of the host, cpu_ram x cpu_cores_effective / cpu_cores, not the host's "
            "whole; offers below it are flagged and deploys refused (cuzk needs 128 GiB and "
            "proves far faster with 256; 0: no check)"
        )),
    ] = 128.0
    vast_image: Annotated[
        str | None,
        Meta(description=(
            "vast.ai: the instance image (built from image/Dockerfile, e.g. "
            "ghcr.io/you/vast-agent:1.0; pin a tag); required with --provider vast"
        )),
    ] = None
    vast_onstart: Annotated[
        str | None,
        Meta(description=(
            "vast.ai: the onstart script text (ssh run type; vast.ai takes 4048 characters, a "
            "longer script is sent gzip+base64 in a wrapper that unpacks it, and one too long "
            "even so stops `serve` with the sizes); unset: the "
            "template's, which runs `/usr/local/bin/vast-agent-onstart start`"
        )),
    ] = None
    vast_runtype: Annotated[
        str,
        Meta(description=(
            "vast.ai: run type sent at create: `ssh_direc ssh_proxy` (vast.ai runs the onstart "
            "script) or `args` (the image ENTRYPOINT runs)"
        )),
    ] = "ssh_direc ssh_proxy"
    vast_env: Annotated[
        str | None,
        Meta(description=(
            'vast.ai: extra environment for every instance, a JSON object (e.g. '
            '`{"VM_PARAMS_MANIFEST": "https://params.example.org/manifest.json"}`); the '
            'agent\'s own VM_* values win'
        )),
    ] = None
    preflight_c1: Annotated[
        str | None,
        Meta(description=(
            "preflight: a copy, on the coordinator, of the C1 file the instances read at "
            "VM_C1_PATH; checked (readable, well-formed as cuzk reads it) before the first "
            "deploy of a configuration (docs/operations.md, 'Preflight'); unset: not checked"
        )),
    ] = None
    preflight_registry: Annotated[
        bool,
        Meta(description=(
            "preflight: look VM_VAST_IMAGE up in its registry before the first deploy of a "
            "configuration (Docker Registry API v2, anonymously); false: never ask the "
            "registry"
        )),
    ] = True
    vast_image_login: Annotated[
        str | None,
        Meta(description=(
            "vast.ai: registry login for a private image (`-u USER -p TOKEN REGISTRY`)"
        )),
    ] = None
    vast_filter: Annotated[
        str | None,
        Meta(description=(
            "vast.ai: default offer filter in the CLI's syntax; unset: the original manager's"
        )),
    ] = None
    vast_searches_per_day: Annotated[
        int,
        Meta(ge=1, le=100_000, description=(
            "vast.ai: offer searches a UTC day at most (the daily quota, docs/vast.md); "
            "the offer cache answers between them, each answer with its age"
        )),
    ] = 480
    vast_webhook_secret: Annotated[
        str | None,
        Meta(description=(
            "vast.ai: the signing secret of a notification webhook; set, POST "
            "/v1/vast/webhook accepts vast.ai's signed events (docs/vast.md, Webhooks)"
        )),
    ] = None
    max_bid_per_hour: Annotated[
        float | None,
        Meta(gt=0, description=(
            "interruptible: the highest bid ($/h) an outbid kept instance is raised to; "
            "unset: the break-even rent at its measured rate, capped by max_deploy_dph_total"
        )),
    ] = None
    max_concurrency_per_gpu: Annotated[
        int,
        Meta(ge=1, description=(
            "plausibility: most proofs one GPU can have in flight at once"
        )),
    ] = 8
    rate_tolerance: Annotated[
        float,
        Meta(ge=0, le=1, description=(
            "plausibility: relative slack between reported and recomputed numbers"
        )),
    ] = 0.05
    max_rate_per_gpu_per_hour: Annotated[
        float | None,
        Meta(gt=0, description=(
            "plausibility: a cap (proofs/hour per GPU) over every GPU model's own ceiling "
            "(docs/reliability.md), and the ceiling of a model neither the spec table nor the "
            "offer's gpu_mem_bw bounds; unset: each model's own ceiling, and the slowest known "
            "card's for such a model; a faster claim is implausible"
        )),
    ] = None
    verdict_early: Annotated[
        bool,
        Meta(description=(
            "early benchmark verdicts (docs/policy.md): judge the running benchmark from its proof "
            "times and terminate a host below its minimum with the configured confidence; the "
            "finished benchmark is judged on its steady-state rate. false: only the batch rate "
            "after the full benchmark"
        )),
    ] = True
    verdict_confidence: Annotated[
        float,
        Meta(gt=0.5, lt=1, description=(
            "early verdicts: confidence of a terminate or pass, over every look at one benchmark "
            "(chosen by bench/verdict.py --sweep)"
        )),
    ] = 0.95
    verdict_min_proofs: Annotated[
        int,
        Meta(ge=1, description=(
            "early verdicts: completed proofs before the proof times may decide (a benchmark "
            "that stalls is caught sooner)"
        )),
    ] = 2
    verdict_sigma_floor: Annotated[
        float,
        Meta(gt=0, description=(
            "early verdicts: smallest per-proof noise assumed (sd of log proof time; the "
            "observed noise is 5-15%)"
        )),
    ] = 0.15
    sim_time_scale: Annotated[
        float,
        Meta(gt=0, description=(
            "simulation only: simulated seconds per real second of the local fleet; the "
            "plausibility check scales the time it observed of a deployed instance by it "
            "(never of a bring-your-own agent: a real machine)"
        )),
    ] = 1.0
    nonces_per_agent: Annotated[
        int,
        Meta(ge=1, description=(
            "nonce memory per agent (beyond it: 429)"
        )),
    ] = 2000
    write_batch_max: Annotated[
        int,
        Meta(ge=1, description=(
            "most write jobs the writer commits in one transaction"
        )),
    ] = 512
    commit_window_ms: Annotated[
        float,
        Meta(ge=0, le=1000, description=(
            "how long writes gather before the writer commits them together: one fsync'ed "
            "commit per window (or per 64 writes), not per request (0: at the end of each "
            "event-loop turn; past a second every write would wait long enough to look hung)"
        )),
    ] = 20.0
    tls_cert: Annotated[
        str | None,
        Meta(description=(
            "PEM certificate chain: serve HTTPS directly (needs tls_key)"
        )),
    ] = None
    tls_key: Annotated[
        str | None,
        Meta(description=(
            "PEM private key of tls_cert"
        )),
    ] = None
    admin_listen: Annotated[
        str | None,
        Meta(description=(
            "HOST:PORT for the operator API, dashboard and /metrics; when set, the main "
            "host:port serves only the agent endpoints (/v1/*)"
        )),
    ] = None
    metrics_public: Annotated[
        bool,
        Meta(description=(
            "serve /metrics without the admin token"
        )),
    ] = False
    log_format: Annotated[
        Literal['text', 'json'],
        Meta(description=(
            "server log lines: text, or json (one object per line)"
        )),
    ] = "text"
    session_ttl_s: Annotated[
        float,
        Meta(gt=0, description=(
            "dashboard login session lifetime, seconds"
        )),
    ] = 43200.0
    admin_failures_per_minute: Annotated[
        int,
        Meta(ge=1, description=(
            "failed admin-token attempts (dashboard logins, bearer tokens) one client address "
            "may make in a minute; beyond it `429` with Retry-After, the token not even compared"
        )),
    ] = 10
    model_refit_interval_s: Annotated[
        float,
        Meta(gt=0, description=(
            "the rate model (docs/discovery.md) refits when measurements arrive, at most once "
            "this many seconds, off the event loop; requests use the latest fit"
        )),
    ] = 30.0
    plan_horizon_hours: Annotated[
        float,
        Meta(gt=0, description=(
            "plan and autopilot: how long a host worth keeping is expected to run, hours (its "
            "saving over this pays for its trial)"
        )),
    ] = 168.0
    plan_fleet_hosts: Annotated[
        int,
        Meta(ge=1, le=1000, description=(
            "plan: with nothing proving and no autopilot target, a trial is valued by what it "
            "would do to the $/proof of the best fleet of this many hosts the model can build "
            "from the offers (predicted; a measured machine at its runs), and the reference is "
            "its last host (docs/discovery.md, 'The reference')"
        )),
    ] = 10
    plan_belief_test_share: Annotated[
        float,
        Meta(ge=0, le=0.5, description=(
            "plan and autopilot: the share of trials that test what the rate model rules out "
            "where nothing like the offer was measured (docs/discovery.md, 'Testing what the "
            "model rules out'); 0 plans on expected value alone. On the simulator's live "
            "market the tests raised regret; the market bench, on markets unlike it, plans "
            "with 0.25"
        )),
    ] = 0.0
    idle_after_s: Annotated[
        float,
        Meta(ge=0, description=(
            "a proving instance that completes no proof for this long (cuzk's counter, from its "
            "heartbeats; simulated seconds on the local fleet) shows as idle: not counted as "
            "fleet output, reported in status, the dashboard and /metrics (0: never)"
        )),
    ] = 900.0
    idle_destroy_after_s: Annotated[
        float,
        Meta(ge=0, description=(
            "destroy a deployed instance idle this long, after a warning when it turns idle "
            "(so VM_IDLE_AFTER_S + this without a proof; SkyPilot's autostop and dstack's "
            "idle_duration stop idle machines by default too: docs/operations.md, 'The work "
            "command and idle instances'); 0: only report it; a bring-your-own agent is "
            "never destroyed"
        )),
    ] = 900.0
    curio_db_url: Annotated[
        str | None,
        Meta(description=(
            "production as the cluster records it: a PostgreSQL URL of Curio's HarmonyDB "
            "(read-only role; e.g. postgresql://vm_reader:PASS@db:5433/yugabyte), read once a "
            "monitor round; unset: the agents' cuzk counters only (docs/operations.md, "
            "Production as the cluster records it)"
        )),
    ] = None
    curio_db_schema: Annotated[
        str,
        Meta(description=(
            "the schema Curio's tables live in (Curio's default: curio): letters, digits "
            "and _"
        )),
    ] = "curio"
    curio_tasks: Annotated[
        str,
        Meta(description=(
            "the Curio task names that count as proofs, comma-separated (each at most 16 "
            "letters, digits or _: Curio's varchar(16))"
        )),
    ] = "PSProve,PoRep,UpdateProve"
    curio_read_timeout_s: Annotated[
        float,
        Meta(gt=0, le=300, description=(
            "longest a read of the cluster's database may take (connect and query), seconds; "
            "longer counts as the source unavailable"
        )),
    ] = 10.0
    curio_window_s: Annotated[
        float,
        Meta(ge=600, description=(
            "the delivered rate is taken over this much of the latest proving, seconds; an "
            "instance is judged on it once it has proved for half of it"
        )),
    ] = 3600.0
    curio_failures_flag: Annotated[
        int,
        Meta(ge=1, description=(
            "failed proving tasks within the window that flag an instance, with the cluster's "
            "last error"
        )),
    ] = 3
    proof_price_usd: Annotated[
        float | None,
        Meta(gt=0, description=(
            "what one delivered proof earns, US dollars; with it (or VM_PROOF_PRICE_FIL and "
            "VM_FIL_USD) every view shows revenue and profit and the minimum rate is the "
            "break-even rate of the full bill instead of VM_MAX_USD_PER_PROOF's"
        )),
    ] = None
    proof_price_fil: Annotated[
        float | None,
        Meta(gt=0, description=(
            "what one delivered proof earns, FIL (the Snark Market's Price FIL/p); needs "
            "VM_FIL_USD"
        )),
    ] = None
    fil_usd: Annotated[
        float | None,
        Meta(gt=0, description=(
            "US dollars per FIL, for VM_PROOF_PRICE_FIL"
        )),
    ] = None
    production_token: Annotated[
        str,
        Meta(description=(
            "the bearer token of POST /api/production alone (a cluster's own counts; never "
            "the admin token), rules as VM_ADMIN_TOKEN's; unset: the endpoint is refused"
        )),
    ] = ""
    autopilot: Annotated[
        bool,
        Meta(description=(
            "run the autopilot (`serve --autopilot`; docs/discovery.md)"
        )),
    ] = False
    autopilot_target_rate_per_hour: Annotated[
        Annotated[float, Meta(gt=0)] | None,
        Meta(description=(
            "autopilot: the fleet's target rate, proofs/hour (required with the autopilot)"
        )),
    ] = None
    autopilot_max_dph_total: Annotated[
        Annotated[float, Meta(gt=0)] | None,
        Meta(description=(
            "autopilot: hard cap on the fleet's price, $/hour, trials included (required)"
        )),
    ] = None
    autopilot_max_instances: Annotated[
        Annotated[int, Meta(ge=1)] | None,
        Meta(description=(
            "autopilot: hard cap on instances billing at once (required)"
        )),
    ] = None
    autopilot_max_explore_share: Annotated[
        float,
        Meta(ge=0, le=1, description=(
            "autopilot: at its target, it explores only while trials stay within this share of "
            "the spend over autopilot_spend_window_h"
        )),
    ] = 0.15
    autopilot_max_concurrent_trials: Annotated[
        int,
        Meta(ge=1, description=(
            "autopilot: most trials under way at once"
        )),
    ] = 2
    autopilot_explore_interval_s: Annotated[
        float,
        Meta(ge=0, description=(
            "autopilot: least time between two explorations, seconds"
        )),
    ] = 3600.0
    autopilot_interval_s: Annotated[
        float,
        Meta(gt=0, description=(
            "autopilot: seconds between two decisions"
        )),
    ] = 120.0
    autopilot_spend_window_h: Annotated[
        float,
        Meta(gt=0, description=(
            "autopilot: the spend the exploration share is measured on, the last this many hours"
        )),
    ] = 168.0
    autopilot_filter: Annotated[
        str | None,
        Meta(description=(
            "autopilot: offer filter of its searches, vast.ai CLI syntax; unset: VM_VAST_FILTER "
            "or the provider's default"
        )),
    ] = None
    # The whole bill (docs/operations.md, "What an instance costs" and "The account").
    setup_download_gb: Annotated[
        float,
        Meta(ge=0, description=(
            "GB a fresh instance downloads before it proves (the image and the ~45 GiB of "
            "parameters): priced at each offer's inet_down_cost and spread over "
            "plan_horizon_hours in every $/hour figure"
        )),
    ] = 50.0
    balance_warn_usd: Annotated[
        float,
        Meta(description=(
            "vast.ai balance below this: a warning on the dashboard, in status and the log"
        )),
    ] = 20.0
    balance_pause_usd: Annotated[
        float,
        Meta(description=(
            "vast.ai balance below this: deploys and the autopilot pause until it is back above"
        )),
    ] = 2.0
    strike_limit: Annotated[
        int,
        Meta(ge=1, description=(
            "failed trials (stuck loading, no hello, timeouts, crashes, implausible results) "
            "within strike_window_s that block a machine"
        )),
    ] = 3
    strike_window_s: Annotated[
        float,
        Meta(gt=0, description=(
            "strikes older than this no longer count"
        )),
    ] = 7 * 86400.0
    strike_block_s: Annotated[
        float,
        Meta(gt=0, description=(
            "how long a struck-out machine stays blocked"
        )),
    ] = 7 * 86400.0
    interruptible_trials: Annotated[
        bool,
        Meta(description=(
            "the autopilot's trials rent interruptible instances at a bid (vast.ai only; "
            "docs/operations.md, Interruptible trials)"
        )),
    ] = False
    interruptible_bid_share: Annotated[
        float,
        Meta(gt=0, le=1, description=(
            "an interruptible trial bids this share of the offer's on-demand rent (at least "
            "the offer's min_bid)"
        )),
    ] = 0.6
    # Resolved by from_env, not settings (RESOLVED_FIELDS).
    fleet_secrets: tuple[bytes, ...] = ()
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
        return msgspec.structs.replace(self, **values)

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
        _check_earnings(values)
        _check_curio(values)
        if values["production_token"]:
            check_admin_token(values["production_token"], "VM_PRODUCTION_TOKEN")
            if values["production_token"] == values["admin_token"]:
                raise ValueError("VM_PRODUCTION_TOKEN must differ from VM_ADMIN_TOKEN")

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


def _env_name(name: str, extra: Mapping[str, Any]) -> str:
    return ENV_PREFIX + name.upper()


SETTINGS: tuple[Setting, ...] = settings_table.declared(Settings, _env_name, RESOLVED_FIELDS)
_BY_NAME = {s.name: s for s in SETTINGS}
#: Every setting at its default, for code that needs one without an environment.
DEFAULTS = Settings()


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


def _check_discovery(values: dict[str, Any]) -> None:
    """The autopilot's caps: hard limits with no default, so required to run it (their
    bounds are in their rows)."""
    for name in ("autopilot_target_rate_per_hour", "autopilot_max_dph_total",
                 "autopilot_max_instances"):
        if values[name] is None and values["autopilot"]:
            raise ValueError(f"{_BY_NAME[name].env} must be set to run the autopilot "
                             "(its caps are hard limits, with no default)")


_SQL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
_TASK_NAME = re.compile(r"[A-Za-z0-9_]{1,16}")


def _check_curio(values: dict[str, Any]) -> None:
    """The cluster source's names go into SQL as parameters or a search_path: refuse
    anything but plain names."""
    if not _SQL_NAME.fullmatch(values["curio_db_schema"] or ""):
        raise ValueError("VM_CURIO_DB_SCHEMA must be letters, digits and _ (at most 63), "
                         "starting with a letter or _")
    if not all(_TASK_NAME.fullmatch(t) for t in (values["curio_tasks"] or "").split(",")):
        raise ValueError("VM_CURIO_TASKS must be task names (letters, digits, _; at most 16 "
                         "each), comma-separated")
    url = values["curio_db_url"]
    if url and not url.startswith(("postgresql://", "postgres://")):
        raise ValueError("VM_CURIO_DB_URL must be a postgresql:// URL")


def curio_tasks(settings: Settings) -> tuple[str, ...]:
    """VM_CURIO_TASKS as a tuple of task names."""
    return tuple(t for t in settings.curio_tasks.split(",") if t)


def _check_earnings(values: dict[str, Any]) -> None:
    """A proof's price: in dollars, or in FIL with the exchange rate; never both ways."""
    fil, rate, usd = values["proof_price_fil"], values["fil_usd"], values["proof_price_usd"]
    if (fil is None) != (rate is None):
        raise ValueError("VM_PROOF_PRICE_FIL and VM_FIL_USD go together: set both or neither")
    if fil is not None and usd is not None:
        raise ValueError("set VM_PROOF_PRICE_USD or VM_PROOF_PRICE_FIL with VM_FIL_USD, "
                         "not both")


def check_admin_token(token: str, variable: str = "VM_ADMIN_TOKEN") -> None:
    """Refuse a token too weak to stand guessing (ValueError naming the rule, never the
    token): with failed attempts throttled per address (``vast_manager.coordinator.web.guard``), 16
    random hex characters (64 bits) take longer than the universe's age to guess."""
    if len(token) < MIN_ADMIN_TOKEN_CHARS:
        raise ValueError(f"{variable} must be at least {MIN_ADMIN_TOKEN_CHARS} characters")
    if not all("!" <= c <= "~" for c in token):
        raise ValueError(f"{variable} must be printable ASCII without spaces")
    if len(set(token)) < MIN_ADMIN_TOKEN_DISTINCT_CHARS:
        raise ValueError(
            f"{variable} must hold at least {MIN_ADMIN_TOKEN_DISTINCT_CHARS} different "
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


#: The settings docs/operations.md's vast.ai section shows again (from the same rows).
VAST_SETTINGS = ("vast_image", "vast_onstart", "vast_runtype", "vast_env", "vast_image_login",
                 "vast_filter", "min_instance_ram_gb", "deploy_disk_gb", "max_deploy_dph_total",
                 "max_usd_per_proof", "monitor_interval_s", "unowned_grace_s",
                 "vast_searches_per_day", "vast_webhook_secret", "max_bid_per_hour")


def settings_markdown(names: tuple[str, ...] | None = None) -> str:
    """The settings table for the docs (variable, default, allowed values, meaning): every
    setting, or those ``names``."""
    rows = SETTINGS if names is None else tuple(_BY_NAME[n] for n in names)
    return settings_table.markdown(rows)


def settings_help() -> str:
    """Every setting as plain text, for ``vast-manager serve --help``."""
    return settings_table.help_text(SETTINGS)


def default_text(name: str) -> str:
    """``[default: X]`` of one setting, for a command-line option that sets it."""
    return settings_table.default_text(_BY_NAME[name])
