"""`vast-manager`: the coordinator server and the operator's command line.

Thin click commands: each parses its options, calls one function of the core
or one operator API endpoint, and prints a table or JSON. Errors become one
line on stderr and an exit code:

\b
  0  success
  1  the coordinator refused the request (the message says why)
  2  bad usage: a flag, a setting or a path that cannot work (the message names it
     and what to do)
  3  the coordinator could not be reached (or the address answers, but is not a
     vast-manager coordinator)
  4  the demo ended without its expected outcome

Every error is one line on stderr, never a traceback (``OneLineErrors``).
"""

from __future__ import annotations

import functools
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click
import orjson

from vast_manager.coordinator import textsafe
from vast_manager.coordinator.cli import render
from vast_manager.coordinator.cli.api_client import DEFAULT_URL, OperatorClient, OperatorError
from vast_manager.coordinator.cli.text_views import delivered_cell
from vast_manager.coordinator.decisions.states import GONE as GONE_STATES
from vast_manager.coordinator.operations.spend import spend_line
from vast_manager.coordinator.settings import DEFAULTS, default_text, settings_help
from vast_manager.coordinator.textsafe import clean

F = TypeVar("F", bound=Callable[..., Any])

EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3

#: The serve flags of the settings they set: an error names the flag the operator typed
#: (and the variable, which sets the same).
SERVE_FLAGS = {
    "VM_DB_PATH": "--db", "VM_HOST": "--host", "VM_PORT": "--port",
    "VM_TLS_CERT": "--tls-cert", "VM_TLS_KEY": "--tls-key",
    "VM_ADMIN_LISTEN": "--admin-listen", "VM_AUTOPILOT_TARGET_RATE_PER_HOUR": "--target-rate",
    "VM_AUTOPILOT_MAX_DPH_TOTAL": "--max-dph", "VM_AUTOPILOT_MAX_INSTANCES": "--max-instances",
    "VM_AUTOPILOT_MAX_EXPLORE_SHARE": "--explore-share", "VM_AUTOPILOT": "--autopilot",
}


class UserError(click.ClickException):
    """A mistake of the operator's (a flag, a setting, a path): one line, exit 2."""

    exit_code = EXIT_USAGE


def flag_named(message: str) -> str:
    """``message`` with each serve setting's variable named as its flag first."""
    for env, flag in SERVE_FLAGS.items():
        message = re.sub(rf"\b{env}\b", f"{flag} ({env})", message)
    return message


class OneLineErrors(click.Group):
    """Every error one line on stderr with its exit code: click's usage errors too
    (normally three lines with the usage), and anything unexpected, which says where
    to look instead of showing a traceback."""

    def main(  # type: ignore[override]
        self, args: Sequence[str] | None = None, prog_name: str | None = None,
        complete_var: str | None = None, standalone_mode: bool = True, **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, False, **extra)
        except click.exceptions.NoArgsIsHelpError as err:
            click.echo(err.ctx.get_help() if err.ctx else str(err))
            sys.exit(0)
        except click.UsageError as err:
            where = err.ctx.command_path if err.ctx else "vast-manager"
            click.echo(f"Error: {clean(err.format_message())} (see {where} --help)", err=True)
            sys.exit(EXIT_USAGE)
        except click.ClickException as err:
            click.echo(f"Error: {clean(err.format_message())}", err=True)
            sys.exit(err.exit_code)
        except click.Abort:
            click.echo("Aborted.", err=True)
            sys.exit(EXIT_REFUSED)
        except (KeyboardInterrupt, EOFError):
            click.echo("Interrupted.", err=True)
            sys.exit(130)
        except Exception as err:  # a bug: still one line, the traceback on request
            if os.environ.get("VM_CLI_TRACEBACK"):
                raise
            click.echo(f"Error: unexpected {err.__class__.__name__}: {clean(str(err))} (a bug; "
                       "VM_CLI_TRACEBACK=1 shows where)", err=True)
            sys.exit(EXIT_REFUSED)
        sys.exit(code if isinstance(code, int) else 0)


def stored_admin_token() -> str | None:
    """The admin token ``serve`` generated and kept beside the database
    (``<VM_DB_PATH>.admin-token``, docs/operations.md), when VM_ADMIN_TOKEN is unset and
    the file can be read; None otherwise."""
    db = os.environ.get("VM_DB_PATH") or DEFAULTS.db_path
    try:
        text = Path(db + ".admin-token").read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text or None


def operator_options(fn: F) -> F:
    """``--url`` and the admin token, shared by every command that talks to a coordinator."""

    @click.option(
        "--url",
        envvar="VM_URL",
        default=DEFAULT_URL,
        show_default=True,
        help="Coordinator URL (env VM_URL).",
    )
    @click.option(
        "--token",
        envvar="VM_ADMIN_TOKEN",
        default=None,
        show_default=False,
        help="Admin token (env VM_ADMIN_TOKEN; prefer the environment over the flag); unset: "
             "the one `serve` generated beside the database, <VM_DB_PATH>.admin-token.",
    )
    @functools.wraps(fn)
    def wrapper(*args: Any, url: str, token: str | None, **kwargs: Any) -> Any:
        client = OperatorClient(url, token or stored_admin_token())
        try:
            return fn(client, *args, **kwargs)
        except OperatorError as err:
            # The message may quote what a host sent (a label, a machine id): shown as text.
            click.echo(f"Error: {clean(str(err))}", err=True)
            sys.exit(EXIT_REFUSED if err.status else EXIT_UNREACHABLE)

    return wrapper  # type: ignore[return-value]


def json_option(fn: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")(
        fn
    )


def echo_json(value: Any) -> None:
    click.echo(textsafe.json_safe(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()))


@click.group(cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="vast-manager")
def cli() -> None:
    """Run a fleet of rented vast.ai GPU machines proving with CuZK, and keep only
    the ones worth their price.

    \b
    Start here:
      vast-manager demo            the whole lifecycle on a local simulated fleet
      vast-manager serve           run a coordinator (agents + operator API)
      vast-manager status          the fleet, from a running coordinator

    \b
    Exit codes: 0 success; 1 the coordinator refused the request (the
    message says why); 2 bad usage: a flag, setting or path that cannot work
    (the message names it and the fix); 3 the coordinator could not be
    reached, is not a vast-manager coordinator, or no VM_ADMIN_TOKEN; 4 the
    demo ended without its expected outcome. Errors are one line on stderr.
    """


# --- server ----------------------------------------------------------------------


# Every setting, from its one declaration (coordinator/settings.py): `serve --help` ends with
# them, and a flag that sets one shows its default from there.
SERVE_EPILOG = "\b\nSettings (environment, or the flag named above):\n" + "\n".join(
    "  " + line for line in settings_help().splitlines())


@cli.command(epilog=SERVE_EPILOG, context_settings={"max_content_width": 120})
@click.option("--db", "db_path", default=None,
              help=f"SQLite file{default_text('db_path')} (env VM_DB_PATH).")
@click.option("--host", default=None, help=f"Listen address{default_text('host')} (env VM_HOST).")
@click.option("--port", type=int, default=None,
              help=f"Listen port{default_text('port')} (env VM_PORT).")
@click.option(
    "--provider",
    type=click.Choice(["local", "vast", "fake"]),
    default="local",
    show_default=True,
    help="Where instances come from: the local simulated fleet, vast.ai (VAST_API_KEY), or "
    "the project's fake vast.ai in this process, for drills (`vast-manager fake --help`).",
)
@click.option("--tls-cert", default=None,
              help="PEM certificate chain: serve HTTPS directly (env VM_TLS_CERT; with --tls-key).")
@click.option("--tls-key", default=None, help="PEM private key of --tls-cert (env VM_TLS_KEY).")
@click.option(
    "--admin-listen",
    default=None,
    metavar="HOST:PORT",
    help="Serve the operator API, dashboard and /metrics here; --host/--port then answer "
    "only the agents (/v1/*) (env VM_ADMIN_LISTEN).",
)
@click.option("--metrics-public", is_flag=True, default=None,
              help="Serve /metrics without the admin token (env VM_METRICS_PUBLIC).")
