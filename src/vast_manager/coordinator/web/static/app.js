// vast-manager dashboard: plain JS over the operator API, no build step.
// Every value a host sent (names, labels, log lines, reasons) reaches the page
// through textContent or an attribute set by code, never through HTML parsing,
// and through safeText (textsafe.js, generated from coordinator/cli/render.py), so
// control and bidi characters show as escapes instead of acting on the page.
"use strict";

const REFRESH_MS = 3000;
const OFFERS_REFRESH_MS = 60000;
// Instances a page of the fleet table shows (the API pages by id: limit and after_id).
const FLEET_PAGE = 100;
const RESULTS_PAGE = 20; // an instance's results per page (at most the API's 200)
const SVG_NS = "http://www.w3.org/2000/svg";
const VIEWS = ["login-view", "fleet-view", "offers-view", "hosts-view", "bad-hosts-view",
  "autopilot-view", "instance-view"];

const state = {
  csrf: null,
  timer: null,
  busy: false,
  offerFilter: "",
  armed: null, // the button waiting for its confirming second click
  offersKey: null,
  offersAt: 0,
  // The fleet table: its state filter ("" for all), the after_id of each page visited
  // (null for the first), and the next page's after_id (null on the last page).
  fleet: { filter: "", cursors: [null], next: null },
  // An instance's results, newest first, a page at a time: the instance shown, the
  // results_before of each page visited (null for the newest) and the next older page's.
  results: { id: null, cursors: [null], next: null },
  planAt: 0,
};

class AuthError extends Error {}

// --- small helpers -------------------------------------------------------------------

function $(id) {
  return document.getElementById(id);
}

// Build an element; children are nodes or strings (strings become text nodes).
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "class") node.className = value;
    else node.setAttribute(name, value === true ? "" : safeText(value));
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(safeText(child)));
  }
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, String(value));
  return node;
}

function num(value, digits = 1, suffix = "") {
  if (value === null || value === undefined || Number.isNaN(Number(value))) return "-";
  return Number(value).toFixed(digits) + suffix;
}

function usd(value, digits = 4) {
  if (value === null || value === undefined) return "-";
  return "$" + Number(value).toFixed(digits);
}

function gb(bytes) {
  return bytes === null || bytes === undefined ? "-" : (bytes / 1e9).toFixed(1) + " GB";
}

function ago(ts) {
  if (!ts) return "-";
  const s = Math.max(0, Date.now() / 1000 - ts);
  if (s < 90) return Math.round(s) + "s ago";
  if (s < 5400) return Math.round(s / 60) + "m ago";
  if (s < 172800) return Math.round(s / 3600) + "h ago";
  return Math.round(s / 86400) + "d ago";
}

function clock(ts) {
  return new Date(ts * 1000).toLocaleTimeString([], { hour12: false });
}

// A date and time, for what ends days from now (a block's expiry).
function when(ts) {
  return new Date(ts * 1000).toLocaleString([], { hour12: false });
}

function progressText(p) {
  if (!p) return "";
  if (p.unit === "bytes" && p.total) return Math.round((100 * p.done) / p.total) + "%";
  return `${p.done}/${p.total} ${p.unit || ""}`.trim();
}

function flash(message, isError) {
  const node = $("flash");
  node.textContent = safeText(message);
  node.className = isError ? "flash error" : "flash";
  node.hidden = false;
}

function fill(tbody, rows) {
  tbody.replaceChildren(...rows);
  labelCells(tbody);
}

// Each cell carries its column's heading (data-label): on a phone the stylesheet shows
// every row as a card of "heading value" lines instead of a table wider than the screen.
function labelCells(tbody) {
  const table = tbody.closest("table");
  const heads = table && table.tHead ? [...table.tHead.rows[0].cells] : [];
  const names = heads.map((th) => th.textContent.trim());
  for (const row of tbody.rows) {
    [...row.cells].forEach((cell, i) => {
      if (names[i]) cell.dataset.label = names[i];
    });
  }
}

function td(...children) {
  return el("td", {}, ...children);
}

// A cell of free text (a label, a place, host-sent words): it wraps instead of widening
// the table past the screen.
function tdText(...children) {
  return el("td", { class: "text" }, ...children);
}

// Two clicks to act: the first arms the button, the second (within 5 s) runs.
function confirmClick(button, label, action) {
  button.addEventListener("click", async () => {
    if (state.armed !== button) {
      if (state.armed) state.armed.textContent = state.armed.dataset.label;
      button.dataset.label = button.textContent;
      button.textContent = label;
      button.classList.add("armed");
      state.armed = button;
      setTimeout(() => {
        if (state.armed === button) {
          button.textContent = button.dataset.label;
          button.classList.remove("armed");
          state.armed = null;
        }
      }, 5000);
      return;
    }
    state.armed = null;
    button.disabled = true;
    try {
      await action();
    } finally {
      button.disabled = false;
    }
  });
}

// --- the API ---------------------------------------------------------------------------

// The next page's after_id from a `Link: <...>; rel="next"` header; null on the last page.
function nextAfterId(link) {
  const match = /<([^>]*)>\s*;\s*rel="?next"?/i.exec(link || "");
  if (!match) return null;
  const after = new URL(match[1], location.href).searchParams.get("after_id");
  return after === null ? null : Number(after);
}

async function api(method, path, body) {
  return (await call(method, path, body)).data;
}

// One page of a paged list: { rows, next } (next: the after_id of the page after it).
async function apiPage(path) {
  const { data, resp } = await call("GET", path);
  return { rows: data, next: nextAfterId(resp.headers.get("Link")) };
}

async function call(method, path, body) {
  const options = { method, credentials: "same-origin", headers: {} };
  if (method !== "GET") options.headers["X-CSRF-Token"] = state.csrf || "";
  if (body !== undefined) {
    options.headers["Content-Type"] = "application/json";
    options.body = JSON.stringify(body);
  }
  const resp = await fetch(path, options);
  let data = null;
  try {
    data = await resp.json();
  } catch (_err) {
    data = null;
  }
  if (resp.status === 401) {
    state.csrf = null;
    showLogin();
    throw new AuthError("not logged in");
  }
  if (!resp.ok) throw new Error((data && data.message) || `${method} ${path}: ${resp.status}`);
  return { data, resp };
}

async function act(method, path, body) {
  try {
    const answer = await api(method, path, body);
    state.offersAt = 0;
    flash((answer && answer.message) || "Done.", false);
    await refresh();
    return answer;
  } catch (err) {
    if (!(err instanceof AuthError)) flash(err.message, true);
    return null;
  }
}

