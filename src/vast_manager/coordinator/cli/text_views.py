"""Text views of one instance and of the scaling diagnostics, for the CLI and the demo.

Pure functions from the operator API's JSON to text; all host-sent text
passes through ``textsafe.clean``.
"""

from __future__ import annotations

import time
from typing import Any

from vast_manager.common.scaling import describe_throttle, link_capacity_gbps
from vast_manager.coordinator.cli import render
from vast_manager.coordinator.textsafe import clean


def _gbps(kbps: Any) -> str:
    # NVML's PCIe throughput is in KB/s; show GB/s like the link capacity.
    return "-" if kbps is None else f"{float(kbps) / 1e6:.2f}"


def _link(gpu_tele: dict[str, Any], host_gpu: dict[str, Any] | None) -> tuple[str, float | None]:
    gen = gpu_tele.get("pcie_gen_current") or (host_gpu or {}).get("pcie_gen_current")
    width = gpu_tele.get("pcie_width_current") or (host_gpu or {}).get("pcie_width_current")
    if gen is None or width is None:
        return "-", None
    return f"Gen{gen} x{width}", link_capacity_gbps(int(gen), int(width))


def gpu_table(telemetry: dict[str, Any] | None, host_gpus: list[dict[str, Any]]) -> str:
    if not telemetry or not telemetry.get("gpus"):
        return "No GPU telemetry (no NVML on this host, or nothing sampled yet)."
    by_index = {g.get("index"): g for g in host_gpus}
    rows = []
    for g in telemetry["gpus"]:
        link, capacity = _link(g, by_index.get(g.get("index")))
        cap = f"{capacity:.1f}" if capacity else "-"
        rows.append(
            (
                g.get("index"),
                clean((by_index.get(g.get("index")) or {}).get("name")),
                f"{render.num(g.get('util_pct_mean'), 0)} / {render.num(g.get('util_pct_max'), 0)}",
                f"{_gbps(g.get('pcie_tx_kbps_mean'))} / {_gbps(g.get('pcie_rx_kbps_mean'))}",
                f"{link} ({cap} GB/s)",
                render.num(g.get("power_w_mean"), 0, " W"),
                render.num(g.get("temp_c_max"), 0, " C"),
                render.num(g.get("sm_clock_mhz_mean"), 0, " MHz"),
                ", ".join(describe_throttle(g.get("throttle_reasons") or 0)) or "none",
            )
        )
    return render.table(
        rows,
        ["GPU", "NAME", "UTIL% mean/max", "PCIE TX/RX GB/s", "LINK (capacity/dir)", "POWER",
         "TEMP", "SM CLOCK", "THROTTLE"],
    )


def production_lines(data: dict[str, Any]) -> list[str]:
    """What a proving instance completed (cuzk's counter between heartbeats), or IDLE
    with the reason: the benchmark says what it can do, this what it does; and what the
    cluster recorded it delivered, with its failures and earnings."""
    if data.get("idle"):
        return [f"  IDLE: {clean(data.get('idle_reason'))}; it bills and proves nothing "
                "(not counted in the fleet's rate)", *delivered_lines(data)]
    if data.get("state") != "proving":
        return delivered_lines(data)  # the round's last word on one that just ended
    done = data.get("completed_rate_per_hour")
    return [f"  completed {render.num(done)}/h (cuzk's finished proofs over the last hour)"
            if done is not None else "  completed: measuring (cuzk's finished proofs, from "
            "the next heartbeats)", *delivered_lines(data)]


def _rate(value: Any) -> str:
    """A rate without a useless decimal: 10/h, 2.5/h."""
    return "-" if value is None else f"{round(float(value), 1):g}"


def delivered_cell(row: dict[str, Any]) -> str:
    """The status table's DELIVERED/H: the cluster's rate and its failed tasks."""
    if row.get("delivered_source") != "cluster":
        status = str(row.get("cluster_status") or "")
        return "unattributable" if status.startswith("unattributable") else "-"
    return f"{_rate(row.get('delivered_rate_per_hour'))} / {row.get('tasks_failed') or 0} failed"