@click.option("--log-json", is_flag=True, default=None,
              help="Log one JSON object per line on stderr (env VM_LOG_FORMAT=json).")
@click.option("--autopilot", "autopilot", is_flag=True, default=None,
              help="Run the autopilot (off by default; env VM_AUTOPILOT): it keeps the fleet "
              "at --target-rate for the least per proof, within the caps below.")
@click.option("--target-rate", type=float, default=None, metavar="PROOFS_PER_HOUR",
              help="Autopilot: the fleet's target rate (env VM_AUTOPILOT_TARGET_RATE_PER_HOUR).")
@click.option("--max-dph", type=float, default=None, metavar="USD_PER_HOUR",
              help="Autopilot: hard cap on the fleet's $/hour (env VM_AUTOPILOT_MAX_DPH_TOTAL).")
@click.option("--max-instances", type=int, default=None,
              help="Autopilot: hard cap on instances (env VM_AUTOPILOT_MAX_INSTANCES).")
@click.option("--explore-share", type=float, default=None, metavar="0-1",
              help="Autopilot: trials' most share of spend, 0-1"
              f"{default_text('autopilot_max_explore_share')} (env "
              "VM_AUTOPILOT_MAX_EXPLORE_SHARE).")
def serve(
    db_path: str | None,
    host: str | None,
    port: int | None,
    provider: str,
    tls_cert: str | None,
    tls_key: str | None,
    admin_listen: str | None,
    metrics_public: bool | None,
    log_json: bool | None,
    autopilot: bool | None,
    target_rate: float | None,
    max_dph: float | None,
    max_instances: int | None,
    explore_share: float | None,
) -> None:
    """Run the coordinator: agent endpoints, operator API, web dashboard (at /),
    /metrics, monitor loop.

    The fleet secret comes from VM_FLEET_SECRET (generated into a 0600 file in
    your config directory when unset) and the admin token from VM_ADMIN_TOKEN
    (generated and printed once when unset; with JSON logs, written to
    admin-token in the config directory instead). Log in to the dashboard
    with the admin token.

    With --autopilot the coordinator deploys and terminates by itself (every
    action an event with its reason); `vast-manager autopilot stop` stops it,
    and a restart does not resume it until `vast-manager autopilot start`.

    \b
    Examples:
      VM_ADMIN_TOKEN=$(openssl rand -hex 24) vast-manager serve --db fleet.db
      vast-manager serve --host 0.0.0.0 --port 8420 --admin-listen 127.0.0.1:8421 \\
          --tls-cert fullchain.pem --tls-key privkey.pem --log-json
      vast-manager serve --provider vast --autopilot --target-rate 400 --max-dph 4 \\
          --max-instances 12
    """
    from vast_manager.coordinator.settings import Settings
    from vast_manager.coordinator.web.server import ServeConfigError, run_server

    options: dict[str, Any] = {
        "db_path": db_path, "host": host, "port": port, "tls_cert": tls_cert,
        "tls_key": tls_key, "admin_listen": admin_listen,
        "metrics_public": True if metrics_public else None,
        "log_format": "json" if log_json else None,
        "autopilot": True if autopilot else None,
        "autopilot_target_rate_per_hour": target_rate,
        "autopilot_max_dph_total": max_dph,
        "autopilot_max_instances": max_instances,
        "autopilot_max_explore_share": explore_share,
    }
    overrides = {name: value for name, value in options.items() if value is not None}
    try:
        settings = Settings.from_env(os.environ, **overrides)
    except ValueError as err:
        raise UserError(flag_named(str(err))) from None
    from vast_manager.coordinator.providers.vast.provider import ProviderConfigError
    from vast_manager.coordinator.store.dbfile import DatabaseFileError
    from vast_manager.coordinator.store.replica import ReplicaError

    try:
        run_server(settings, provider)
    except (ProviderConfigError, ServeConfigError, DatabaseFileError, ReplicaError) as err:
        # No API key, an unreadable certificate, a port in use, a database path that
        # cannot work or another coordinator on it: refused before anything is written.
        raise UserError(flag_named(str(err))) from None


@cli.command()
@click.option("--from", "source", required=True, metavar="URL",
              help="The replica: what VM_REPLICA_URL named (a folder, s3://..., sftp://...).")
@click.option("--db", "db_path", required=True, metavar="PATH",
              help="Where to write the database (a new path; an existing one needs --force).")
@click.option("--at", "at", type=click.DateTime(["%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%dT%H:%M:%S"]),
              default=None, metavar="YYYY-MM-DDTHH:MM:SSZ",
              help="The state at this time (UTC) instead of the newest.")
@click.option("--force", is_flag=True, help="Replace an existing database that is not live.")
def restore(source: str, db_path: str, at: Any, force: bool) -> None:
    """Restore the coordinator's database from its replica (VM_REPLICA_URL).

    Writes the newest state (or the state --at a time) into a new file with
    Litestream, checks it (PRAGMA integrity_check), then moves it to --db. Refuses a
    live database: one a coordinator serves, or whose -wal file still holds writes.
    Then run serve on it at the coordinator's address: agents replay what the
    replica had not yet received (docs/operations.md, "Losing the coordinator").

    \b
    Example:
      vast-manager restore --from s3://bucket/fleet --db /srv/vm/fleet.db
      vast-manager restore --from /backup/fleet --db fleet.db --at 2026-12-05T16:00:00Z
    """
    from vast_manager.coordinator.store.restore import RestoreError
    from vast_manager.coordinator.store.restore import restore as restore_db

    try:
        done = restore_db(source, db_path, at=at, force=force)
    except RestoreError as err:
        raise UserError(str(err)) from None
    click.echo(f"restored {done.db_path} from {source} in {done.seconds:.1f} s "
               f"({done.size_bytes / 1e6:.1f} MB, {done.instances} instances, "
               f"{done.results} results, integrity ok)")


@cli.command()
@click.option(
    "--time-scale",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Simulated seconds per real second [default: chosen to finish in about a minute].",
)
@click.option("--keep", "keep_dir", default=None,
              help="Keep the demo's files in this folder (new or empty: an earlier demo's "
              "database there is refused, not reused).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0, min_open=True),
              default=150.0, show_default=True,
              help="Give up after this many seconds.")
def demo(time_scale: float | None, keep_dir: str | None, timeout_s: float) -> None:
    """Run the whole lifecycle on a local simulated fleet, in about a minute.

    Starts a coordinator on a fresh SQLite file, deploys every offer of the
    local catalog through the LocalProvider (agents on the simulated cuzk),
    shows the fleet live, and ends with each instance's outcome and reason,
    host_perf, the bad hosts, the scaling verdicts and the offers ranked by
    cost per proof. All rates are simulated. Nothing is left running.

    \b
    Example:
      vast-manager demo
    """
    from vast_manager.coordinator.cli.demo import DemoSetupError, run_demo

    try:
        code = run_demo(time_scale=time_scale, keep_dir=keep_dir, timeout_s=timeout_s)
    except DemoSetupError as err:
        raise UserError(str(err)) from None
    sys.exit(code)


# --- fleet -------------------------------------------------------------------------


def _progress(p: Any) -> str:
    if not p:
        return "-"
    done, total, unit = p.get("done"), p.get("total"), p.get("unit")
    if unit == "bytes" and total:
        return f"{100.0 * done / total:.0f}%"
    return f"{done}/{total} {unit or ''}".strip()


#: Instances per request while ``status`` pages through the fleet.
STATUS_PAGE = 5000


