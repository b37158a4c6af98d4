/**
 * The audit view (operators): the organisation's audit trail, newest first,
 * filtered by event and by machine or host id, 50 entries a page (older
 * pages by sequence number), each machine linking to its timeline.
 */
import type { Principal } from "../../auth.js";
import { requireRole } from "../../auth.js";
import type { Store } from "../../../store/store.js";
import { orgAuditEvents, orgTrail, type OrgAuditEntry } from "../../../store/audit.js";
import { html, type Html } from "../html.js";
import { iso, type View } from "../layout.js";
import { subject } from "./machine.js";

export const AUDIT_PAGE = 50;

export interface AuditFilter {
  event: string;
  record: string;
  before: number | undefined;
}

export interface AuditData {
  filter: AuditFilter;
  events: string[];
  entries: OrgAuditEntry[];
  more: boolean;
}

export function auditFilterOf(q: URLSearchParams): AuditFilter {
  const before = Number(q.get("before"));
  return { event: (q.get("event") ?? "").slice(0, 100), record: (q.get("record") ?? "").trim().slice(0, 200), before: Number.isSafeInteger(before) && before > 0 ? before : undefined };
}

export async function loadAudit(store: Store, p: Principal, f: AuditFilter): Promise<AuditData> {
  requireRole(p, "operator");
  return store.transaction(async (tx) => {
    const entries = await orgTrail(tx, p.org, { ...(f.event ? { event: f.event } : {}), ...(f.record ? { record: f.record } : {}), ...(f.before !== undefined ? { before: f.before } : {}), limit: AUDIT_PAGE + 1 });
    return { filter: f, events: await orgAuditEvents(tx, p.org), entries: entries.slice(0, AUDIT_PAGE), more: entries.length > AUDIT_PAGE };
  }, { name: "ui_audit" });
}

function link(f: AuditFilter, before?: number): string {
  const q = new URLSearchParams();
  if (f.event) q.set("event", f.event);
  if (f.record) q.set("record", f.record);
  if (before !== undefined) q.set("before", String(before));
  const s = q.toString();
  return s ? `/ui/audit?${s}` : "/ui/audit";
}

function record(e: OrgAuditEntry): Html {
  if (e.isMachine) return html`<a href="/ui/machines/${e.machineId}">${e.machineId}</a>`;
  return e.hostName !== null ? html`host ${e.hostName} <code>${e.machineId}</code>` : html`<code>${e.machineId}</code>`;
}

export function renderAudit(_v: View, d: AuditData): Html {
  const f = d.filter;
  return html`<form method="get" action="/ui/audit" class="filters"><label>Event <select name="event"><option value="">any</option>${d.events.map((e) => html`<option${e === f.event ? html` selected` : ""}>${e}</option>`)}</select></label>
<label>Machine or host id <input name="record" value="${f.record}" size="24"></label> <button type="submit">Filter</button>${f.event || f.record ? html` <a href="/ui/audit">Clear</a>` : ""}</form>
<h2 id="entries">Entries${f.before !== undefined ? ` older than #${f.before}` : ", newest first"} (${d.entries.length}${d.more ? ", more below" : ""})</h2>
${d.entries.length === 0 ? html`<p class="muted">No entry${f.event || f.record ? " matches" : ""}.</p>` : html`<table aria-labelledby="entries"><thead><tr><th class="num">#</th><th>When</th><th>Event</th><th>Machine or host</th><th>From</th><th>To</th><th>Subject</th><th>Coordinator</th><th>Why</th></tr></thead>
<tbody>${d.entries.map((e) => html`<tr data-seq="${e.seq}" data-event="${e.event}"><td class="num">${e.seq}</td><td>${iso(e.at)}</td><td>${e.event}</td><td>${record(e)}</td><td class="state">${e.from ?? "—"}</td><td class="state">${e.to}</td><td>${subject(e.subject)}</td><td><code>${e.actor}</code></td><td>${e.detail ?? ""}</td></tr>`)}</tbody></table>`}
<p class="pages">${f.before !== undefined ? html`<a href="${link(f)}">Newest</a>` : ""}${d.more ? html` <a rel="next" href="${link(f, d.entries[d.entries.length - 1]!.seq)}">Older →</a>` : ""}</p>`;
}