def delivered_lines(data: dict[str, Any]) -> list[str]:
    """Delivered beside claimed, the cluster's failures and last error, the flags, and
    revenue against the full bill (docs/operations.md, "Production as the cluster records
    it"); nothing without a cluster source or a proof price."""
    lines = []
    if data.get("delivered_source") == "cluster":
        lines.append(
            f"  delivered {_rate(data.get('delivered_rate_per_hour'))}/h as the cluster "
            f"records it (benchmark {_rate(data.get('rate_per_hour'))}/h, cuzk counted "
            f"{_rate(data.get('completed_rate_per_hour'))}/h): {data.get('tasks_completed')} "
            f"proofs, {data.get('tasks_failed')} failed in "
            f"{render.num((data.get('delivered_window_s') or 0) / 60, 0)} min")
        if data.get("last_task_error"):
            lines.append(f"  last failed task: {clean(data.get('last_task_error'))}")
    elif data.get("cluster_status"):
        lines.append(f"  cluster: {clean(data.get('cluster_status'))}")
    for name, why in sorted((data.get("cluster_flags") or {}).items()):
        lines.append(f"  FLAGGED {clean(name)}: {clean(why)}")
    if data.get("revenue_per_hour") is not None:
        lines.append(
            f"  earns {render.usd(data.get('revenue_per_hour'), 3)}/h "
            f"(at its {clean(data.get('revenue_basis'))} rate), costs "
            f"{render.usd(data.get('cost_per_hour'), 3)}/h in full: profit "
            f"{render.usd(data.get('profit_per_hour'), 3)}/h")
    return lines


def fleet_production_lines(fleet: dict[str, Any]) -> list[str]:
    """The fleet's earnings and the cluster source's alert, above the status table."""
    lines = []
    cluster = fleet.get("cluster") or {}
    if cluster.get("alert"):
        lines.append(f"ALERT: {clean(cluster['alert'])} (decisions use the agents' counters; "
                     "nothing is destroyed for it)")
    if fleet.get("revenue_per_hour") is not None:
        lines.append(f"Fleet earns {render.usd(fleet.get('revenue_per_hour'), 2)}/h, costs "
                     f"{render.usd(fleet.get('cost_per_hour'), 2)}/h in full: profit "
                     f"{render.usd(fleet.get('profit_per_hour'), 2)}/h")
    unclaimed = fleet.get("unattributable_addresses") or []
    if unclaimed:
        lines.append(f"{len(unclaimed)} Curio address(es) with proving tasks no instance "
                     "holds (unattributable): " + ", ".join(
                         clean(u.get("host_and_port")) for u in unclaimed[:5]))
    return lines


def _rate_lines(data: dict[str, Any]) -> list[str]:
    """The benchmark's rate against the minimum; none while lost or idle (it proves
    nothing now, docs/operations.md "One reading")."""
    source = render.simulated(data)
    sim = f" (SIMULATED: {source})" if source else ""
    minimum = f"minimum {render.num(data.get('min_rate_per_hour'))}/h"
    if data.get("idle") or data.get("state") == "lost":
        return [f"  no rate now ({'idle' if data.get('idle') else 'lost'}; {minimum}){sim}"]
    return [f"  benchmark rate {render.num(data.get('rate_per_hour'))}/h ({minimum}), "
            f"{render.usd(data.get('usd_per_proof'))} per proof{sim}"]


def provider_lines(data: dict[str, Any]) -> list[str]:
    """The provider's view beside ours (vast.ai's instance id, actual_status, status_msg,
    what it bills now) and what the instance has cost so far, by part."""
    pid = data.get("provider_instance_id")
    lines = []
    if data.get("provider") == "local":
        lines.append(f"  local instance {pid if pid is not None else '-'} (simulated, not "
                     "vast.ai's)")
    elif pid is not None:
        msg = data.get("provider_status_msg")
        fake = data.get("provider") == "fake"
        lines.append(f"  {'fake ' if fake else ''}vast.ai instance {pid}: "
                     f"{clean(data.get('provider_status') or '?')}"
                     + (f" ({clean(msg)})" if msg else "") + ", billing "
                     f"{render.usd(data.get('billing_now_per_hour'), 3)}/h now"
                     + (" (simulated dollars)" if fake else ""))
    billed = (data.get("cost") or {}).get("billed")
    if billed:
        lines.append(f"  spent {render.usd(billed.get('total'), 2)} so far (rent "
                     f"{render.usd(billed.get('rent'), 2)}, storage "
                     f"{render.usd(billed.get('storage'), 2)}, bandwidth "
                     f"{render.usd(billed.get('bandwidth'), 2)})")
    return lines


