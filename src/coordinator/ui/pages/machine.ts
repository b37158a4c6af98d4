/** A machine: its record and its timeline from the audit trail (newest first). */
import { BerthError } from "../../../core/errors.js";
import type { Principal } from "../../auth.js";
import { allows } from "../../auth.js";
import type { Store } from "../../../store/store.js";
import { readMachine, type MachineRow } from "../../../store/machines.js";
import { machineTrail, type AuditEntry } from "../../../store/audit.js";
import { html, type Html } from "../html.js";
import { action, ago, iso, lentTo, since, type View } from "../layout.js";
import { readHost } from "../../../store/hosts.js";

/** A trail entry's subject: a borrow or grant id links to the Borrows page. */
export function subject(s: string | null): Html {
  return s === null ? html`` : /^[bg]_[a-z0-9]+$/.test(s) ? lentTo(s) : html`${s}`;
}

export const TRAIL_LIMIT = 500;

export interface MachineData {
  machine: MachineRow;
  /** The host's name (host-run machines). */
  hostName: string | null;
  trail: Array<AuditEntry & { seq: number }>;
}

export async function loadMachine(store: Store, p: Principal, id: string): Promise<MachineData> {
  return store.transaction(async (tx) => {
    const machine = await readMachine(tx, id);
    if (!machine || machine.org !== p.org) throw new BerthError("not_found", `not_found: no machine ${id} in this organisation`);
    const host = machine.host_id ? await readHost(tx, machine.host_id) : undefined;
    return { machine, hostName: host?.name ?? null, trail: await machineTrail(tx, id, TRAIL_LIMIT) };
  }, { name: "ui_machine" });
}

export function renderMachine(v: View, d: MachineData): Html {
  const m = d.machine;
  const canDrain = allows(v.principal, "operator") && ["ready", "busy", "reserved", "installing", "provisioning", "quarantined"].includes(m.state);
  return html`<table class="facts"><tbody>
<tr><th>Pool</th><td><a href="/ui/pools/${m.pool}">${m.pool}</a> (${m.access})</td></tr>
<tr><th>State</th><td class="state" data-state="${m.state}">${m.state}${m.reason ? ` — ${m.reason}` : ""} (for ${since(v.now, m.state_since)})</td></tr>
<tr><th>Generation</th><td>${m.generation}</td></tr><tr><th>Incarnation</th><td><code>${m.incarnation ?? "—"}</code></td></tr>
<tr><th>Provider</th><td>${m.provider}, resource <code>${m.resource_id}</code>${m.host_id ? html`, host ${d.hostName !== null ? html`<a href="/ui#host-${d.hostName}">${d.hostName}</a> ` : ""}<code class="muted">${m.host_id}</code>` : ""}</td></tr>
<tr><th>Created</th><td>${iso(m.created_at)} (${ago(v.now, m.created_at)} ago)</td></tr><tr><th>Hard expiry</th><td>${iso(m.hard_expires_at)}</td></tr>
<tr><th>Lent to</th><td>${lentTo(m.lent_to)}</td></tr></tbody></table>
${canDrain ? html`<div class="actions">${action({ action: `/ui/machines/${m.id}/drain`, label: "Drain machine", confirm: `Drain machine ${m.id}? It will be destroyed.` })}</div>` : ""}
<h2 id="timeline">Timeline (${d.trail.length}${d.trail.length === TRAIL_LIMIT ? `, the latest ${TRAIL_LIMIT}` : ""})</h2>
<table aria-labelledby="timeline"><thead><tr><th>When</th><th>Event</th><th>From</th><th>To</th><th class="num">Generation</th><th>Subject</th><th>Coordinator</th><th>Why</th></tr></thead>
<tbody>${d.trail.map((e) => html`<tr><td>${iso(e.at)}</td><td>${e.event}</td><td class="state">${e.from ?? "—"}</td><td class="state">${e.to}</td><td class="num">${e.generation}</td><td>${subject(e.subject)}</td><td><code>${e.actor}</code></td><td>${e.detail ?? ""}</td></tr>`)}</tbody></table>`;
}