// --- login -----------------------------------------------------------------------------

function show(viewId) {
  for (const id of VIEWS) $(id).hidden = id !== viewId;
}

function showLogin() {
  clearTimeout(state.timer);
  show("login-view");
  $("nav").hidden = true;
  $("logout").hidden = true;
  $("flash").hidden = true;
  $("updated").textContent = "";
}

async function login(event) {
  event.preventDefault();
  $("login-error").textContent = "";
  const resp = await fetch("/auth/login", {
    method: "POST",
    credentials: "same-origin",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ token: $("token").value }),
  });
  const data = await resp.json().catch(() => null);
  if (!resp.ok) {
    $("login-error").textContent = safeText((data && data.message) || "Login failed.");
    return;
  }
  $("token").value = "";
  state.csrf = data.csrf_token;
  start();
}

async function logout() {
  await fetch("/auth/logout", {
    method: "POST",
    credentials: "same-origin",
    headers: { "X-CSRF-Token": state.csrf || "" },
  });
  state.csrf = null;
  showLogin();
}

async function resume() {
  const resp = await fetch("/auth/session", { credentials: "same-origin" });
  if (!resp.ok) {
    showLogin();
    return;
  }
  const data = await resp.json();
  state.csrf = data.csrf_token;
  start();
}

function start() {
  $("nav").hidden = false;
  $("logout").hidden = false;
  refresh();
}

// --- routing and refresh ---------------------------------------------------------------

