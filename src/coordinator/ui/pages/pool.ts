/**
 * A pool: its settings, its provisioning breakers (the pool's and each
 * placement's, with their cause; docs/aws.md), its machines by state
 * (generation, incarnation, age, time in state, borrower, hard expiry), a
 * drain action per machine and for the pool, and the borrow latency and ready-queue age charts from the
 * coordinator's own histograms (this process's, per pool; the same buckets
 * as the exported `berth_borrow_latency_seconds` and
 * `berth_ready_queue_age_seconds`).
 */
import { BerthError } from "../../../core/errors.js";
import { MACHINE_STATES } from "../../../core/machine.js";
import type { PoolRecord } from "../../../core/pool.js";
import type { Principal } from "../../auth.js";
import { allows } from "../../auth.js";
import type { Store } from "../../../store/store.js";
import type { HistogramFigures, Metrics } from "../../metrics.js";
import { readPool } from "../../../store/pools.js";
import { readBreaker, type Breaker } from "../../../store/provision-breaker.js";
import { readPlacementBreakers, type PlacementBreaker } from "../../../store/placement-breakers.js";
import { countMachinesByState, listLiveMachinesOfPool, type MachineRow } from "../../../store/machines.js";
import { html, jsonScript, type Html } from "../html.js";
import { loadHistory, renderHistory, type HistoryData, type Window } from "./history.js";
import { action, actionForm, bar, iso, lentTo, since, stateClass, type View } from "../layout.js";

export interface PoolData {
  pool: PoolRecord;
  machines: MachineRow[];
  destroyed: number;
  latency: HistogramFigures;
  readyAge: HistogramFigures;
  history: HistoryData;
  /** The pool's provisioning breaker and its placements' (null / empty: no failure since the last success). */
  breaker: Breaker | null;
  placements: PlacementBreaker[];
}

export async function loadPool(store: Store, metrics: Metrics, p: Principal, name: string, window: Window, now: number): Promise<PoolData> {
  return store.transaction(async (tx) => {
    const pool = await readPool(tx, p.org, name);
    if (!pool) throw new BerthError("not_found", `not_found: no pool named ${name} in this organisation`);
    const machines = await listLiveMachinesOfPool(tx, p.org, name);
    const destroyed = (await countMachinesByState(tx, p.org, name)).find((r) => r.state === "destroyed")?.n ?? 0;
    const history = await loadHistory(tx, metrics, p, name, window, now);
    const breaker = await readBreaker(tx, p.org, name);
    const placements = await readPlacementBreakers(tx, p.org, name);
    return { pool, machines, destroyed, latency: metrics.poolLatency.figures(p.org, name), readyAge: metrics.poolReadyAge.figures(p.org, name), history, breaker, placements };
  }, { name: "ui_pool" });
}

function seconds(s: number): string {
  if (s < 1) return `${+(s * 1000).toPrecision(3)} ms`;
  if (s < 60) return `${+s.toPrecision(3)} s`;
  if (s < 3600) return `${+(s / 60).toPrecision(3)} min`;
  return `${+(s / 3600).toPrecision(3)} h`;
}

/** The bucket bound below which a share `q` of observations fall (an upper estimate, as Prometheus buckets allow). */
function quantile(h: HistogramFigures, q: number): string {
  if (h.count === 0) return "—";
  let seen = 0;
  for (let i = 0; i < h.counts.length; i++) {
    seen += h.counts[i]!;
    if (seen >= q * h.count) return i < h.bounds.length ? `≤ ${seconds(h.bounds[i]!)}` : `> ${seconds(h.bounds[h.bounds.length - 1]!)}`;
  }
  return "—";
}

function chart(id: string, title: string, h: HistogramFigures): Html {
  const short = (b: number) => seconds(b).replace(" ", "");
  const labels = [...h.bounds.map(short), `>${short(h.bounds[h.bounds.length - 1]!)}`];
  return html`<figure class="chart" aria-labelledby="${id}-t"><figcaption id="${id}-t"><b>${title}</b>: ${h.count} borrows${h.count ? html`, p50 ${quantile(h, 0.5)}, p99 ${quantile(h, 0.99)}, mean ${seconds(h.sum / h.count)}` : ""}</figcaption>
<div id="${id}" class="plot"></div><script type="application/json" data-chart="${id}">${jsonScript({ labels, counts: h.counts, xLabel: "bucket (at most; the last is above every bound)" })}</script>
<details><summary>Figures</summary><table><thead><tr><th>Bucket (at most)</th><th class="num">Borrows</th></tr></thead><tbody>${labels.map((l, i) => html`<tr><td>${l}</td><td class="num">${h.counts[i]}</td></tr>`)}</tbody></table></details></figure>`;
}

