/** API tokens of the organisation (admins only): ids, roles, labels and dates, never a token; revoke at once. */
import type { Principal } from "../../auth.js";
import { requireRole } from "../../auth.js";
import type { Store } from "../../../store/store.js";
import { listApiTokensOfOrg } from "../../../store/api-tokens.js";
import { html, type Html } from "../html.js";
import { action, iso, type View } from "../layout.js";

export type TokensData = Awaited<ReturnType<typeof listApiTokensOfOrg>>;

export async function loadTokens(store: Store, p: Principal): Promise<TokensData> {
  requireRole(p, "admin");
  return listApiTokensOfOrg(store, p.org);
}

export function renderTokens(v: View, d: TokensData): Html {
  return html`<p>Tokens are created with <code>berth token create</code>; only their ids are shown here.</p>
<table aria-label="API tokens"><thead><tr><th>Token id</th><th>Role</th><th>Label</th><th>Created</th><th>Expires</th><th>Revoked</th><th>Action</th></tr></thead>
<tbody>${d.map(
    (t) => html`<tr data-token="${t.id}"><td><code>${t.id}</code>${t.id === v.principal.tokenId ? " (this session's)" : ""}</td><td>${t.role}</td><td>${t.label ?? ""}</td><td>${iso(t.created_at)}</td><td>${iso(t.expires_at)}</td><td>${iso(t.revoked_at)}</td>
<td>${t.revoked_at === null ? action({ action: `/ui/tokens/${t.id}/revoke`, label: "Revoke", confirm: `Revoke token ${t.id}? Every request and session with it is refused from now on, and its live grants are ended.` }) : ""}</td></tr>`,
  )}</tbody></table>`;
}