function route() {
  const hash = location.hash.replace(/^#\/?/, "");
  const match = /^instance\/(\d+)$/.exec(hash);
  if (match) return { name: "instance", id: match[1] };
  if (hash === "offers") return { name: "offers" };
  if (hash === "hosts") return { name: "hosts" };
  if (hash === "bad-hosts") return { name: "bad-hosts" };
  if (hash === "autopilot") return { name: "autopilot" };
  return { name: "fleet" };
}

async function refresh() {
  clearTimeout(state.timer);
  if (!state.csrf) return;
  const r = route();
  for (const link of document.querySelectorAll("#nav a")) {
    link.classList.toggle("active", link.dataset.route === r.name);
  }
  // A button waiting for its second click must not be redrawn away under the pointer.
  const armed = state.armed && document.contains(state.armed);
  if (!document.hidden && !state.busy && !armed) {
    state.busy = true;
    try {
      if (r.name === "fleet") await renderFleet();
      else if (r.name === "offers") await renderOffers();
      else if (r.name === "hosts") await renderHosts();
      else if (r.name === "bad-hosts") await renderBadHosts();
      else if (r.name === "autopilot") await renderAutopilot();
      else await renderInstance(r.id);
      $("updated").textContent = "updated " + new Date().toLocaleTimeString([], { hour12: false });
    } catch (err) {
      if (err instanceof AuthError) {
        state.busy = false;
        return;
      }
      flash(err.message, true);
    } finally {
      state.busy = false;
    }
  }
  state.timer = setTimeout(refresh, REFRESH_MS);
}

// --- fleet -----------------------------------------------------------------------------

function tile(label, value) {
  return el("div", { class: "tile" }, el("div", { class: "tile-value" }, value),
    el("div", { class: "tile-label" }, label));
}

function phaseCell(inst) {
  // A gone instance's last heartbeat phase (terminating) is history, not its phase.
  const gone = STATE_SETS.GONE.has(inst.state);
  const cell = td(gone ? "-" : inst.phase || "-");
  if (gone) return cell;
  const p = inst.progress;
  if (p && p.total) {
    cell.append(" ", el("progress", { max: p.total, value: p.done }), " ",
      el("span", { class: "muted" }, progressText(p)));
  }
  return cell;
}

// A lost or idle instance proves nothing now: it shows no rate and no cost per proof.
function silent(r) {
  return Boolean(r.idle) || r.state === STATES.LOST;
}

// The provider's view beside ours: vast.ai's instance id and its actual_status.
function providerText(r) {
  if (r.provider_instance_id === null || r.provider_instance_id === undefined) return "-";
  if (r.provider === "local") return `local ${r.provider_instance_id}`;
  return `${r.provider_instance_id} ${r.provider_status || "?"}`;
}

// Instances of the local provider and of the fake vast.ai (`serve --provider fake`) run
// the simulated cuzk: say so beside their numbers.
const SIMULATED_PROVIDERS = { local: "local provider", fake: "fake vast.ai" };

function simulatedTag(r) {
  const source = SIMULATED_PROVIDERS[r.provider];
  return source
    ? el("span", { class: "sim-tag", title: `simulated cuzk and hardware (${source})` },
      " sim")
    : "";
}

// How a state reads at a glance (style.css colours each): proving is good; ending or
// silent is bad; gone is muted; the rest is on its way. From the sets of states.js.
function stateTone(s) {
  if (STATE_SETS.GONE.has(s)) return "gone";
  if (STATE_SETS.ENDING.has(s) || s === STATES.LOST) return "bad";
  return s === STATES.PROVING ? "good" : "busy";
}

// The state filter's choices: every state some instance is in, with its count.
function fleetFilter(byState, total, idle) {
  const select = $("fleet-state");
  const current = state.fleet.filter;
  const counts = { ...byState };
  // idle is shown as a state, so it is a filter too (proving then means the others).
  if (idle) {
    counts.idle = idle;
    counts.proving = Math.max(0, (counts.proving || 0) - idle);
  }
  if (current && !(current in counts)) counts[current] = 0;
  const choices = [["", `all states (${total})`],
    ...Object.keys(counts).sort().map((s) => [s, `${s} (${counts[s]})`])];
  // Rebuilt only when a count changed: a list open under the pointer stays open.
  const key = JSON.stringify(choices);
  if (select.dataset.key !== key) {
    select.dataset.key = key;
    select.replaceChildren(...choices.map(([value, text]) => el("option", { value }, text)));
    select.value = current;
  }
  return current ? counts[current] : total;
}

async function renderFleet() {
  const fleet = state.fleet;
  const after = fleet.cursors[fleet.cursors.length - 1];
  const query = new URLSearchParams({ limit: String(FLEET_PAGE) });
  if (fleet.filter) query.set("state", fleet.filter);
  if (after !== null) query.set("after_id", String(after));
  // The tiles come from the coordinator's own sums, the table one page at a time: the
  // refresh costs the same for ten instances as for a hundred thousand.
  const [summary, page, events] = await Promise.all([
    api("GET", "/api/fleet"),
    apiPage("/api/instances?" + query),
    api("GET", "/api/events?limit=30"),
  ]);
  show("fleet-view");
  // On the local fleet or the fake vast.ai every rate and dollar is simulated: said once.
  const simulated = SIMULATED_PROVIDERS[summary.provider] ||
    page.rows.some((r) => SIMULATED_PROVIDERS[r.provider]);
  $("fleet-tiles").replaceChildren(
    tile("instances billing", String(summary.billing)),
    tile("proving", String(summary.proving)),
    tile("idle (billing, proving nothing)", String(summary.idle ?? 0)),
    tile("proofs / hour (benchmark rates, idle left out)", num(summary.proofs_per_hour, 1)),
    tile("completed / hour (cuzk)", num(summary.completed_proofs_per_hour, 1)),
    tile("$ / hour (what vast.ai bills now)", usd(summary.dollars_per_hour, 3)),
    tile("$ / proof", summary.dollars_per_proof === null ? "-" : usd(summary.dollars_per_proof)),
    ...spendTiles(summary.spend),
    ...accountTiles(summary.account, summary.provider),
    ...earningsTiles(summary),
    ...(simulated ? [tile("rates and dollars (local provider or fake vast.ai)", "simulated")]
      : []),
  );
  accountBanner(summary.account, summary.faults);
  searchBanner(summary.offer_cache);
  priceBanner(summary.pending_price_increases);
  clusterBanner(summary.cluster);
  const rows = page.rows;
  fill(
    $("fleet-table").tBodies[0],
    rows.map((r) =>
      el("tr", { "data-instance-id": r.id, "data-state": r.state },
        td(el("a", { href: `#/instance/${r.id}`, class: "instance-link" }, String(r.id))),
        tdText(r.label || "-"),
        td(r.idle
          ? el("span", { class: "state state-bad", title: r.idle_reason || "" }, "idle")
          : el("span", { class: `state state-${stateTone(r.state)}` }, r.state || "-")),
        phaseCell(r),
        tdText(`${r.num_gpus || "?"} x ${r.gpu_name || "?"}`),
        td(usd(r.billing_now_per_hour, 3)),
        // A lost or idle instance proves nothing now: no rate, no $/proof (one reading).
        td(silent(r) ? "-" : num(r.rate_per_hour), silent(r) ? "" : simulatedTag(r)),
        td(num(r.completed_rate_per_hour)),
        tdText(deliveredText(r)),
        td(silent(r) ? "-" : usd(r.usd_per_proof)),
        td(r.profit_per_hour === null || r.profit_per_hour === undefined
          ? "-" : usd(r.profit_per_hour, 3)),
        td(usd(r.cost && r.cost.billed && r.cost.billed.total, 2)),
        td(ago(r.last_seen) + (r.last_seen && r.heard_since_start === false
          ? " (before restart)" : "")),
        tdText(providerText(r)),
      ),
    ),
  );
  const matching = fleetFilter(summary.by_state, summary.instances, summary.idle);
  fleet.next = page.next;
  const first = (fleet.cursors.length - 1) * FLEET_PAGE;
  $("fleet-range").textContent = rows.length
    ? `${first + 1}–${first + rows.length} of ${matching}` : "";
  $("fleet-prev").disabled = fleet.cursors.length === 1;
  $("fleet-next").disabled = page.next === null;
  $("fleet-empty").textContent = fleet.filter
    ? `No instances in state ${fleet.filter}.` : "No instances yet: deploy one from Offers.";
  $("fleet-empty").hidden = rows.length > 0;
  const idle = rows.filter((r) => r.idle);
  $("fleet-idle").hidden = idle.length === 0;
  $("fleet-idle").replaceChildren(...idle.map((r) => el("div", {},
    el("a", { href: `#/instance/${r.id}` }, `#${r.id}`),
    ` is idle, billing ${usd(r.billing_now_per_hour, 3)}/h: ${r.idle_reason || ""}` +
    (r.idle_stop_at ? `; destroyed at ${clock(r.idle_stop_at)} unless a proof completes`
      : ""))));
  renderEvents($("events"), events.slice().reverse());
}

// The vast.ai account (docs/operations.md, "The account"): funds as tiles, and a banner
// when the key is refused, deploys are paused, or the funds are low.
function accountTiles(account, provider) {
  if (!account || account.funds_usd === null || account.funds_usd === undefined) return [];
  return [tile(provider === "fake" ? "fake vast.ai funds (simulated)" : "vast.ai funds",
    usd(account.funds_usd, 2))];
}

// Spent so far (docs/operations.md, "Spend"): today, this week, all time.
function spendTiles(spend) {
  if (!spend) return [];
  return [["today", "spent today (UTC)"], ["week", "spent, last 7 days"],
    ["all_time", "spent, all time"]].map(([key, label]) =>
    tile(label, usd(spend[key] && spend[key].total, 2)));
}

function accountBanner(account, faults) {
  const banner = $("account-banner");
  // A fleet fault (docs/policy.md, "Blame"): its cause and fix, first.
  const fault = (faults || [])[0];
  if (fault) {
    banner.hidden = false;
    banner.className = "account-banner";
    banner.textContent = safeText(`Deploys and the autopilot are paused: fault ${fault.id} ` +
      `(${fault.fault}'s): ${fault.cause}. Fix: ${fault.fix}`);
    return;
  }
  const alert = account && (account.auth_ok === false ? account.auth_error
    : account.paused || account.warning);
  banner.hidden = !alert;
  banner.className = "account-banner" + (account && account.auth_ok !== false &&
    !account.paused ? " warn" : "");
  banner.textContent = alert
    ? safeText((account.auth_ok === false ? "vast.ai refused the API key: " : "") + alert +
      (account.paused ? " — deploys and the autopilot are paused." : ""))
    : "";
}

// vast.ai's daily search quota (docs/vast.md): while it is spent, offers come from the cache.
function searchBanner(cache) {
  const banner = $("search-banner");
  const alert = cache && cache.alert;
  banner.hidden = !alert;
  banner.textContent = alert ? safeText(alert) : "";
}

// Hosts' pending price increases on our instances, each with the coordinator's verdict.
function priceBanner(pending) {
  const banner = $("price-banner");
  const rows = pending || [];
  banner.hidden = rows.length === 0;
  banner.replaceChildren(...rows.map((p) => el("div", {},
    `Instance ${p.instance_id}: price increase ${p.pending_price_increase_id} ` +
    `(${p.verdict}): ${p.reason}`)));
}

// Production as the cluster records it (docs/operations.md): delivered beside claimed,
// the source's alert, and earnings with a proof price set.
function deliveredText(r) {
  if (r.delivered_source !== "cluster") {
    return (r.cluster_status || "").startsWith("unattributable") ? "unattributable" : "-";
  }
  return `${num(r.delivered_rate_per_hour)} (${r.tasks_failed ?? 0} failed)`;
}

function earningsTiles(summary) {
  if (summary.revenue_per_hour === null || summary.revenue_per_hour === undefined) return [];
  return [tile("revenue / hour", usd(summary.revenue_per_hour, 2)),
    tile("full cost / hour", usd(summary.cost_per_hour, 2)),
    tile("profit / hour", usd(summary.profit_per_hour, 2))];
}

function clusterBanner(cluster) {
  const banner = $("cluster-alert");
  const alert = cluster && cluster.alert;
  banner.hidden = !alert;
  banner.textContent = alert ? safeText(alert +
    " — decisions use the agents' counters; nothing is destroyed for it.") : "";
}

function costText(parts) {
  if (!parts) return "-";
  return `${usd(parts.total)} (rent ${usd(parts.rent)}, storage ${usd(parts.storage)}, ` +
    `bandwidth ${usd(parts.bandwidth)})`;
}

function renderEvents(list, events) {
  list.replaceChildren(
    ...events.map((e) =>
      el("li", {},
        el("span", { class: "muted" }, clock(e.ts)), " ",
        // A reason that already starts with its kind ("timeout: ...") says it once.
        (e.reason || "").startsWith(`${e.kind}:`) ? "" : el("span", { class: "event-kind" },
          e.kind || ""), " ",
        e.instance_id ? el("a", { href: `#/instance/${e.instance_id}` }, `#${e.instance_id}`) : "",
        e.instance_id ? " " : "",
        e.reason || ""),
    ),
  );
}

// --- measured hosts, scaling verdicts, the rate model -------------------------------------

async function renderHosts() {
  const [hosts, scaling, model] = await Promise.all([
    api("GET", "/api/host-perf"),
    api("GET", "/api/scaling"),
    api("GET", "/api/model"),
  ]);
  show("hosts-view");
  fill($("hosts-table").tBodies[0], hosts.map((h) =>
    el("tr", { "data-machine-id": h.machine_id },
      td(String(h.machine_id)), tdText(h.gpu_name || "-"), td(String(h.num_gpus ?? "-")),
      td(num(h.median_rate_per_hour)), td(num(h.best_rate_per_hour)),
      td(num(h.last_rate_per_hour)), td(String(h.samples ?? 0)),
      td(String(h.imported_samples ?? 0)), td(usd(h.usd_per_proof)))));
  $("hosts-empty").hidden = hosts.length > 0;
  fill($("scaling-table").tBodies[0], scaling.map((r) =>
    el("tr", {},
      td(String(r.machine_id)), tdText(`${r.num_gpus} x ${r.gpu_name}`),
      td(num(r.rate_all_per_hour)),
      td(r.rate_one_per_hour === null || r.rate_one_per_hour === undefined ? "no one-GPU run"
        : num(r.rate_one_per_hour)),
      td(num(r.efficiency, 2)),
      td(String(r.bottleneck || "-") +
        (r.agent_bottleneck ? ` (agent: ${r.agent_bottleneck})` : "")),
      tdText((r.evidence || []).join("; ") || "-"))));
  $("scaling-empty").hidden = scaling.length > 0;
  const factors = (group) => Object.entries(model[group] || {})
    .sort(([a], [b]) => a.localeCompare(b))
    .map(([k, v]) => `${k} x${Number(v).toFixed(2)}`).join(", ") || "-";
  facts($("model-facts"), [
    ["measurements", `${model.measurements ?? 0} of ${model.machines ?? 0} machine(s)` +
      ` (${model.imported ?? 0} imported, ${model.skipped ?? 0} unreadable)`],
    ["fitted", ago(model.fitted_at)],
    ["host spread (log rate)", num(model.sigma_host, 3)],
    ["benchmark noise (log rate)", num(model.sigma_noise, 3)],
    ["new hosts' intervals", "x" + num(model.interval_scale, 2) +
      " (calibrated on measured machines: how unsure the model is of a host it has not seen)"],
    ["GPU models", factors("gpu_models")],
    ["CPU families", factors("cpu_families")],
  ]);
}

// --- offers ----------------------------------------------------------------------------

function offerFlags(o) {
  const flags = [];
  if (o.bad_host) flags.push("BAD-HOST");
  if (o.known) flags.push("known");
  if (o.too_small) flags.push("TOO-SMALL");
  if (o.predicted_rate_per_hour === null || o.predicted_rate_per_hour === undefined) {
    if (!o.too_small) flags.push("unpredicted");
  }
  return flags.join(", ") || "-";
}

async function renderOffers() {
  const query = state.offerFilter ? "?filter=" + encodeURIComponent(state.offerFilter) : "";
  // Offers come from the provider's search (vast.ai's API): not on every tick.
  const fresh = state.offersKey === query && Date.now() - state.offersAt < OFFERS_REFRESH_MS;
  show("offers-view");
  if (fresh) return;
  const [rows, fleet] = await Promise.all([api("GET", "/api/offers" + query),
    api("GET", "/api/fleet")]);
  state.offersKey = query;
  state.offersAt = Date.now();
  fill(
    $("offers-table").tBodies[0],
    rows.map((o) => {
      const button = el("button", { type: "button", class: "deploy", "data-offer-id": o.id },
        "Deploy");
      // Disabled where the coordinator would refuse the deploy, with the reason.
      const pricey = fleet.max_deploy_dph_total !== undefined &&
        Number(o.dph_total) > Number(fleet.max_deploy_dph_total);
      const refusal = o.bad_host ? "this machine is on the bad-hosts list"
        : o.too_small ? (o.prediction_basis || "the instance's share of the host is too small")
          : pricey ? `above VM_MAX_DEPLOY_DPH_TOTAL ($${fleet.max_deploy_dph_total}/h)` : null;
      if (refusal) {
        button.disabled = true;
        button.title = refusal;
      }
      confirmClick(button, "Confirm deploy", async () => {
        const answer = await act("POST", "/api/deploy", { offer_id: Number(o.id) });
        if (answer && answer.instance_id) location.hash = `#/instance/${answer.instance_id}`;
      });
      const basis = el("td", { class: "basis" }, o.prediction_basis || "-");
      return el("tr", { "data-offer-id": o.id },
        td(String(o.id)),
        td(button),
        td(String(o.machine_id ?? "-")),
        tdText(`${o.num_gpus} x ${o.gpu_name}`),
        td(usd(o.dph_total, 3)),
        td(predictedInterval(o)),
        td(usd(o.predicted_usd_per_proof)),
        // CPU and RAM: the instance's share of the host, as the CLI shows them.
        td(num(o.instance_cpu_cores ?? o.cpu_cores_effective, 0)),
        td(num(o.instance_ram_gb, 0)),
        td(num(o.pcie_bw, 1)),
        tdText(o.geolocation || "-"),
        td(offerFlags(o)),
        basis);
    }),
  );
  $("offers-empty").hidden = rows.length > 0;
  // The offer cache's age ("offers as of 4 min ago"; stale while searches are stopped).
  const age = rows.length ? rows[0].offers_label : null;
  $("offers-age").hidden = !age;
  $("offers-age").textContent = age ? safeText(age) : "";
  offersChart($("chart-offers"), rows, fleet.max_usd_per_proof);
}

// Price against predicted rate: each offer a dot with its 80% interval as a bar, measured
// hosts ringed, and lines of equal $/proof through the origin (price = $/proof x rate), the
// break-even one (VM_MAX_USD_PER_PROOF) drawn bold: offers right of it pay for themselves.
function offersChart(node, rows, breakEven) {
  const W = 640, H = 260, L = 52, R = 96, T = 10, B = 30;
  const shown = rows.filter((o) => o.predicted_rate_per_hour !== null &&
    o.predicted_rate_per_hour !== undefined && o.dph_total);
  node.replaceChildren();
  node.dataset.points = String(shown.length);
  if (shown.length === 0) {
    const text = svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "chart-empty" });
    text.textContent = "no predicted offer";
    node.append(text);
    return;
  }
  const high = (o) => Number(o.predicted_rate_high ?? o.predicted_rate_per_hour);
  const xmax = Math.max(...shown.map(high)) * 1.05 || 1;
  const ymax = Math.max(...shown.map((o) => Number(o.dph_total))) * 1.15 || 1;
  const x = (v) => L + (Math.min(v, xmax) / xmax) * (W - L - R);
  const y = (v) => T + (1 - Math.min(v, ymax) / ymax) * (H - T - B);
  for (let i = 0; i <= 4; i += 1) {
    const v = (ymax * i) / 4;
    node.append(svg("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), class: "grid" }));
    const label = svg("text", { x: L - 6, y: y(v) + 4, "text-anchor": "end", class: "axis" });
    label.textContent = "$" + v.toFixed(2);
    node.append(label);
    const xv = (xmax * i) / 4;
    const xl = svg("text", { x: x(xv), y: H - 12, "text-anchor": "middle", class: "axis" });
    xl.textContent = axisNumber(xv);
    node.append(xl);
  }
  const caption = svg("text", { x: W - R, y: H - 1, "text-anchor": "end", class: "axis" });
  caption.textContent = "predicted proofs/h (80% interval)";
  node.append(caption);
  // Lines of equal $/proof: the break-even one, twice it, and its half and quarter, each
  // marked at its end with its multiple (the legend on the right says of what).
  const levels = breakEven ? [[0.25, "¼"], [0.5, "½"], [1, "1"], [2, "2"]] : [];
  for (const [k, mark] of levels) {
    const c = breakEven * k;
    const x2 = Math.min(xmax, ymax / c);
    const even = k === 1;
    node.append(svg("line", { x1: x(0), y1: y(0), x2: x(x2), y2: y(c * x2),
      class: even ? "iso break-even" : "iso" }));
    const atTop = x2 < xmax;
    const label = svg("text", { x: x(x2) + (atTop ? 0 : 4), y: atTop ? T + 10 : y(c * x2) + 4,
      "text-anchor": atTop ? "middle" : "start",
      class: even ? "legend break-even-label" : "axis" });
    label.textContent = `${mark}×`;
    node.append(label);
  }
  if (breakEven) {
    const lines = [["break-even", "legend break-even-label"],
      [`1× = $${breakEven.toFixed(4)}`, "legend break-even-label"], ["per proof", "axis"],
      ["dashed: ¼ ½ 2×", "axis"]];
    lines.forEach(([text, cls], i) => {
      const key = svg("text", { x: W - R + 8, y: T + 24 + i * 14, class: cls });
      key.textContent = text;
      node.append(key);
    });
  }
  for (const o of shown) {
    const mid = Number(o.predicted_rate_per_hour);
    const lo = Number(o.predicted_rate_low ?? mid);
    const price = Number(o.dph_total);
    const cls = o.bad_host ? "offer-dot bad" : o.too_small ? "offer-dot small" : "offer-dot";
    node.append(svg("line", { x1: x(lo), x2: x(high(o)), y1: y(price), y2: y(price),
      class: "interval" }));
    const dot = svg("circle", { cx: x(mid), cy: y(price), r: o.known ? 5 : 3.5, class: cls,
      "data-offer-id": o.id });
    if (o.known) dot.classList.add("measured");
    const title = svg("title", {});
    title.textContent = safeText(`offer ${o.id}: ${o.num_gpus} x ${o.gpu_name}, ` +
      `$${price.toFixed(3)}/h, ${predictedInterval(o)}/h` + (o.known ? " (measured host)" : ""));
    dot.append(title);
    node.append(dot);
  }
}

// The median and, in brackets, the 80% interval of a predicted rate.
function predictedInterval(o) {
  if (o.predicted_rate_per_hour === null || o.predicted_rate_per_hour === undefined) return "-";
  if (o.predicted_rate_low === null || o.predicted_rate_low === undefined) {
    return num(o.predicted_rate_per_hour);
  }
  return `${num(o.predicted_rate_per_hour)} (${num(o.predicted_rate_low, 0)}-` +
    `${num(o.predicted_rate_high, 0)})`;
}

function pct(value) {
  return value === null || value === undefined ? "-" : Math.round(100 * value) + "%";
}

// --- autopilot and plan ----------------------------------------------------------------

async function renderAutopilot() {
  const pilot = await api("GET", "/api/autopilot?limit=50");
  show("autopilot-view");
  const sw = pilot.switch;
  $("autopilot-state").textContent = safeText(
    String(pilot.state).toUpperCase() + (sw ? ` (${sw.reason}, ${ago(sw.changed_at)})` : ""));
  const caps = pilot.caps;
  $("autopilot-caps").textContent = safeText(caps
    ? `target ${num(caps.target_rate_per_hour)}/h; caps ${usd(caps.max_dph_total, 2)}/h, ` +
      `${caps.max_instances} instances, trials within ${pct(caps.max_explore_share)} of ` +
      `spend, ${caps.max_concurrent_trials} at once`
    : "Not configured: serve with --autopilot and its caps.");
  const tick = pilot.last_tick;
  $("autopilot-last").textContent = safeText(tick
    ? `Last decision ${ago(tick.at)}: fleet ${num(tick.fleet_rate_per_hour)}/h for ` +
      `${usd(tick.fleet_dph_total, 2)}/h, ${tick.instances} instances (${tick.trials} on ` +
      `trial); trials ${pct(tick.ledger.trial_share)} of ${usd(tick.ledger.total_usd, 2)} spent`
    : "");
  $("autopilot-notes").replaceChildren(
    ...((tick && tick.notes) || []).map((n) => el("li", {}, "holding back: " + n)));
  $("autopilot-stop").hidden = pilot.state !== "running";
  $("autopilot-start").hidden = !pilot.configured || pilot.state === "running";
  $("autopilot-events").replaceChildren(
    ...pilot.events.slice().reverse().map((e) =>
      el("li", {},
        el("span", { class: "muted" }, clock(e.ts)), " ",
        e.instance_id ? el("a", { href: `#/instance/${e.instance_id}` }, `#${e.instance_id}`) : "",
        e.instance_id ? " " : "",
        e.reason || "")),
  );
  // The plan searches the offers (the provider's API): once a minute, not every tick.
  if (Date.now() - state.planAt < OFFERS_REFRESH_MS) return;
  state.planAt = Date.now();
  const plan = await api("GET", "/api/plan?trials=10");
  $("plan-summary").textContent = safeText(
    `A newcomer is worth keeping below ${usd(plan.reference_usd_per_proof)}/proof; ` +
    `${plan.proposals.length} proposed of ${plan.considered} offers: ${plan.stop_reason}. ` +
    "Expected $: the saving if kept, over " +
    (plan.horizon_hours ? `${num(plan.horizon_hours, 0)} h` : "the plan's horizon") +
    " (VM_PLAN_HORIZON_HOURS), less the trial's cost.");
  fill(
    $("plan-table").tBodies[0],
    plan.proposals.map((p) =>
      el("tr", { "data-offer-id": p.offer_id },
        td(String(p.offer_id)), td(`${p.num_gpus} x ${p.gpu_name}`), td(usd(p.dph_total, 3)),
        td(predictedInterval(p)), td(num(p.break_even_rate_per_hour)),
        td(pct(p.probability_passes)), td(pct(p.probability_beats_best)),
        td(usd(p.trial_cost_usd, 2)), td(usd(p.expected_value_usd, 2)),
        el("td", { class: "basis" },
          el("span", { title: p.prediction_basis || "" }, p.hypothesis || "")))),
  );
}

// --- bad hosts -------------------------------------------------------------------------

async function renderBadHosts() {
  const rows = await api("GET", "/api/bad-hosts");
  show("bad-hosts-view");
  fill(
    $("bad-hosts-table").tBodies[0],
    rows.map((b) => {
      const button = el("button", { type: "button", class: "remove-bad-host" }, "Remove");
      confirmClick(button, "Confirm remove", () =>
        act("DELETE", "/api/bad-hosts/" + encodeURIComponent(b.machine_id)));
      // Forgive: the block lifted and its strikes taken back (counting starts again).
      const forgive = el("button", { type: "button", class: "forgive-bad-host" }, "Forgive");
      confirmClick(forgive, "Confirm forgive", () =>
        act("POST", "/api/bad-hosts/" + encodeURIComponent(b.machine_id) + "/forgive"));
      return el("tr", { "data-machine-id": b.machine_id },
        td(String(b.machine_id)), td(ago(b.added_at)),
        td(b.expires_at ? when(b.expires_at) : "-"), td(b.source || "-"),
        tdText(b.reason || "-"), td(button, " ", forgive));
    }),
  );
  $("bad-hosts-empty").hidden = rows.length > 0;
}

async function addBadHost(event) {
  event.preventDefault();
  const machine = $("bad-host-machine").value.trim();
  const reason = $("bad-host-reason").value.trim();
  if (!machine) return;
  const answer = await act("POST", "/api/bad-hosts",
    reason ? { machine_id: machine, reason } : { machine_id: machine });
  if (answer) {
    $("bad-host-machine").value = "";
    $("bad-host-reason").value = "";
  }
}

// --- charts ----------------------------------------------------------------------------

function axisNumber(v) {
  if (v === 0) return "0";
  if (v >= 100) return v.toFixed(0);
  if (v >= 10) return v.toFixed(1);
  if (v >= 1) return v.toFixed(2);
  return v.toPrecision(2);
}

// A line chart in an SVG: series = [{name, cls, dashed, points: [[t, v], ...]}].
// data-points on the SVG counts the points drawn (tests wait on it).
function lineChart(node, series, opts) {
  const W = 640, H = 220, L = 48, R = 110, T = 10, B = 26;
  const all = series.flatMap((s) => s.points);
  node.replaceChildren();
  node.dataset.points = String(all.length);
  node.dataset.series = String(series.length);
  if (all.length === 0) {
    const text = svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "chart-empty" });
    text.textContent = "no telemetry yet";
    node.append(text);
    return;
  }
  const dataMax = Math.max(...all.map((p) => p[1]));
  node.dataset.max = String(dataMax);
  const t0 = Math.min(...all.map((p) => p[0]));
  const t1 = Math.max(...all.map((p) => p[0]));
  const vmax = opts.max !== undefined ? opts.max : dataMax * 1.1 || 1;
  const x = (t) => L + ((t - t0) / (t1 - t0 || 1)) * (W - L - R);
  const y = (v) => T + (1 - Math.min(v, vmax) / vmax) * (H - T - B);
  for (let i = 0; i <= 4; i += 1) {
    const v = (vmax * i) / 4;
    node.append(svg("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), class: "grid" }));
    const label = svg("text", { x: L - 6, y: y(v) + 4, "text-anchor": "end", class: "axis" });
    label.textContent = axisNumber(v);
    node.append(label);
  }
  for (const [t, anchor] of [[t0, "start"], [t1, "end"]]) {
    const label = svg("text", { x: x(t), y: H - 6, "text-anchor": anchor, class: "axis" });
    label.textContent = clock(t);
    node.append(label);
  }
  series.forEach((s, i) => {
    const pts = s.points.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" ");
    const line = svg("polyline", {
      points: pts,
      class: `series ${s.cls}${s.dashed ? " dashed" : ""}`,
      "data-name": s.name,
    });
    node.append(line);
    if (s.points.length === 1) {
      node.append(svg("circle", { cx: x(s.points[0][0]), cy: y(s.points[0][1]), r: 3,
        class: `dot ${s.cls}` }));
    }
    const key = svg("text", { x: W - R + 8, y: T + 12 + i * 16, class: `legend ${s.cls}` });
    key.textContent = safeText(s.name);
    node.append(key);
  });
}