def render_instance(data: dict[str, Any]) -> str:
    now = time.time()
    lines = [
        f"Instance {data.get('id')}  agent {clean(data.get('agent_id'))}  "
        f"label {clean(data.get('label'))}",
        f"  state {clean(data.get('state'))}, phase {clean(data.get('phase'))}, "
        f"last seen {render.ago(data.get('last_seen'), now)}",
        f"  machine {clean(data.get('machine_id'))}: {data.get('num_gpus') or '?'}x "
        f"{clean(data.get('gpu_name'))}, {clean(data.get('geolocation'))}, "
        f"{render.usd(data.get('dph_total'), 3)}/h",
        *_rate_lines(data),
        *production_lines(data),
        *provider_lines(data),
        "",
    ]
    tele = data.get("telemetry")
    host = data.get("host") or {}
    lines.append(gpu_table(tele, host.get("gpus") or []))
    if tele:
        cpu = tele.get("cpu") or {}
        ram = tele.get("ram") or {}
        quota = cpu.get("quota_cores")
        lines.append(
            f"CPU {render.num(cpu.get('util_pct_mean'), 0)}% busy (load1 "
            f"{render.num(cpu.get('load1'))}, iowait {render.num(cpu.get('iowait_pct_mean'))}%"
            + (f", container quota {render.num(quota)} cores" if quota else "")
            + f"); RAM {render.num((ram.get('used_bytes') or 0) / 1e9, 0)} of "
            f"{render.num((ram.get('total_bytes') or 0) / 1e9, 0)} GB"
        )
        cuzk = tele.get("cuzk")
        if cuzk:
            workers = ", ".join(
                f"GPU {w.get('gpu_ordinal')} {render.num(w.get('busy_pct'), 0)}%"
                for w in cuzk.get("workers") or []
            )
            lines.append(
                f"cuzk: workers busy {workers or '-'}; synthesis "
                f"{render.num(cuzk.get('synthesis_active_mean'))} of "
                f"{cuzk.get('synthesis_slots') or '-'} workers; queue "
                f"{render.num(cuzk.get('queue_depth_mean'))}"
            )
    results = data.get("results") or []
    if results:
        total = data.get("results_total") or len(results)
        older = data.get("results_next")
        header = "Results:"
        if older or total != len(results):
            more = f"; older ones: --before {older}" if older else ""
            header = f"Results ({len(results)} of {total}, newest{more}):"
        lines += ["", header]
        lines.append(
            render.table(
                (
                    (
                        clean(r.get("result_id")),
                        r.get("kind"),
                        r.get("proofs_completed"),
                        render.num(r.get("wall_seconds"), 0, " s"),
                        render.num(r.get("recomputed_rate_per_hour")),
                        ",".join(r.get("flags") or []) or "-",
                    )
                    for r in results
                ),
                ["RESULT", "KIND", "PROOFS", "WALL", "RATE/H (recomputed)", "FLAGS"],
            )
        )
        # Why each flagged result was kept out (implausible, contended, ...), in the
        # coordinator's words.
        for r in results:
            for why in r.get("flag_reasons") or []:
                lines.append(f"  {clean(r.get('result_id'))}: {clean(why)}")
    lines += event_lines(data.get("events") or [], "Decisions:", 15, "%H:%M:%S", kind=True)
    return "\n".join(lines)


