/**
 * Allocations and owners' budgets: a member sees its own allocations, an
 * operator the organisation's and every owner's budget (as the API's
 * `GET /v1/allocations` and `GET /v1/owners`). Release is offered to whoever
 * the API lets release; a failed allocation shows why and offers Restart.
 * Operators also see the organisation's allocation use over time, per host
 * and per owner (allocations and vCPU in use; history.ts).
 */
import type { Principal } from "../../auth.js";
import { allows } from "../../auth.js";
import type { AllocCtx } from "../../actions/allocation-context.js";
import { listAllocationsFor } from "../../actions/allocation-read.js";
import { ownersOf } from "../../actions/allocation-owners.js";
import type { AllocationRecord } from "../../../store/allocations.js";
import type { OwnerRecord } from "../../../store/allocation-owners.js";
import { html, type Html } from "../html.js";
import { action, capacity, gib, deadline, since, tokenName, type View } from "../layout.js";
import { listApiTokensOfOrg } from "../../../store/api-tokens.js";
import type { Metrics } from "../../metrics.js";
import type { SeriesRow } from "../../../store/history-series.js";
import { axisOf, loadSeries, renderLabelled, WINDOWS, type Window } from "./history.js";

export interface AllocationsData {
  allocations: AllocationRecord[];
  owners: OwnerRecord[] | null;
  /** Token id → label, for owners. */
  labels: Map<string, string | null>;
  /** Allocation use over the window, per host and per owner (operators only). */
  use: { window: Window; axis: { step: number; from: number; to: number }; rows: SeriesRow[] } | null;
}

export async function loadAllocations(ctx: AllocCtx, p: Principal, h: { metrics: Metrics; window: Window; now: number }): Promise<AllocationsData> {
  const operator = allows(p, "operator");
  // Live allocations only (as `GET /v1/allocations` without `all`); an operator's cover every owner.
  const allocations = await listAllocationsFor(ctx, { org: p.org, principal: p.tokenId, operator }, false);
  const axis = axisOf(h.window, h.now);
  const use = operator ? { window: h.window, axis, rows: await ctx.store.transaction((tx) => loadSeries(tx, h.metrics, p.org, "", ["host_allocations", "host_vcpu", "owner_allocations", "owner_vcpu"], axis), { name: "ui_allocation_use" }) } : null;
  return { allocations, owners: operator ? await ownersOf(ctx, p.org) : null, labels: new Map((await listApiTokensOfOrg(ctx.store, p.org)).map((t) => [t.id, t.label])), use };
}

function renderUse(d: AllocationsData): Html {
  if (!d.use) return html``;
  const owner = (id: string) => (d.labels.get(id) ? `${d.labels.get(id)} (${id})` : id);
  const win = (w: string) => html`<a href="/ui/allocations?window=${w}#use"${w === d.use!.window ? html` aria-current="true"` : ""}>${w}</a>`;
  return html`<h2 id="use">Use over time</h2>
<p class="windows">Window: ${Object.keys(WINDOWS).map((w, i) => html`${i ? " · " : ""}${win(w)}`)} <span class="muted">(${d.use.axis.step / 1000}-second buckets; kept 24 h)</span></p>
${renderLabelled(d.use.axis, d.use.rows, [
    { id: "use-host-allocations", caption: "Allocations per host", y: "allocations", series: "host_allocations", none: "No allocation on any host in this window." },
    { id: "use-host-vcpu", caption: "vCPU in use per host", y: "vCPU", series: "host_vcpu", none: "No vCPU in use in this window." },
    { id: "use-owner-allocations", caption: "Allocations per owner", y: "allocations", series: "owner_allocations", name: owner, none: "No owner had an allocation in this window." },
    { id: "use-owner-vcpu", caption: "vCPU in use per owner", y: "vCPU", series: "owner_vcpu", name: owner, none: "No owner used vCPU in this window." },
  ], "use")}`;
}

function row(v: View, a: AllocationRecord, labels: Map<string, string | null>): Html {
  const mayRelease = (a.owner === v.principal.tokenId || allows(v.principal, "operator")) && a.state !== "released" && a.state !== "releasing";
  return html`<tr data-allocation="${a.id}"><td>${a.id}</td><td class="state">${a.state}${a.state === "failed" || a.state === "quarantined" ? html`<br><span class="muted reason">${a.reason ?? ""}</span>` : ""}</td><td>${tokenName(a.owner, labels)}</td><td>${a.size} (${a.vcpu} vCPU, ${gib(a.memoryMib)} GiB)</td><td>${a.plan.hostName}</td>
<td>${since(v.now, a.createdAt)}</td><td>${deadline(v.now, a.expiresAt)}</td><td>${mayRelease && a.state === "failed" ? action({ action: `/ui/allocations/${a.id}/restart`, label: "Restart", confirm: `Restart allocation ${a.id}? Its sandbox starts again on the same volume.` }) : ""}${mayRelease ? action({ action: `/ui/allocations/${a.id}/release`, label: "Release", confirm: `Release allocation ${a.id}? Its workspace is torn down.` }) : ""}</td></tr>`;
}

export function renderAllocations(v: View, d: AllocationsData): Html {
  return html`<h2 id="allocs">Allocations (${d.allocations.length})</h2>
${d.allocations.length === 0 ? html`<p class="muted">No live allocation.</p>` : html`<table aria-labelledby="allocs"><thead><tr><th>Allocation</th><th>State</th><th>Owner</th><th>Size</th><th>Host</th><th>Age</th><th>Expires</th><th>Action</th></tr></thead>
<tbody>${d.allocations.map((a) => row(v, a, d.labels))}</tbody></table>`}
${d.owners === null ? html`<p class="muted">Owners' budgets are shown to operators.</p>` : html`<h2 id="owners">Owners' budgets (${d.owners.length})</h2>
${d.owners.length === 0 ? html`<p class="muted">No owner admitted.</p>` : html`<table aria-labelledby="owners"><thead><tr><th>Owner</th><th>vCPU</th><th>Memory</th><th>Allocations</th></tr></thead>
<tbody>${d.owners.map(
    (o) => html`<tr data-owner="${o.owner}"><td>${tokenName(o.owner, d.labels)}</td><td>${capacity("vCPU", o.used.vcpu, o.budget.vcpu)}</td><td>${capacity("memory", gib(o.used.memoryMib), gib(o.budget.memoryMib), " GiB")}</td><td>${capacity("allocations", o.used.count, o.budget.count)}</td></tr>`,
  )}</tbody></table>`}`}
${renderUse(d)}`;
}