function gpuSeries(points, field, scale, label, extra) {
  const byGpu = new Map();
  for (const p of points) {
    const gpus = (p.telemetry && p.telemetry.gpus) || [];
    for (const g of gpus) {
      const v = g[field];
      if (v === null || v === undefined) continue;
      if (!byGpu.has(g.index)) byGpu.set(g.index, []);
      byGpu.get(g.index).push([p.t, v * scale]);
    }
  }
  return [...byGpu.entries()]
    .sort((a, b) => a[0] - b[0])
    .map(([index, pts]) => ({ name: `GPU ${index}${label}`, cls: `s${index % 8}`, points: pts,
      ...(extra || {}) }));
}

// --- instance --------------------------------------------------------------------------

function facts(dl, pairs) {
  dl.replaceChildren(...pairs.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
}

const THROTTLE = [[0x1, "idle"], [0x2, "app clocks"], [0x4, "SW power cap"],
  [0x8, "HW slowdown"], [0x20, "SW thermal"], [0x40, "HW thermal"]];

function throttleText(mask) {
  if (!mask) return "none";
  return THROTTLE.filter(([bit]) => mask & bit).map(([, name]) => name).join(", ") ||
    "0x" + mask.toString(16);
}

let instanceWired = null;

async function renderInstance(id) {
  const source = $("log-source").value;
  const results = state.results;
  if (results.id !== id) Object.assign(results, { id, cursors: [null], next: null });
  const before = results.cursors[results.cursors.length - 1];
  const [inst, history, logs] = await Promise.all([
    api("GET", `/api/instances/${id}?results_limit=${RESULTS_PAGE}` +
      (before === null ? "" : `&results_before=${before}`)),
    api("GET", `/api/instances/${id}/telemetry-history?points=300`),
    api("GET", `/api/instances/${id}/logs?tail=200` +
      (source ? "&source=" + encodeURIComponent(source) : "")),
  ]);
  show("instance-view");
  $("instance-title").textContent =
    safeText(`Instance ${inst.id}` + (inst.label ? ` — ${inst.label}` : ""));
  facts($("instance-facts"), [
    ["state", inst.state || "-"],
    ["phase", `${inst.phase || "-"} ${progressText(inst.progress)}`.trim()],
    ["machine", String(inst.machine_id ?? "-")],
    ["GPUs", `${inst.num_gpus || "?"} x ${inst.gpu_name || "?"}`],
    ["place", inst.geolocation || "-"],
    ["price", usd(inst.dph_total, 3) + " / h"],
    ["vast.ai", inst.provider === "local"
      ? `local instance ${inst.provider_instance_id ?? "-"} (simulated, not vast.ai's)`
      : inst.provider_instance_id === null || inst.provider_instance_id === undefined ? "-"
        : `${inst.provider === "fake" ? "fake " : ""}instance ${inst.provider_instance_id}: ` +
          `${inst.provider_status || "?"}` +
          (inst.provider_status_msg ? ` (${inst.provider_status_msg})` : "") +
          `, billing ${usd(inst.billing_now_per_hour, 3)} / h now` +
          (inst.provider === "fake" ? " (simulated dollars)" : "")],
    ["benchmark rate", (silent(inst) ? "none now (" + (inst.idle ? "idle" : "lost") + ")"
      : num(inst.rate_per_hour) + " / h") + " (min " + num(inst.min_rate_per_hour) + ")" +
      (SIMULATED_PROVIDERS[inst.provider] ? " — simulated" : "")],
    ["completed", inst.idle ? `IDLE: ${inst.idle_reason || ""}`
      : inst.state === "proving" ? (inst.completed_rate_per_hour === null
        ? "measuring (cuzk's finished proofs)" : num(inst.completed_rate_per_hour) +
          " / h (cuzk's finished proofs, last hour)") : "-"],
    ["delivered", inst.delivered_source === "cluster"
      ? `${num(inst.delivered_rate_per_hour)} / h as the cluster records it (` +
        `${inst.tasks_completed} proofs, ${inst.tasks_failed} failed)`
      : (inst.cluster_status || "-")],
    ["last failed task", inst.last_task_error || "-"],
    ["flags", Object.entries(inst.cluster_flags || {}).map(([k, v]) => `${k}: ${v}`)
      .join("; ") || "-"],
    ["revenue / profit per hour", inst.revenue_per_hour === null ||
      inst.revenue_per_hour === undefined ? "-" : `${usd(inst.revenue_per_hour, 3)} / ` +
      `${usd(inst.profit_per_hour, 3)} (at its ${inst.revenue_basis} rate)`],
    ["$ / proof", silent(inst) ? "-" : usd(inst.usd_per_proof)],
    ["cost / hour", costText(inst.cost && inst.cost.per_hour)],
    ["cost / proof", costText(inst.cost && inst.cost.per_proof)],
    ["billed so far", costText(inst.cost && inst.cost.billed)],
    ["proofs", String(inst.proofs_completed_total ?? 0)],
    ["last seen", ago(inst.last_seen)],
    ["agent", `${inst.agent_id || "-"} (${inst.agent_version || "?"})`],
    ["terminate reason", inst.terminate_reason || "-"],
  ]);
  if (instanceWired !== id) {
    instanceWired = id;
    const rebench = $("instance-rebenchmark");
    const destroy = $("instance-destroy");
    const freshRebench = rebench.cloneNode(true);
    const freshDestroy = destroy.cloneNode(true);
    rebench.replaceWith(freshRebench);
    destroy.replaceWith(freshDestroy);
    confirmClick(freshRebench, "Confirm re-benchmark",
      () => act("POST", `/api/instances/${id}/rebenchmark`));
    confirmClick(freshDestroy, "Confirm destroy",
      () => act("POST", `/api/instances/${id}/destroy`));
  }
  // As the operator API refuses: a gone instance has nothing to destroy, an ending one
  // (terminating, failed, gone) does not benchmark again.
  $("instance-destroy").disabled = STATE_SETS.GONE.has(inst.state);
  $("instance-rebenchmark").disabled = STATE_SETS.ENDING.has(inst.state);

  const points = history.points || [];
  lineChart($("chart-util"), gpuSeries(points, "util_pct_mean", 1, ""), { max: 100 });
  lineChart($("chart-pcie"), [
    ...gpuSeries(points, "pcie_tx_kbps_mean", 1e-6, " TX"),
    ...gpuSeries(points, "pcie_rx_kbps_mean", 1e-6, " RX", { dashed: true }),
  ], {});
  lineChart($("chart-power"), gpuSeries(points, "power_w_mean", 1, ""), {});

  const tele = inst.telemetry || {};
  const hostGpus = new Map(((inst.host && inst.host.gpus) || []).map((g) => [g.index, g]));
  fill(
    $("gpu-table").tBodies[0],
    (tele.gpus || []).map((g) => {
      const h = hostGpus.get(g.index) || {};
      const gen = g.pcie_gen_current || h.pcie_gen_current;
      const width = g.pcie_width_current || h.pcie_width_current;
      return el("tr", {},
        td(String(g.index)), td(h.name || "-"),
        td(`${num(g.util_pct_mean, 0)} / ${num(g.util_pct_max, 0)}`),
        td(`${num(g.pcie_tx_kbps_mean / 1e6, 2)} / ${num(g.pcie_rx_kbps_mean / 1e6, 2)}`),
        td(gen && width ? `Gen${gen} x${width}` : "-"),
        td(num(g.power_w_mean, 0, " W")), td(num(g.temp_c_max, 0, " °C")),
        td(num(g.sm_clock_mhz_mean, 0, " MHz")), td(gb(g.mem_used_bytes)),
        td(throttleText(g.throttle_reasons)));
    }),
  );

  const cuzk = tele.cuzk;
  if (cuzk) {
    facts($("cuzk-facts"), [
      ["workers", String((cuzk.workers || []).length)],
      ["synthesis active", `${num(cuzk.synthesis_active_mean)} (max ${cuzk.synthesis_max ?? "-"})`],
      ["queue depth", num(cuzk.queue_depth_mean)],
      ["memory", `${gb(cuzk.memory_used_bytes_max)} of ${gb(cuzk.memory_total_bytes)}`],
      ["samples", String(cuzk.samples)],
    ]);
    $("cuzk-workers").replaceChildren(
      ...(cuzk.workers || []).map((w) =>
        el("div", { class: "worker" },
          el("span", {}, `GPU ${w.gpu_ordinal}`), " ",
          el("meter", { min: 0, max: 100, value: w.busy_pct ?? 0 }), " ",
          el("span", { class: "muted" }, num(w.busy_pct, 0, "% busy")))),
    );
  } else {
    facts($("cuzk-facts"), [["status", "no cuzk status in the latest telemetry"]]);
    $("cuzk-workers").replaceChildren();
  }
  const cpu = tele.cpu || {};
  const ram = tele.ram || {};
  const host = inst.host || {};
  facts($("host-facts"), [
    ["hostname", host.hostname || "-"],
    ["CPU", `${host.cpu_model || "-"} (${host.cpu_cores_logical ?? "?"} threads)`],
    ["CPU busy", num(cpu.util_pct_mean, 0, " %") + ", load1 " + num(cpu.load1)],
    ["RAM", `${gb(ram.used_bytes)} of ${gb(ram.total_bytes)}`],
    ["driver / CUDA", `${host.driver_version || "-"} / ${host.cuda_version || "-"}`],
    ["telemetry", inst.telemetry_at ? ago(inst.telemetry_at) : "-"],
  ]);

  fill(
    $("results-table").tBodies[0],
    (inst.results || []).slice().reverse().map((r) =>
      el("tr", {},
        td(r.kind || "-"), td((r.gpus_used || []).join(",")), td(String(r.proofs_completed ?? "-")),
        td(num(r.wall_seconds, 0)), td(num(r.recomputed_rate_per_hour ?? r.rate_per_hour)),
        td((r.flags || []).join(", ") || "-"),
        td((r.flag_reasons || []).join("; ") || "-"), td(r.verdict || "-"),
        td(r.verdict_reason || "-"))),
  );
  results.next = inst.results_next ?? null;
  const shown = (inst.results || []).length;
  const first = (results.cursors.length - 1) * RESULTS_PAGE;
  $("results-range").textContent = shown
    ? `${first + 1}–${first + shown} of ${inst.results_total ?? shown}, newest first` : "";
  $("results-newer").disabled = results.cursors.length === 1;
  $("results-older").disabled = results.next === null;
  renderEvents($("instance-events"), (inst.events || []).slice(-50).reverse());

  const pre = $("logs");
  const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
  pre.textContent = logs.map((l) => safeText(`${clock(l.ts)} ${l.source}: ${l.text}`))
    .join("\n");
  if (atBottom) pre.scrollTop = pre.scrollHeight;
}

// --- wiring ----------------------------------------------------------------------------

document.addEventListener("DOMContentLoaded", () => {
  $("login-form").addEventListener("submit", login);
  $("logout").addEventListener("click", logout);
  $("bad-host-form").addEventListener("submit", addBadHost);
  $("offer-filter-form").addEventListener("submit", (event) => {
    event.preventDefault();
    state.offerFilter = $("offer-filter").value.trim();
    state.offersAt = 0;
    refresh();
  });
  $("log-source").addEventListener("change", () => refresh());
  $("fleet-state").addEventListener("change", () => {
    state.fleet.filter = $("fleet-state").value;
    state.fleet.cursors = [null];
    refresh();
  });
  $("fleet-next").addEventListener("click", () => {
    if (state.fleet.next === null) return;
    state.fleet.cursors.push(state.fleet.next);
    refresh();
  });
  $("results-older").addEventListener("click", () => {
    if (state.results.next === null) return;
    state.results.cursors.push(state.results.next);
    refresh();
  });
  $("results-newer").addEventListener("click", () => {
    if (state.results.cursors.length > 1) state.results.cursors.pop();
    refresh();
  });
  $("fleet-prev").addEventListener("click", () => {
    if (state.fleet.cursors.length > 1) state.fleet.cursors.pop();
    refresh();
  });
  confirmClick($("autopilot-stop"), "Confirm stop", () => act("POST", "/api/autopilot/stop",
    { reason: "stopped from the dashboard" }));
  confirmClick($("autopilot-start"), "Confirm start", () => act("POST", "/api/autopilot/start"));
  window.addEventListener("hashchange", () => {
    $("flash").hidden = true;
    state.offersAt = 0;
    state.planAt = 0;
    refresh();
  });
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden) refresh();
  });
  resume();
});