def _vast_lines(fleet: dict[str, Any]) -> None:
    """vast.ai's search quota when it is spent, and each host's pending price increase with
    the coordinator's verdict (docs/vast.md)."""
    alert = (fleet.get("offer_cache") or {}).get("alert")
    if alert:
        click.echo(textsafe.neutralise(str(alert)))
    for p in fleet.get("pending_price_increases") or []:
        click.echo(textsafe.neutralise(
            f"Instance {p.get('instance_id')}: price increase {p.get('pending_price_increase_id')} "
            f"({p.get('verdict')}): {p.get('reason')}"))


def _account_line(client: OperatorClient) -> None:
    """The vast.ai account in one line, and why deploys wait if they do (docs/operations.md,
    "The account"); nothing with a provider that has no account."""
    from vast_manager.coordinator.cli import text_views

    fleet = client.get("/api/fleet")
    for line in text_views.fleet_production_lines(fleet):
        click.echo(line)
    _vast_lines(fleet)
    account = fleet.get("account") or {}
    funds = account.get("funds_usd")
    for fault in fleet.get("faults") or []:
        click.echo(textsafe.neutralise(
            f"FAULT {fault.get('id')}: deploys and the autopilot paused: {fault.get('cause')}. "
            f"Fix: {fault.get('fix')}"), err=True)
    if ((fleet.get("spend") or {}).get("all_time") or {}).get("total"):
        click.echo(render.wrap(spend_line(fleet["spend"]), render.terminal_width(), "  "))
    if funds is None and account.get("auth_ok", True):
        return
    # The warning already names the funds: they are said once.
    fake = fleet.get("provider") == "fake"
    parts = [] if account.get("warning") else (
        [f"{'fake ' if fake else ''}vast.ai funds {render.usd(funds, 2)}"
         + (" (simulated)" if fake else "")] if funds is not None else ["vast.ai"])
    if not account.get("auth_ok", True):
        parts.append(f"API key refused: {account.get('auth_error')}")
    elif account.get("warning"):
        parts.append(str(account["warning"]))
    if account.get("paused"):
        parts.append("deploys and the autopilot paused")
    click.echo(textsafe.neutralise("; ".join(parts)))


#: Gone instances ``status`` lists without ``--all`` or ``--state``: the last day's.
RECENT_GONE_S = 24 * 3600.0


def shown_state(row: dict[str, Any]) -> str:
    """The state a table shows: ``idle`` for a proving instance completing nothing (a
    ``--state`` value like the others), else the instance's state."""
    return "idle" if row.get("idle") else str(row.get("state"))


def provider_cell(row: dict[str, Any]) -> str:
    """vast.ai's view beside ours: its instance id and its actual_status, as last listed."""
    pid = row.get("provider_instance_id")
    if pid is None:
        return "-"
    if row.get("provider") == "local":
        return f"local {pid}"
    fake = "fake " if row.get("provider") == "fake" else ""
    return f"{fake}{pid} {row.get('provider_status') or '?'}"


def status_row(r: dict[str, Any], now: float) -> tuple[Any, ...]:
    """One instance as ``status`` shows it: a lost or idle instance proves nothing now, so
    it has no rate and no $/proof (docs/operations.md, "One reading")."""
    silent = r.get("idle") or r.get("state") == "lost"
    seen = r.get("last_seen")
    billed = (r.get("cost") or {}).get("billed") or {}
    return (
        r.get("id"),
        shown_state(r),
        # A gone instance's last heartbeat phase (terminating) is history.
        "-" if r.get("state") in GONE_STATES else r.get("phase"),
        _progress(r.get("progress")),
        f"{r.get('num_gpus') or '?'}x {r.get('gpu_name') or '?'}",
        render.usd(r.get("billing_now_per_hour"), 3),
        "-" if silent else render.num(r.get("rate_per_hour"))
        + (" (sim)" if render.simulated(r) and r.get("rate_per_hour") else ""),
        render.num(r.get("completed_rate_per_hour")),
        delivered_cell(r),
        "-" if silent else render.usd(r.get("usd_per_proof")),
        render.usd(r.get("profit_per_hour"), 3),
        render.usd(billed.get("total"), 2),
        render.ago(seen, now)
        + (" (before restart)" if seen is not None and r.get("heard_since_start") is False
           else ""),
        provider_cell(r),
        r.get("label"),
    )


STATUS_HEADERS = ("ID", "STATE", "PHASE", "PROGRESS", "GPUS", "$/H", "RATE/H", "DONE/H",
                  "DELIVERED/H", "$/PROOF", "PROFIT/H", "SPENT", "LAST SEEN", "VAST.AI",
                  "LABEL")
#: Priorities at a narrow width: LABEL narrows first, then these leave, GPUS gives way last.
STATUS_DROP = ("PHASE", "LABEL", "DONE/H", "PROGRESS", "PROFIT/H", "LAST SEEN", "SPENT",
               "DELIVERED/H")


def _replica_line(client: OperatorClient) -> None:
    """The database's replication in one line (docs/operations.md, "Losing the
    coordinator"); nothing from a coordinator that does not say."""
    replica = client.get("/api/fleet").get("replica")
    if not isinstance(replica, dict):
        return
    if not replica.get("configured"):
        click.echo("replica: none, the fleet's state is on one disk (set VM_REPLICA_URL)")
        return
    lag = replica.get("lag_s")
    synced = "never confirmed" if lag is None else f"last sync {lag:.0f} s ago"
    trouble = replica.get("error")
    line = f"replica {replica.get('url')}: {synced}"
    if trouble or not replica.get("running"):
        line += f"; NOT replicating: {trouble or 'litestream is not running'}"
    click.echo(textsafe.neutralise(line))


@cli.command()
@click.option("--state", "states", multiple=True, metavar="STATE[,STATE...]",
              help="Only instances in these states (repeat it, or separate with commas); "
                   "`idle` is a proving instance that completes nothing.")
@click.option("--all", "show_all", is_flag=True,
              help="Also instances destroyed or vanished more than a day ago.")
@json_option
@operator_options
def status(client: OperatorClient, states: tuple[str, ...], show_all: bool,
           as_json: bool) -> None:
    """The fleet: every instance with state, phase, rate, cost per proof, what it has
    cost so far and vast.ai's own view (its instance id and actual_status).

    Above the table, one line on the vast.ai account when it matters: its funds, a
    refused key, and whether deploys are paused (and why); and one on the database's
    replica (VM_REPLICA_URL): the age of its last confirmed sync. $/H is what the
    instance bills now by vast.ai's last listed status (no rent while stopped).
    Instances gone more than a day ago are left out unless --all or --state asks for
    them. With --json each instance carries "cost": rent, storage and bandwidth per
    hour, per proof and billed so far.

    Read a page at a time (5,000 instances), so a large fleet never makes one huge
    answer. With --json: the API's list, indented on a terminal and compact when piped.

    \b
    Example:
      vast-manager status --url http://coordinator:8420
      vast-manager status --state proving,idle --json
    """
    named = [part.strip().lower() for value in states for part in value.split(",")]
    query: dict[str, Any] = {"state": ",".join(named)} if named else {}
    if not named and not show_all:
        query["gone_since"] = int(time.time() - RECENT_GONE_S)
    if as_json:
        if sys.stdout.isatty():
            echo_json(client.get_list("/api/instances", STATUS_PAGE, **query))
        else:  # for a script: the API's own JSON, compact, without a parse and re-encode
            raw = client.get_list_bytes("/api/instances", STATUS_PAGE, **query)
            click.echo(textsafe.json_safe(raw.decode()))
        return
    rows = client.get_list("/api/instances", STATUS_PAGE, **query)
    _account_line(client)
    _replica_line(client)
    if not rows:
        click.echo(f"No instances in {', '.join(named)}." if named else "No instances.")
        return
    now = time.time()
    click.echo(render.table((status_row(r, now) for r in rows), STATUS_HEADERS,
                            width=render.terminal_width(), shrink=("LABEL",),
                            drop=STATUS_DROP, keep=("GPUS",)))
    if any(r.get("state") == "proving" for r in rows):
        click.echo(render.wrap(
            "RATE/H: the benchmark's proofs/hour; DONE/H: what cuzk completed over the last "
            "hour of proving; DELIVERED/H: what the cluster recorded (Curio's rows), with "
            "failed tasks after /; PROFIT/H: revenue less the full bill (with a proof price "
            "set); SPENT: billed so far.", render.terminal_width()))
    for r in rows:
        if r.get("idle"):
            stop_at = r.get("idle_stop_at")
            then = (f"; destroyed {render.until(stop_at, now)} unless a proof completes"
                    if stop_at is not None else "")
            click.echo(f"Warning: instance {r.get('id')} is idle, billing "
                       f"{render.usd(r.get('billing_now_per_hour'), 3)}/h for nothing: "
                       f"{clean(r.get('idle_reason'))}{then}.", err=True)
    if any(render.simulated(r) for r in rows):
        click.echo("(sim): an instance on the simulated cuzk (the local provider or the fake "
                   "vast.ai): its rate and its bill are simulated.")


