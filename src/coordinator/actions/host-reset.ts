/**
 * `berth host reset-identity NAME` (docs/host-identity.md, "Recovery by an
 * operator"): the host goes back to `awaiting` its agent. In one
 * transaction its recorded key and pending key are cleared, its host
 * credentials deleted, any earlier reset's one-time token revoked, and a new
 * one-time enroll token (an `agent`-role API token, stored as a hash) is
 * recorded as the only token that admits the host again (`reset_token_id`);
 * audited `host_identity_reset`. The raw token goes to the operator only.
 *
 * From then on the coordinator accepts no credential of the host's old key
 * (its sessions are refused `host_awaiting`) and the shared enroll token is
 * still refused `host_exists`. The real agent, started with the one-time
 * token, enrolls with a proof of its key (src/coordinator/actions/hosts.ts,
 * `bindAwaiting`): the host is `active` on that key and the token is spent.
 *
 * Refused `host_busy` while the host lends a machine (end those borrows
 * first) and `conflict` while it is being removed.
 */
import { BerthError } from "../../core/errors.js";
import { newId } from "../../core/ids.js";
import { hashToken, newToken } from "../../core/tokens.js";
import { insertToken } from "../../store/api-tokens.js";
import { audit } from "../../store/audit.js";
import { deleteHostCredentials, liveMachinesOfHost, setIdentityState } from "../../store/host-identity.js";
import { revokeTokenById, setResetToken } from "../../store/host-removal.js";
import { lockHostByName } from "../../store/hosts.js";
import type { MachineRow } from "../../store/machines.js";
import type { Principal } from "../auth.js";
import { requireRole } from "../auth.js";
import type { Ctx } from "../context.js";

const LENT = new Set(["reserved", "installing", "busy"]);

export interface ResetAnswer {
  host: string;
  hostId: string;
  state: "awaiting";
  /** The one-time enroll token: shown once, stored only as a hash. */
  enrollToken: string;
}

export async function resetHostIdentity(ctx: Ctx, p: Principal, name: string): Promise<ResetAnswer> {
  requireRole(p, "admin");
  const now = ctx.now();
  const tokenId = newId("tok", ctx.randomBytes);
  const token = newToken("api", ctx.randomBytes);
  const r = await ctx.store.transaction(async (tx) => {
    const h = await lockHostByName(tx, p.org, name);
    if (!h) throw new BerthError("not_found", `not_found: no host named ${name} in this organisation (see \`berth host ls\`)`);
    if (h.removing_since !== null) throw new BerthError("conflict", `conflict: host ${name} is being removed; there is no identity to reset`);
    const lent = (await liveMachinesOfHost<MachineRow>(tx, h.id)).filter((m) => LENT.has(m.state));
    if (lent.length > 0) {
      throw new BerthError(
        "host_busy",
        `host_busy: host ${name} lends ${lent.map((m) => `${m.id} (${m.state}, pool ${m.pool})`).join(", ")}; end those borrows first (\`berth borrow end\`, or \`berth machine drain\`), then reset`,
      );
    }
    await insertToken(tx, { id: tokenId, org: p.org, role: "agent", hash: hashToken("api", token), label: `reset-identity ${name}` }, now);
    if (h.reset_token_id !== null) await revokeTokenById(tx, h.reset_token_id, now);
    await setIdentityState(tx, h.id, { state: "awaiting", key: null, pendingKey: null }, now);
    await deleteHostCredentials(tx, h.id);
    await setResetToken(tx, h.id, tokenId);
    await audit(tx, { at: now, machineId: h.id, subject: p.tokenId, event: "host_identity_reset", from: h.identity_state, to: "awaiting", generation: 0, actor: ctx.actor });
    tx.afterCommit(() => ctx.log.info({ host: name, hostId: h.id, from: h.identity_state, by: p.tokenId }, "host identity: reset by an operator; the host awaits its agent with the one-time enroll token"));
    return { host: name, hostId: h.id };
  });
  return { ...r, state: "awaiting", enrollToken: token };
}