def event_lines(events: list[dict[str, Any]], title: str, last: int, clock: str, *,
                kind: bool) -> list[str]:
    """The ``last`` events under ``title`` (nothing when there are none), each with its
    time and reason (and kind)."""
    if not events:
        return []
    out = ["", title]
    for e in events[-last:]:
        ts = time.strftime(clock, time.localtime(float(e.get("ts") or 0)))
        reason = str(e.get("reason") or "")
        # A reason that already starts with its kind ("timeout: ...") says it once.
        said = reason.startswith(f"{e.get('kind')}:")
        what = f"{clean(e.get('kind'))}: " if kind and not said else ""
        out.append(f"  {ts} {what}{clean(reason)}")
    return out


def render_scaling(rows: list[dict[str, Any]], width: int | None = None) -> str:
    """Per host: all-GPU vs one-GPU rate, and the coordinator's verdict beside the agent's
    (folded to ``width`` when given)."""
    if not rows:
        return "No multi-GPU scaling result yet."
    out = []
    for r in rows:
        one = r.get("rate_one_per_hour")
        one_text = (
            f"{render.num(one)}/h with one"
            if one is not None
            else "no one-GPU run (terminated first)"
        )
        out.append(
            f"machine {clean(r.get('machine_id'))} ({r.get('num_gpus')}x "
            f"{clean(r.get('gpu_name'))}): {render.num(r.get('rate_all_per_hour'))}/h with "
            f"all GPUs, {one_text}; efficiency {render.num(r.get('efficiency'), 2)}; "
            f"bottleneck {clean(r.get('bottleneck')).upper()} (coordinator, on the host's "
            "own telemetry)"
            + (
                f", {clean(r.get('agent_bottleneck')).upper()} (agent says)"
                if r.get("agent_bottleneck")
                else ""
            )
        )
        for ev in r.get("evidence") or []:
            out.append(f"    - {clean(ev)}")
    return "\n".join(render.wrap(line, width, "      " if line.startswith("    - ") else "  ")
                     for line in out)


def predicted_interval(row: dict[str, Any]) -> str:
    """'61.0 (50-72)': a predicted rate and its 80% interval, or '-'."""
    mid = row.get("predicted_rate_per_hour")
    if mid is None:
        return "-"
    low, high = row.get("predicted_rate_low"), row.get("predicted_rate_high")
    if low is None or high is None:
        return render.num(mid)
    return f"{render.num(mid)} ({render.num(low, 0)}-{render.num(high, 0)})"


def _pct(value: Any) -> str:
    return "-" if value is None else f"{100.0 * float(value):.0f}%"