@cli.command("cost-report")
@click.option("--all", "show_all", is_flag=True,
              help="Also instances destroyed or vanished more than a day ago.")
@json_option
@operator_options
def cost_report(client: OperatorClient, show_all: bool, as_json: bool) -> None:
    """What the fleet has spent: today, this week and all time by part (rent, storage,
    bandwidth), then each instance's bill so far, dearest first.

    The same bills as the autopilot's ledger and /metrics' vm_spend_dollars: rent from
    the agent's hello while vast.ai runs it, storage from the deploy unless offline,
    the bytes its agent reported. Like `sky cost-report`.

    \b
    Example:
      vast-manager cost-report
      vast-manager cost-report --all --json
    """
    spent = client.get("/api/fleet").get("spend") or {}
    query: dict[str, Any] = {} if show_all else {
        "gone_since": int(time.time() - RECENT_GONE_S)}
    rows = client.get_list("/api/instances", STATUS_PAGE, **query)
    billed = sorted(((r, (r.get("cost") or {}).get("billed") or {}) for r in rows),
                    key=lambda rb: -float(rb[1].get("total") or 0.0))
    if as_json:
        echo_json({"spend": spent, "instances": [
            {"id": r.get("id"), "state": shown_state(r), "label": r.get("label"),
             "provider_instance_id": r.get("provider_instance_id"), "billed": b}
            for r, b in billed]})
        return
    width = render.terminal_width()
    click.echo(render.table(
        ((label, *(render.usd((spent.get(key) or {}).get(part), 2)
                   for part in ("rent", "storage", "bandwidth", "total")))
         for key, label in (("today", "today (UTC)"), ("week", "last 7 days"),
                            ("all_time", "all time"))),
        ["FLEET", "RENT", "STORAGE", "BANDWIDTH", "TOTAL"], width=width))
    click.echo("")
    if not billed:
        click.echo("No instances.")
        return
    click.echo(render.table(
        ((r.get("id"), shown_state(r), f"{r.get('num_gpus') or '?'}x {r.get('gpu_name') or '?'}",
          *(render.usd(b.get(part), 2) for part in ("rent", "storage", "bandwidth", "total")),
          r.get("label"))
         for r, b in billed),
        ["ID", "STATE", "GPUS", "RENT", "STORAGE", "BANDWIDTH", "TOTAL", "LABEL"],
        width=width, shrink=("LABEL",), drop=("LABEL",), keep=("GPUS",)))
    if not show_all:
        click.echo("(instances gone more than a day ago: --all; the fleet totals count them)")
    sources = sorted({source for r, _ in billed if (source := render.simulated(r))})
    if sources:
        click.echo(f"(simulated dollars: the {' and the '.join(sources)}'s instances)")


@cli.command()
@click.argument("instance_id", type=int)
@click.option("--results", "results_limit", type=click.IntRange(1, 200), default=20,
              show_default=True, help="Results to show, newest first.")
@click.option("--before", "results_before", type=click.IntRange(1), default=None,
              help="Only results older than this row id (the view says which to pass).")
@json_option
@operator_options
def instance(client: OperatorClient, instance_id: int, results_limit: int,
             results_before: int | None, as_json: bool) -> None:
    """One instance: its state, per-GPU telemetry, a page of its results and its
    decisions. INSTANCE_ID is the coordinator's id (the ID column of `vast-manager
    status`), not the provider's.

    \b
    Example:
      vast-manager instance 3
      vast-manager instance 3 --results 50 --before 120
    """
    from vast_manager.coordinator.cli.text_views import render_instance

    query = f"?results_limit={results_limit}" + (
        f"&results_before={results_before}" if results_before is not None else "")
    data = client.get(f"/api/instances/{instance_id}{query}")
    if as_json:
        echo_json(data)
        return
    click.echo(render_instance(data))


@cli.group(invoke_without_command=True)
@json_option
@operator_options
@click.pass_context
def hosts(ctx: click.Context, client: OperatorClient, as_json: bool) -> None:
    """Measured hosts (host_perf): best and median rate, samples (of them imported), cost
    per proof; `hosts import` and `hosts export` carry measurements in and out.
    Benchmarks an early verdict cut short, kept out of host_perf and the rate model,
    are listed below it, flagged EARLY.

    \b
    Examples:
      vast-manager hosts --json
      vast-manager hosts export > fleet.jsonl
      vast-manager hosts import earlier-manager.jsonl
    """
    if ctx.invoked_subcommand is not None:
        return
    rows = client.get("/api/host-perf")
    if as_json:
        echo_json(rows)
        return
    width = render.terminal_width()
    early = _early_verdicts(client.get("/api/events", limit=1000))
    if not rows:
        click.echo("No host measured yet.")
    else:
        _host_table(rows, width)
    if early:
        click.echo(render.wrap(
            "\nCut short by an early verdict (flagged EARLY; not in host_perf, and the rate "
            "model does not learn from them: a bound from the first proofs, not a measured "
            "rate):", width))
        click.echo(render.table(
            ((e.get("machine_id"), e.get("instance_id"), render.ago(e.get("ts")), "EARLY",
              e.get("reason")) for e in early),
            ["MACHINE", "INSTANCE", "WHEN", "FLAG", "VERDICT"], width=width))


