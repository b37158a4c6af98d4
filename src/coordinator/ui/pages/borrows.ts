/**
 * Borrows and grants of the organisation: keeper borrows that are active and
 * portable grants not yet closed, each with its hard deadline counting down
 * (fixed at issue: nothing extends it) and, for an operator, "end borrow".
 */
import type { Principal } from "../../auth.js";
import { allows } from "../../auth.js";
import type { Store } from "../../../store/store.js";
import { listActiveBorrows, type BorrowRow } from "../../../store/borrows.js";
import { listOpenGrants, type GrantRow } from "../../../store/grants.js";
import { html, type Html } from "../html.js";
import { action, deadline, since, tokenName, type View } from "../layout.js";
import { listApiTokensOfOrg } from "../../../store/api-tokens.js";

export interface BorrowsData {
  borrows: BorrowRow[];
  grants: GrantRow[];
  /** Token id → label, for borrowers. */
  labels: Map<string, string | null>;
}

export async function loadBorrows(store: Store, p: Principal): Promise<BorrowsData> {
  const d = await store.transaction(async (tx) => ({ borrows: await listActiveBorrows(tx, p.org), grants: await listOpenGrants(tx, p.org) }), { name: "ui_borrows" });
  return { ...d, labels: new Map((await listApiTokensOfOrg(store, p.org)).map((t) => [t.id, t.label])) };
}

function endForm(v: View, id: string): Html {
  return allows(v.principal, "operator")
    ? action({ action: `/ui/borrows/${id}/end`, label: "End borrow", confirm: `End borrow ${id}? The borrower loses access at once.` })
    : html``;
}

export function renderBorrows(v: View, d: BorrowsData): Html {
  const live = (g: GrantRow) => g.state === "pending" || g.state === "installing" || g.state === "active";
  return html`<h2 id="keeper">Keeper borrows (${d.borrows.length})</h2>
${d.borrows.length === 0 ? html`<p class="muted">No active keeper borrow.</p>` : html`<table aria-labelledby="keeper"><thead><tr><th>Borrow</th><th>Pool</th><th>Machine</th><th class="num">Generation</th><th>Borrower</th><th>Since</th><th>Heartbeat due</th><th>Hard deadline</th><th>Action</th></tr></thead>
<tbody>${d.borrows.map(
    (b) => html`<tr data-borrow="${b.id}" id="${b.id}"><td>${b.id}</td><td><a href="/ui/pools/${b.pool}">${b.pool}</a></td><td><a href="/ui/machines/${b.machine_id}">${b.machine_id}</a></td><td class="num">${b.generation}</td>
<td>${tokenName(b.principal, d.labels)}</td><td>${since(v.now, b.created_at)}</td><td>${deadline(v.now, b.heartbeat_deadline)}</td><td>${deadline(v.now, b.expires_at)}</td><td>${endForm(v, b.id)}</td></tr>`,
  )}</tbody></table>`}
<h2 id="grants">Portable grants (${d.grants.length})</h2>
${d.grants.length === 0 ? html`<p class="muted">No open grant.</p>` : html`<table aria-labelledby="grants"><thead><tr><th>Grant</th><th>State</th><th>Pool</th><th>Machine</th><th class="num">Generation</th><th>Borrower</th><th>Key</th><th>Since</th><th>Hard deadline</th><th>Action</th></tr></thead>
<tbody>${d.grants.map(
    (g) => html`<tr data-borrow="${g.id}" id="${g.id}"><td>${g.id}</td><td class="state">${g.state}${g.reason ? ` (${g.reason})` : ""}</td><td><a href="/ui/pools/${g.pool}">${g.pool}</a></td><td><a href="/ui/machines/${g.machine_id}">${g.machine_id}</a></td>
<td class="num">${g.generation}</td><td>${tokenName(g.borrower, d.labels)}</td><td><code>${g.fingerprint}</code></td><td>${since(v.now, g.created_at)}</td><td>${live(g) ? deadline(v.now, g.expires_at) : html`<span class="muted">ended, cleanup ${g.state}</span>`}</td><td>${live(g) ? endForm(v, g.id) : ""}</td></tr>`,
  )}</tbody></table>`}`;
}