def render_plan(data: dict[str, Any], width: int | None = None) -> str:
    """The plan: each proposed trial with its numbers, then its hypothesis and basis;
    with ``width``, every line fits it (the table narrowed, the text folded)."""
    best = data.get("best_usd_per_proof")
    target = data.get("target_rate_per_hour")
    reference = render.usd(data.get("reference_usd_per_proof"))
    horizon = data.get("horizon_hours")
    source = clean(data.get("reference_source"))
    label = data.get("offers_label")
    lines = [] if not label else [render.wrap(str(label).capitalize() + ".", width, "  ")]
    lines += [render.wrap(
        f"Reference: a newcomer is worth keeping below {reference}/proof: {source} (the best "
        f"$/proof among kept, proving instances: {render.usd(best) if best else 'none proving yet'}"
        + (f"; autopilot target {render.num(target)}/h" if target else "") + ")", width, "  "),
    ]
    proposals = data.get("proposals") or []
    if proposals:
        lines.append(render.table(
            (
                (
                    p.get("offer_id"),
                    clean(p.get("machine_id")),
                    f"{p.get('num_gpus')}x {clean(p.get('gpu_name'))}",
                    render.usd(p.get("dph_total"), 3),
                    predicted_interval(p),
                    render.num(p.get("break_even_rate_per_hour")),
                    _pct(p.get("probability_passes")),
                    _pct(p.get("probability_beats_best")),
                    render.usd(p.get("trial_cost_usd"), 2),
                    render.usd(p.get("expected_value_usd"), 2),
                )
                for p in proposals
            ),
            ["OFFER", "MACHINE", "GPUS", "$/H", "PRED/H (80%)", "EVEN/H", "P(PASS)",
             "P(BEST)", "TRIAL $", "EXPECTED $"],
            # Priorities at a narrow width: the GPU column gives way last.
            width=width, shrink=("MACHINE",), drop=("MACHINE", "P(PASS)", "EVEN/H"),
            keep=("GPUS",),
        ))
        lines.append(render.wrap(
            "EVEN/H: the break-even rate at the offer's price (its $/h over the reference "
            "$/proof); P(BEST): the chance it beats the fleet's best $/proof; EXPECTED $: "
            "the saving if kept, over "
            + (f"{render.num(horizon, 0)} h" if horizon else "the plan's horizon")
            + " (VM_PLAN_HORIZON_HOURS), less the trial's cost.", width))
        lines.append("")
        for p in proposals:
            lines.append(render.wrap(f"offer {p.get('offer_id')}: {clean(p.get('hypothesis'))}",
                                     width, "    "))
            lines.append(render.wrap(f"    basis: {clean(p.get('prediction_basis'))}", width,
                                     "    "))
    lines.append(render.wrap(
        f"{len(proposals)} proposed of {data.get('considered')} offers considered "
        f"({data.get('worth_trying')} worth their trial): {clean(data.get('stop_reason'))}",
        width, "  "))
    measured = data.get("measured") or []
    if measured:
        lines.append("")
        lines.append(render.wrap(
            f"Already measured (not trials: deploy them, or not, on their measurement), "
            f"{len(measured)}:", width))
        lines.append(render.table(
            (
                (
                    m.get("offer_id"),
                    clean(m.get("machine_id")),
                    f"{m.get('num_gpus')}x {clean(m.get('gpu_name'))}",
                    render.usd(m.get("dph_total"), 3),
                    predicted_interval(m),
                    render.usd(m.get("predicted_usd_per_proof"), 5),
                    "deploy" if m.get("worth_deploying") else "no",
                )
                for m in measured
            ),
            ["OFFER", "MACHINE", "GPUS", "$/H", "PRED/H (80%)", "$/PROOF", "WORTH IT"],
            width=width, shrink=("MACHINE",), drop=("MACHINE",), keep=("GPUS",),
        ))
    if data.get("model_stale"):
        lines.append(render.wrap(f"model stale: {clean(data.get('model_stale_reason'))}", width))
    return "\n".join(lines)


def render_autopilot(data: dict[str, Any]) -> str:
    """The autopilot: its switch, caps, last decision and what it did, with the reasons."""
    state = data.get("state")
    switch = data.get("switch") or {}
    lines = [f"Autopilot: {str(state).upper()}"
             + (f" ({clean(switch.get('reason'))}, {render.ago(switch.get('changed_at'))})"
                if switch else "")]
    caps = data.get("caps")
    if caps:
        lines.append(
            f"  target {render.num(caps.get('target_rate_per_hour'))}/h; caps "
            f"{render.usd(caps.get('max_dph_total'), 2)}/h, {caps.get('max_instances')} "
            f"instances, trials within {_pct(caps.get('max_explore_share'))} of spend, "
            f"{caps.get('max_concurrent_trials')} at once, explorations at least "
            f"{render.num(caps.get('explore_interval_s'), 0)} s apart")
    else:
        lines.append("  not configured: serve with --autopilot and its caps")
    tick = data.get("last_tick")
    if tick:
        ledger = tick.get("ledger") or {}
        lines.append(
            f"  last decision {render.ago(tick.get('at'))}: fleet "
            f"{render.num(tick.get('fleet_rate_per_hour'))}/h "
            f"for {render.usd(tick.get('fleet_dph_total'), 2)}/h, {tick.get('instances')} "
            f"instances ({tick.get('trials')} on trial); trials {_pct(ledger.get('trial_share'))} "
            f"of {render.usd(ledger.get('total_usd'), 2)} spent in the last "
            f"{render.num(ledger.get('window_h'), 0)} h")
        for note in tick.get("notes") or []:
            lines.append(f"    holding back: {clean(note)}")
    lines += event_lines(data.get("events") or [], "What it did, and why:", 1000,
                         "%m-%d %H:%M:%S", kind=False)
    return "\n".join(lines)