def _early_verdicts(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The verdict events of benchmarks an early verdict terminated, newest first (an
    early pass lets the benchmark finish, and its result counts)."""
    return [e for e in events if e.get("kind") == "verdict"
            and "early verdict" in str(e.get("reason"))
            and not str(e.get("reason")).startswith("early pass")]


def _host_table(rows: list[dict[str, Any]], width: int | None) -> None:
    click.echo(
        render.table(
            (
                (
                    r.get("machine_id"),
                    r.get("gpu_name"),
                    r.get("num_gpus"),
                    render.num(r.get("median_rate_per_hour")),
                    render.num(r.get("best_rate_per_hour")),
                    render.num(r.get("last_rate_per_hour")),
                    r.get("samples"),
                    r.get("imported_samples") or 0,
                    render.usd(r.get("usd_per_proof")),
                )
                for r in rows
            ),
            ["MACHINE", "GPU", "N", "MEDIAN/H", "BEST/H", "LAST/H", "SAMPLES", "IMPORTED",
             "$/PROOF"],
            width=width,
        )
    )


#: Seconds `hosts import` waits for its answer (the import, then the refit on it).
IMPORT_TIMEOUT_S = 900.0


@hosts.command("import")
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--dry-run", is_flag=True,
              help="Show how the offers' ranking would move; write nothing.")
@json_option
@operator_options
def hosts_import(client: OperatorClient, file: str, dry_run: bool, as_json: bool) -> None:
    """Import measurements from a JSON Lines file (`-`: stdin), one a line:
    {"machine_id", "offer": {vast.ai offer fields}, "rate_per_hour", "measured_at"},
    and optionally "bottleneck": gpu, cpu, pcie or memory, the resource seen binding
    while the rate was measured (the model reads the CPU's and the link's).

    They count in host_perf and the rate model marked imported; where one disagrees
    with the fleet's own measurement of the same machine, the model leaves it out. A
    malformed line (or one over the bounds: 16 GPUs, 64 KiB a line, 1,024 characters
    a string, 4 levels of nesting, measured within the last two years) is reported
    with its number and field, and nothing of the file is written; a measurement
    already known is skipped. The import returns once the rate model is refitted on
    them, and says how long the fit took and how many measurements it used.

    \b
    Example:
      vast-manager hosts import --dry-run earlier-manager.jsonl
      vast-manager hosts import earlier-manager.jsonl
    """
    from vast_manager.coordinator.discovery.measurements import MAX_IMPORT_BYTES, NDJSON

    try:
        if file == "-":
            data = sys.stdin.buffer.read(MAX_IMPORT_BYTES + 1)
        else:
            with open(file, "rb") as f:
                data = f.read(MAX_IMPORT_BYTES + 1)
    except OSError as err:
        raise UserError(f"cannot read {file} ({err.strerror}); check the path") from None
    if len(data) > MAX_IMPORT_BYTES:
        raise UserError(
            f"{file} is larger than the {MAX_IMPORT_BYTES // (1024 * 1024)} MiB one import "
            "takes; split it into parts (each part is imported whole or not at all)")
    # The import returns after the rate model's refit on it: on many measurements that
    # takes longer than an ordinary request may (docs/discovery.md, in the coordinator).
    client.timeout_s = max(client.timeout_s, IMPORT_TIMEOUT_S)
    answer = orjson.loads(client.request_raw(
        "POST", "/api/hosts/import", data=data, content_type=NDJSON,
        query={"dry_run": "1"} if dry_run else None) or b"{}")
    if as_json:
        echo_json(answer)
        return
    click.echo(clean(answer.get("message") or "Imported."))
    if dry_run:
        moves = answer.get("moves") or []
        if not moves:
            click.echo("No offer's rank or predicted rate would move.")
            return
        click.echo(render.table(
            ((m.get("offer_id"), m.get("machine_id"),
              f"{m.get('num_gpus') or '?'}x {m.get('gpu_name') or '?'}",
              m.get("rank_before"), m.get("rank_after"), render.num(m.get("rate_before")),
              render.num(m.get("rate_after"))) for m in moves),
            ["OFFER", "MACHINE", "GPUS", "RANK", "RANK AFTER", "RATE/H", "RATE/H AFTER"]))


@hosts.command("export")
@click.option("--source", type=click.Choice(["fleet", "imported"]), default=None,
              help="Only the fleet's own measurements, or only imported ones [default: all].")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write to this file [default: stdout].")
@operator_options
def hosts_export(client: OperatorClient, source: str | None, output: str | None) -> None:
    """Every measurement with the hardware it ran on, as JSON Lines (the shape
    `hosts import` reads, with "source": fleet or imported).

    \b
    Example:
      vast-manager hosts export --source fleet > fleet.jsonl
    """
    if output is not None:
        folder = os.path.dirname(os.path.abspath(output))
        if not os.path.isdir(folder):
            raise UserError(f"-o {output}: the folder {folder} does not exist; create it or "
                            "pick another file")
        if not os.access(folder, os.W_OK):
            raise UserError(f"-o {output}: the folder {folder} is not writable; pick another "
                            "file")
    query = f"?source={source}" if source else ""
    data = client.request_raw("GET", "/api/hosts/export" + query)
    if output is None:
        # On a terminal, host text in the JSON is shown as JSON escapes (the same data,
        # inert); piped or written to a file, the bytes stay exact.
        sys.stdout.buffer.write(textsafe.json_safe(data.decode()).encode()
                                if sys.stdout.isatty() else data)
        sys.stdout.flush()
        return
    try:
        with open(output, "wb") as f:
            f.write(data)
    except OSError as err:
        raise UserError(f"-o {output} cannot be written ({err.strerror}); pick another "
                        "file") from None
    lines = data.count(b"\n")
    click.echo(f"{lines} measurement(s) written to {clean(output)}.", err=True)


@cli.group("bad-hosts")
def bad_hosts() -> None:
    """The blocklist: machines not deployed on until their block ends."""


@bad_hosts.command("list")
@json_option
@operator_options
def bad_hosts_list(client: OperatorClient, as_json: bool) -> None:
    """List blocked machines: why each was blocked (its evidence) and until when.

    \b
    Example:
      vast-manager bad-hosts list
    """
    rows = client.get("/api/bad-hosts")
    if as_json:
        echo_json(rows)
        return
    if not rows:
        click.echo("No bad hosts.")
        return
    now = time.time()
    click.echo(
        render.table(
            ((r.get("machine_id"), r.get("source"), render.ago(r.get("added_at"), now),
              render.until(r.get("expires_at"), now), r.get("reason")) for r in rows),
            ["MACHINE", "SOURCE", "ADDED", "UNTIL", "WHY"],
            width=render.terminal_width(), shrink=("WHY",),
        )
    )
    for r in rows:
        reports = r.get("renter_reports") or []
        if reports:
            said = "; ".join(f"{p.get('problem')} ({p.get('created_at')})" for p in reports[:3])
            click.echo(clean(f"Machine {r.get('machine_id')}: {len(reports)} renter report(s) "
                             f"at vast.ai: {said}"))


@bad_hosts.command("add")
@click.argument("machine_id", type=int)
@click.option("--reason", required=True, help="Why this machine is blocked.")
@click.option("--hours", type=click.FloatRange(min=0.001, max=8784), default=None,
              help="How long the block lasts (default: VM_STRIKE_BLOCK_S).")
@operator_options
def bad_hosts_add(client: OperatorClient, machine_id: int, reason: str,
                  hours: float | None) -> None:
    """Block a machine for a while (every block ends).

    \b
    Example:
      vast-manager bad-hosts add 41006 --reason "25.9/h, noisy neighbour" --hours 48
    """
    body: dict[str, Any] = {"machine_id": machine_id, "reason": reason}
    if hours is not None:
        body["hours"] = hours
    answer = client.post("/api/bad-hosts", body)
    click.echo(clean(answer.get("message")) or f"Machine {machine_id} blocked.")


@bad_hosts.command("remove")
@click.argument("machine_id", type=int)
@operator_options
def bad_hosts_remove(client: OperatorClient, machine_id: int) -> None:
    """Unblock a machine (its strikes still count; `forgive` takes them back too).

    \b
    Example:
      vast-manager bad-hosts remove 41006
    """
    client.delete(f"/api/bad-hosts/{machine_id}")
    click.echo(f"Machine {machine_id} unblocked.")


@bad_hosts.command("forgive")
@click.argument("machine_id", type=int)
@operator_options
def bad_hosts_forgive(client: OperatorClient, machine_id: int) -> None:
    """Unblock a machine and take back every strike against it.

    \b
    Example:
      vast-manager bad-hosts forgive 41001
    """
    answer = client.post(f"/api/bad-hosts/{machine_id}/forgive", {})
    click.echo(clean(answer.get("message")))


@cli.command()
@json_option
@operator_options
def preflight(client: OperatorClient, as_json: bool) -> None:
    """Check the configuration as the first deploy will: the C1 input (VM_PREFLIGHT_C1),
    the parameter source (a VM_PARAMS_MANIFEST URL), the image in its registry. Each
    check is ok, FAIL or not checked (with why); exit status 1 when one failed.

    \b
    Example:
      vast-manager preflight
    """
    answer = client.post("/api/preflight", {})
    if as_json:
        echo_json(answer)
    else:
        for check in answer.get("checks") or []:
            mark = {True: "ok  ", False: "FAIL"}.get(check.get("ok"), "--  ")
            click.echo(render.wrap(clean(f"{mark} {check.get('name')}: {check.get('detail')}"),
                                   render.terminal_width(), "     "))
        click.echo(clean(answer.get("message")))
    if not answer.get("ok"):
        sys.exit(EXIT_REFUSED)


@cli.group("faults")
def faults() -> None:
    """Failures that are not one host's (the setup's, vast.ai's): they pause deploys."""


@faults.command("list")
@json_option
@operator_options
def faults_list(client: OperatorClient, as_json: bool) -> None:
    """Every fleet fault, open ones first: its cause, the machines it hit, the fix.

    \b
    Example:
      vast-manager faults list
    """
    rows = client.get("/api/faults")
    if as_json:
        echo_json(rows)
        return
    if not rows:
        click.echo("No faults.")
        return
    now = time.time()
    for r in sorted(rows, key=lambda r: (not r.get("open"), -int(r.get("id") or 0))):
        state = "OPEN" if r.get("open") else f"cleared {render.ago(r.get('cleared_at'), now)}"
        click.echo(clean(f"fault {r.get('id')} [{state}] {r.get('fault')}'s, "
                         f"{r.get('failures')} failure(s) on {', '.join(r.get('machines') or [])}"
                         f", since {render.ago(r.get('opened_at'), now)}"))
        click.echo(clean(f"  cause: {r.get('cause')}"))
        click.echo(clean(f"  fix: {r.get('fix')}"))


@faults.command("clear")
@click.argument("fault_id", type=int)
@click.option("--note", default="fixed", help="What was fixed (kept with the fault).")
@operator_options
def faults_clear(client: OperatorClient, fault_id: int, note: str) -> None:
    """Say a fault is fixed: deploys and the autopilot resume.

    \b
    Example:
      vast-manager faults clear 1 --note "C1 baked into vast-agent:1.1"
    """
    answer = client.post(f"/api/faults/{fault_id}/clear", {"note": note})
    click.echo(clean(answer.get("message")))


@cli.command()
@click.argument("instance_id", type=int)
@operator_options
def destroy(client: OperatorClient, instance_id: int) -> None:
    """Destroy an instance now (billing stops). Safe to repeat.

    \b
    Example:
      vast-manager destroy 3
    """
    answer = client.post(f"/api/instances/{instance_id}/destroy")
    click.echo(clean((answer or {}).get("message") or f"Instance {instance_id} destroyed."))


@cli.command()
@click.argument("instance_id", type=int)
@operator_options
def rebenchmark(client: OperatorClient, instance_id: int) -> None:
    """Make the instance re-run its benchmark at its next heartbeat.

    \b
    Example:
      vast-manager rebenchmark 3
    """
    answer = client.post(f"/api/instances/{instance_id}/rebenchmark")
    click.echo(
        clean((answer or {}).get("message") or f"Instance {instance_id} will re-benchmark.")
    )


def _print_logs(lines: list[dict[str, Any]]) -> None:
    for line in lines:
        ts = time.strftime("%H:%M:%S", time.localtime(float(line.get("ts") or 0)))
        click.echo(f"{ts} {clean(line.get('source'))}: {clean(line.get('text'))}")


def _log_key(line: dict[str, Any]) -> tuple[float, str, str]:
    return float(line.get("ts") or 0), str(line.get("source")), str(line.get("text"))


def _unseen(
    lines: list[dict[str, Any]], seen_ts: float, seen_at_ts: set[tuple[float, str, str]]
) -> list[dict[str, Any]]:
    """Lines newer than the last printed one; at its timestamp, only those not printed yet
    (several lines often share a second)."""
    return [x for x in lines
            if _log_key(x)[0] > seen_ts or (_log_key(x)[0] == seen_ts
                                            and _log_key(x) not in seen_at_ts)]


@cli.command()
@click.argument("instance_id", type=int)
@click.option("--tail", type=int, default=100, show_default=True, help="How many lines.")
@click.option("--source", default=None, help="Only lines from this source (agent, cuzk, ...).")
@click.option("--follow", "-f", is_flag=True,
              help="Keep printing new lines as they arrive (polls; Ctrl-C stops).")
@click.option("--interval", "interval_s", type=click.FloatRange(min=0.1), default=2.0,
              show_default=True, help="Seconds between polls with --follow.")
@operator_options
def logs(
    client: OperatorClient,
    instance_id: int,
    tail: int,
    source: str | None,
    follow: bool,
    interval_s: float,
) -> None:
    """Logs the instance's agent shipped (agent, cuzk, benchmark, work command).

    \b
    Example:
      vast-manager logs 3 --tail 50 --source cuzk --follow
    """
    path = f"/api/instances/{instance_id}/logs"
    try:
        # Ctrl-C ends a follow quietly wherever it lands, the first fetch included.
        lines = client.get(path, tail=tail, source=source)
        _print_logs(lines)
        seen_ts = max((_log_key(x)[0] for x in lines), default=0.0)
        seen_at_ts = {_log_key(x) for x in lines if _log_key(x)[0] == seen_ts}
        while follow:
            time.sleep(interval_s)
            fresh = _unseen(client.get(path, tail=1000, source=source), seen_ts, seen_at_ts)
            _print_logs(fresh)
            if fresh:
                newest = max(_log_key(x)[0] for x in fresh)
                if newest > seen_ts:
                    seen_ts, seen_at_ts = newest, set()
                seen_at_ts |= {_log_key(x) for x in fresh if _log_key(x)[0] == seen_ts}
    except KeyboardInterrupt:
        if not follow:
            raise


@cli.group()
def agents() -> None:
    """Bring-your-own agents: issue credentials for a machine you run yourself, or revoke."""


@agents.command("issue")
@click.option("--label", default="byo", show_default=True,
              help="Name of the machine (its machine_id in host_perf).")
@click.option("--min-rate", type=float, default=None, help="Minimum proofs/hour to keep it.")
@click.option("--gpus", type=click.IntRange(1, 16), default=1, show_default=True,
              help="GPUs the machine has: its agent's hello may list no more.")
@click.option("--gpu-model", default=None,
              help='GPU model every listed GPU must be, e.g. "RTX 4090" [default: any].')
@json_option
@operator_options
def agents_issue(
    client: OperatorClient, label: str, min_rate: float | None, gpus: int,
    gpu_model: str | None, as_json: bool
) -> None:
    """Register an agent and print its environment (VM_COORDINATOR_URL, VM_AGENT_ID,
    VM_AGENT_KEY) in env-file format. The key is shown only here, once. The GPUs
    (count and model) are declared here, once: a hello listing more is refused.

    \b
    Example:
      vast-manager agents issue --label rig-01 --gpus 4 --gpu-model "RTX 4090" \\
          --min-rate 40 > rig-01.env
    """
    body: dict[str, Any] = {"label": label, "gpus": gpus}
    if min_rate is not None:
        body["min_rate_per_hour"] = min_rate
    if gpu_model is not None:
        body["gpu_model"] = gpu_model
    answer = client.post("/api/agents", body)
    env = {
        "VM_COORDINATOR_URL": answer["coordinator_url"],
        "VM_AGENT_ID": answer["agent_id"],
        "VM_AGENT_KEY": answer["agent_key"],
    }
    if as_json:
        echo_json(env)
        return
    for key, value in env.items():
        click.echo(f"{key}={clean(value)}")


@agents.command("revoke")
@click.argument("agent_id")
@operator_options
def agents_revoke(client: OperatorClient, agent_id: str) -> None:
    """Revoke an agent: its requests are refused from now on.

    \b
    Example:
      vast-manager agents revoke ag_0123456789abcdef0123
    """
    client.post(f"/api/agents/{agent_id}/revoke")
    click.echo(f"Agent {clean(agent_id)} revoked.")


# --- offers and deploy --------------------------------------------------------------


@cli.command()
@click.option("--filter", "filter_text", default=None,
              help='Offer filter in vast.ai CLI syntax, e.g. "num_gpus>=2 dph<=0.9".')
@click.option("--wide", is_flag=True,
              help="Add each prediction's basis, however wide the lines get.")
@json_option
@operator_options
def offers(client: OperatorClient, filter_text: str | None, wide: bool, as_json: bool) -> None:
    """Offers ranked by predicted cost per proof, with the basis of each prediction.

    The rate model (docs/discovery.md) predicts each offer's proofs/hour from its
    hardware and the fleet's measurements: PRED/H is the predicted rate (the
    one with the least expected percentage error) and, in brackets, the 80%
    interval of the host's true rate; the basis names the
    factors that moved it. CPU and RAM are what the instance gets, its share of
    the host (vast.ai lists the whole host's): an offer whose share is below
    VM_MIN_INSTANCE_RAM_GB is flagged TOO-SMALL, and deploys refuse it. The
    table fits the terminal; --wide adds the basis column (--json has it all).

    \b
    Example:
      vast-manager offers --filter "gpu_name=RTX_4090 cpu_ram>=240"
      vast-manager offers --wide
    """
    from vast_manager.coordinator.cli.text_views import predicted_interval

    rows = client.get("/api/offers", filter=filter_text)
    if as_json:
        echo_json(rows)
        return
    if not rows:
        click.echo("No offers match.")
        alert = (client.get("/api/fleet").get("offer_cache") or {}).get("alert")
        if alert:  # the answer may be stale: say why
            click.echo(clean(str(alert)))
        return
    click.echo(
        render.table(
            (
                (
                    r.get("id"),
                    f"{r.get('num_gpus')}x {r.get('gpu_name')}",
                    render.usd(r.get("dph_total"), 3),
                    predicted_interval(r),
                    render.usd(r.get("predicted_usd_per_proof")),
                    render.num(r.get("instance_cpu_cores"), 0),
                    render.num(r.get("instance_ram_gb"), 0),
                    render.num(r.get("pcie_bw"), 1),
                    r.get("geolocation"),
                    _flags(r),
                    *((r.get("prediction_basis"),) if wide else ()),
                )
                for r in rows
            ),
            ["OFFER", "GPUS", "$/H", "PRED/H (80%)", "$/PROOF", "CPU", "RAM GB", "PCIE GB/S",
             "PLACE", "FLAGS", *(("BASIS",) if wide else ())],
            # Priorities at a narrow width: PLACE narrows, then these leave; GPUS last.
            width=None if wide else render.terminal_width(), shrink=("PLACE",),
            drop=("PCIE GB/S", "PLACE", "CPU"), keep=("GPUS",),
        )
    )
    width = None if wide else render.terminal_width()
    click.echo(render.wrap(
        "CPU and RAM GB: the instance's share of the host (vast.ai lists the whole host's). "
        + ("" if wide else "Each prediction's basis: --wide, or --json."), width))
    if rows[0].get("offers_label"):
        click.echo(render.wrap(str(rows[0]["offers_label"]).capitalize() + ".", width))


def _flags(offer: dict[str, Any]) -> str:
    flags = []
    if offer.get("bad_host"):
        flags.append("BAD-HOST")
    if offer.get("too_small"):
        flags.append("TOO-SMALL")
    if offer.get("known"):
        flags.append("known")
    if offer.get("predicted_rate_per_hour") is None and not offer.get("too_small"):
        flags.append("unpredicted")
    return ",".join(flags) or "-"


@cli.command()
@click.argument("offer_id", type=int)
@click.option("--min-rate", type=float, default=None,
              help="Minimum proofs/hour [default: price / max $ per proof].")
@click.option("--disk", "disk_gb", type=int, default=None,
              help="Disk in GB [default: VM_DEPLOY_DISK_GB].")
@click.option("--max-price", "max_dph_total", type=float, default=None,
              help="Refuse if the offer now costs more than this, $/h (the price you saw), "
                   "with this deploy's own disk's storage.")
@operator_options
def deploy(
    client: OperatorClient,
    offer_id: int,
    min_rate: float | None,
    disk_gb: int | None,
    max_dph_total: float | None,
) -> None:
    """Rent an offer and start an agent on it, after re-checking the offer
    (still there, price, bad host, machine already ours).

    \b
    Example:
      vast-manager deploy 9001 --min-rate 50 --max-price 0.45
    """
    body: dict[str, Any] = {"offer_id": offer_id}
    if min_rate is not None:
        body["min_rate_per_hour"] = min_rate
    if disk_gb is not None:
        body["disk_gb"] = disk_gb
    if max_dph_total is not None:
        body["max_dph_total"] = max_dph_total
    answer = client.post("/api/deploy", body)
    click.echo(
        f"Instance {clean(answer.get('instance_id'))} (agent "
        f"{clean(answer.get('agent_id'))}): {clean(answer.get('message'))}"
    )


@cli.command()
@click.option("--trials", type=click.IntRange(1, 100), default=5, show_default=True,
              help="At most this many proposals.")
@click.option("--budget-usd", type=click.FloatRange(min=0.0), default=None,
              help="At most this much spent on the proposed trials, $.")
@click.option("--filter", "filter_text", default=None,
              help="Offer filter in vast.ai CLI syntax [default: the coordinator's].")
@json_option
@operator_options
def plan(client: OperatorClient, trials: int, budget_usd: float | None,
         filter_text: str | None, as_json: bool) -> None:
    """Which offers to benchmark next, and why: for each, the predicted 80% interval,
    the break-even rate at its price, the chance it passes its verdict and beats the
    fleet's best $/proof, the trial's cost, its expected value, and the hypothesis it
    tests. Proposes nothing when nothing is worth its cost.

    \b
    Example:
      vast-manager plan --trials 3 --budget-usd 5
    """
    from vast_manager.coordinator.cli.text_views import render_plan

    data = client.get("/api/plan", trials=trials, budget_usd=budget_usd, filter=filter_text)
    if as_json:
        echo_json(data)
        return
    click.echo(render_plan(data, render.terminal_width()))


@cli.command()
@json_option
@operator_options
def model(client: OperatorClient, as_json: bool) -> None:
    """What the rate model learned from the measurements: which candidate serves and
    each candidate's cross-validated error side by side, its spreads, the capacities'
    scales, each GPU model's and CPU family's factor.

    \b
    Example:
      vast-manager model --json
    """
    data = client.get("/api/model")
    if as_json:
        echo_json(data)
        return
    click.echo(
        f"Rate model on {data.get('measurements')} measurement(s) of {data.get('machines')} "
        f"machine(s) ({data.get('imported')} imported, {data.get('skipped')} unreadable), "
        f"fitted {render.ago(data.get('fitted_at'))} in {render.num(data.get('fit_seconds'), 2)} s"
    )
    click.echo(f"  host spread {render.num(data.get('sigma_host'), 3)}, benchmark noise "
               f"{render.num(data.get('sigma_noise'), 3)} (log rate); new hosts' intervals x"
               f"{render.num(data.get('interval_scale'), 2)} (calibrated on measured machines)")
    if data.get("model_stale"):
        click.echo(f"  stale: {clean(data.get('model_stale_reason'))}")
    candidates = data.get("candidates") or []
    if candidates:
        click.echo(f"  serving: {clean(data.get('served_by'))}, cross-validated median abs "
                   f"error {render.num(100 * float(data.get('served_cv_mdape') or 0), 1)}% "
                   "(grouped by machine); the weights of the least trimmed mean abs log error")
        click.echo(render.table(
            [[clean(c.get("name")), f"{100 * float(c.get('cv_mdape') or 0):.1f}%",
              render.num(c.get("cv_trimmed_abs_log"), 3),
              f"{100 * float(c.get('weight') or 0):.0f}%"] for c in candidates],
            ["CANDIDATE", "CV ERROR", "CV TRIMMED LOG", "WEIGHT"]))
    else:
        click.echo("  serving: the structural model alone (cross-validation needs more "
                   "measured machines)")
    scales = data.get("interval_scales") or {}
    if scales:
        click.echo("  by what binds them: " + ", ".join(
            f"{clean(k)} x{render.num(v, 2)}" for k, v in sorted(scales.items())))
    for group in ("gpu_models", "cpu_families"):
        factors = data.get(group) or {}
        if factors:
            click.echo(f"  {group.replace('_', ' ')}: " + ", ".join(
                f"{clean(k)} x{float(v):.2f}" for k, v in sorted(factors.items())))


@cli.group()
def autopilot() -> None:
    """The autopilot (`serve --autopilot`): what it did and why, stop it, start it."""


@autopilot.command("status")
@click.option("--events", "limit", type=click.IntRange(1, 1000), default=20, show_default=True,
              help="How many of its latest actions to show.")
@json_option
@operator_options
def autopilot_status(client: OperatorClient, limit: int, as_json: bool) -> None:
    """Its state, caps and last decision, and its latest actions with their reasons.

    \b
    Example:
      vast-manager autopilot status
    """
    from vast_manager.coordinator.cli.text_views import render_autopilot

    data = client.get("/api/autopilot", limit=limit)
    if as_json:
        echo_json(data)
        return
    click.echo(render_autopilot(data))


@autopilot.command("stop")
@click.option("--reason", default=None, help="Why (kept with the stop).")
@operator_options
def autopilot_stop(client: OperatorClient, reason: str | None) -> None:
    """Stop the autopilot now. It stays stopped across restarts until `autopilot start`;
    instances it deployed keep running.

    \b
    Example:
      vast-manager autopilot stop --reason "budget review"
    """
    answer = client.post("/api/autopilot/stop", {"reason": reason} if reason else {})
    click.echo(clean((answer or {}).get("message") or "The autopilot is stopped."))


@autopilot.command("start")
@operator_options
def autopilot_start(client: OperatorClient) -> None:
    """Resume the autopilot of a coordinator served with --autopilot.

    \b
    Example:
      vast-manager autopilot start
    """
    answer = client.post("/api/autopilot/start")
    click.echo(clean((answer or {}).get("message") or "The autopilot is running."))


@cli.command()
@json_option
@operator_options
def scaling(client: OperatorClient, as_json: bool) -> None:
    """Multi-GPU scaling per host: rate with all GPUs vs one, efficiency, bottleneck,
    evidence — the agent's verdict and the coordinator's own.

    \b
    Example:
      vast-manager scaling
    """
    from vast_manager.coordinator.cli.text_views import render_scaling

    rows = client.get("/api/scaling")
    if as_json:
        echo_json(rows)
        return
    click.echo(render_scaling(rows, render.terminal_width()))


@cli.group()
def fake() -> None:
    """Inject vast.ai's faults into `serve --provider fake` (docs/operations.md, "Rehearsing
    on the fake vast.ai"); INSTANCE_ID is the id `status` shows. Everything is simulated."""


def _fake_post(client: OperatorClient, name: str, body: dict[str, Any]) -> None:
    answer = client.post(f"/api/fake/{name}", {k: v for k, v in body.items() if v is not None})
    click.echo(clean((answer or {}).get("message") or "Done."))


@fake.command("show")
@json_option
@operator_options
def fake_show(client: OperatorClient, as_json: bool) -> None:
    """The fake vast.ai's state: funds, quota, pending increases, instances.

    \b
    Example:
      vast-manager fake show
    """
    data = client.get("/api/fake")
    if as_json:
        echo_json(data)
        return
    quota = data.get("search_quota_per_day")
    click.echo(f"Simulated funds ${data.get('credit_usd')}; searches today "
               f"{data.get('searches_today')} of {quota if quota is not None else 'no quota'}; "
               f"key {'revoked' if data.get('key_revoked') else 'accepted'}; "
               f"{len(data.get('pending_price_increases') or [])} pending price increase(s).")
    click.echo(render.table(
        ((i.get("vast_id"), i.get("actual_status"), i.get("dph_total"), i.get("bid_price"),
          i.get("status_msg")) for i in data.get("instances") or []),
        ["VAST ID", "STATUS", "$/H", "BID", "MESSAGE"], width=render.terminal_width()))


@fake.command("offline")
@click.argument("instance_id", type=int)
@click.option("--for", "for_s", type=float, default=None, help="Seconds offline [600].")
@operator_options
def fake_offline(client: OperatorClient, instance_id: int, for_s: float | None) -> None:
    """The host loses vast.ai for a while (and a webhook says so, if one is set).

    \b
    Example:
      vast-manager fake offline 3 --for 300
    """
    _fake_post(client, "offline", {"instance_id": instance_id, "for_s": for_s})


@fake.command("outbid")
@click.argument("instance_id", type=int)
@click.option("--for", "for_s", type=float, default=None, help="Seconds until it runs again.")
@click.option("--winning-bid", type=float, default=None, help="$/h a raised bid must reach.")
@operator_options
def fake_outbid(client: OperatorClient, instance_id: int, for_s: float | None,
                winning_bid: float | None) -> None:
    """A higher bid takes an interruptible instance's host: it is stopped.

    \b
    Example:
      vast-manager fake outbid 3 --winning-bid 0.30
    """
    _fake_post(client, "outbid", {"instance_id": instance_id, "for_s": for_s,
                                  "winning_bid": winning_bid})


@fake.command("status")
@click.argument("instance_id", type=int)
@click.argument("status")
@operator_options
def fake_status(client: OperatorClient, instance_id: int, status: str) -> None:
    """vast.ai shows STATUS for the instance (exited, unknown, stopped, ...).

    \b
    Example:
      vast-manager fake status 3 exited
    """
    _fake_post(client, "status", {"instance_id": instance_id, "status": status})


@fake.command("price-increase")
@click.argument("instance_id", type=int)
@click.argument("rent_per_hour", type=float)
@operator_options
def fake_price_increase(client: OperatorClient, instance_id: int, rent_per_hour: float) -> None:
    """The host files a price increase: RENT_PER_HOUR from its contract's end.

    \b
    Example:
      vast-manager fake price-increase 3 0.90
    """
    _fake_post(client, "price-increase", {"instance_id": instance_id,
                                          "rent_per_hour": rent_per_hour})


@fake.command("funds")
@click.argument("add_usd", type=float)
@operator_options
def fake_funds(client: OperatorClient, add_usd: float) -> None:
    """Add (or, negative, take) simulated funds; at zero vast.ai stops every instance.

    \b
    Example:
      vast-manager fake funds -- -1000
    """
    _fake_post(client, "funds", {"add_usd": add_usd})


@fake.command("revoke-key")
@operator_options
def fake_revoke_key(client: OperatorClient) -> None:
    """The account's API key is deleted: every call is refused from now on.

    \b
    Example:
      vast-manager fake revoke-key
    """
    _fake_post(client, "revoke-key", {})


@fake.command("quota")
@click.argument("searches_per_day", type=int, required=False)
@operator_options
def fake_quota(client: OperatorClient, searches_per_day: int | None) -> None:
    """vast.ai's daily search quota (no argument: none).

    \b
    Example:
      vast-manager fake quota 5
    """
    _fake_post(client, "quota", {"searches_per_day": searches_per_day})


@fake.command("report")
@click.argument("machine_id", type=int)
@click.argument("problem")
@click.option("--message", default=None, help="The renter's words.")
@operator_options
def fake_report(client: OperatorClient, machine_id: int, problem: str,
                message: str | None) -> None:
    """A renter files a report against a machine.

    \b
    Example:
      vast-manager fake report 41006 gpu_error --message "GPU fell off the bus"
    """
    _fake_post(client, "report", {"machine_id": machine_id, "problem": problem,
                                  "message": message})


def main() -> None:
    cli(prog_name="vast-manager")


if __name__ == "__main__":
    main()