/** The provisioning breakers: the pool's (launching paused) and each placement's (that placement backed off). */
function breakers(v: View, d: PoolData): Html {
  const rows = [...(d.breaker ? [{ what: "the pool", b: d.breaker }] : []), ...d.placements.map((b) => ({ what: b.placement, b }))];
  if (rows.length === 0) return html``;
  const status = (b: Breaker) => (b.openUntil !== null && b.openUntil > v.now ? `backed off until ${iso(b.openUntil)} (trip ${b.trips})` : `${b.failures} failed in a row`);
  return html`<h2 id="provisioning">Provisioning breakers</h2><table aria-labelledby="provisioning" data-group="breakers"><thead><tr><th>Where</th><th>Status</th><th>Cause</th></tr></thead>
<tbody>${rows.map((r) => html`<tr data-breaker="${r.what}" data-open="${r.b.openUntil !== null && r.b.openUntil > v.now ? "yes" : "no"}"><td>${r.what}</td><td>${status(r.b)}</td><td>${r.b.cause ?? ""}</td></tr>`)}</tbody></table>
${allows(v.principal, "operator") ? html`<p class="muted">After fixing the cause: <code>berth pool resume ${d.pool.name}</code> closes them all.</p>` : ""}`;
}

function machineRow(v: View, m: MachineRow): Html {
  const canDrain = allows(v.principal, "operator") && ["ready", "busy", "reserved", "installing", "provisioning", "quarantined"].includes(m.state);
  return html`<tr data-machine="${m.id}" data-state="${m.state}"><td><a href="/ui/machines/${m.id}">${m.id}</a></td><td class="state">${m.state}</td><td class="num">${m.generation}</td><td><code>${m.incarnation ?? "—"}</code></td>
<td>${since(v.now, m.created_at)}</td><td>${since(v.now, m.state_since)}</td><td>${lentTo(m.lent_to)}</td><td>${iso(m.hard_expires_at)}</td><td>${m.reason ?? ""}</td>
<td>${canDrain ? action({ action: `/ui/machines/${m.id}/drain`, label: "Drain", confirm: `Drain ${m.id}?${m.state === "ready" ? "" : " Its borrower loses access."} It is destroyed.` }) : ""}</td></tr>`;
}

export function renderPool(v: View, d: PoolData): Html {
  const { pool } = d;
  const byState = new Map<string, MachineRow[]>();
  for (const m of d.machines) {
    let list = byState.get(m.state);
    if (!list) byState.set(m.state, (list = []));
    list.push(m);
  }
  const count = (cls: string) => d.machines.filter((m) => stateClass(m.state) === cls).length;
  return html`<p>${pool.access} pool, provider ${pool.provider}, compatibility key <code>${pool.compatibilityKey}</code>${pool.identity ? html`, image <code>${pool.identity.imageId}</code>` : ""}.</p>
<p>${bar(
    [
      { label: "ready", n: count("ready"), cls: "ready" },
      { label: "lent", n: count("lent"), cls: "lent" },
      { label: "cleanup", n: count("cleanup"), cls: "cleanup" },
    ],
    pool.maxReady,
    { min: pool.minReady, label: `pool ${pool.name}`, text: `ready ${count("ready")} · lent ${count("lent")} · cleanup ${count("cleanup")} (min ${pool.minReady}, max ${pool.maxReady})` },
  )}</p>
${allows(v.principal, "operator") && pool.maxReady > 0 ? html`<div class="actions">${actionForm(v, {
    action: `/ui/pools/${pool.name}/drain`,
    label: "Drain pool",
    confirm: `Drain pool ${pool.name}? Its capacity drops to zero and its ready machines are destroyed; live borrows run to their end.`,
    confirmChecked: `Drain pool ${pool.name} and end its borrows? Its capacity drops to zero, its ready machines are destroyed, and its live borrows are ended now (their borrowers lose access at once).`,
    extra: html`<label><input type="checkbox" name="force" value="true"> also end live borrows now</label> `,
  })}</div>` : ""}
${breakers(v, d)}
${renderHistory(d.history, `/ui/pools/${pool.name}`)}
<h2 id="charts">Latency since this coordinator started</h2><div class="charts">${chart("chart-latency", "Borrow latency", d.latency)}${chart("chart-ready-age", "Ready-queue age", d.readyAge)}</div>
<h2 id="machines">Machines (${d.machines.length} live, ${d.destroyed} destroyed kept for retention)</h2>
${MACHINE_STATES.filter((s) => byState.has(s)).map(
    (s) => html`<h3 id="state-${s}">${s} (${byState.get(s)!.length})</h3><table aria-labelledby="state-${s}" data-group="${s}"><thead><tr><th>Machine</th><th>State</th><th class="num">Generation</th><th>Incarnation</th><th>Age</th><th>In state</th><th>Lent to</th><th>Hard expiry</th><th>Reason</th><th>Action</th></tr></thead>
<tbody>${byState.get(s)!.map((m) => machineRow(v, m))}</tbody></table>`,
  )}
${d.machines.length === 0 ? html`<p class="muted">No live machine.</p>` : ""}`;
}
