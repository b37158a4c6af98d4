/**
 * Host enrollment. An agent presents an agent-role API token (the shared
 * enroll token) and describes itself; the coordinator answers with the token
 * it will use to call the agent. That token is derived from the
 * coordinator's secret (`hostCallToken` in src/core/tokens.ts), so the
 * database holds no credential at all; the agent stores only its hash.
 *
 * The enroll token only ever creates a host that does not exist
 * (docs/host-identity.md):
 *   - a new name with an identity proof: the host is recorded with its key,
 *     `active` at once, answered `identity: "active"`;
 *   - a new name without one (an agent built before host identity): a
 *     `legacy` host, on its host-call token from then on;
 *   - an existing name, in every identity state: refused `host_exists`,
 *     nothing changed, no token in the answer. The one exception is a host
 *     an operator reset (`awaiting`): the one-time enroll token the reset
 *     issued binds it the key its enrollment proves, once.
 */
import { BerthError } from "../../core/errors.js";
import { newId } from "../../core/ids.js";
import { hostCallToken } from "../../core/tokens.js";
import { callTokenFor } from "../../providers/hosts/agent-call.js";
import type { Ctx } from "../context.js";
import type { Principal } from "../auth.js";
import { requireRole } from "../auth.js";
import { audit } from "../../store/audit.js";
import { poolRef, setDue } from "../../store/due.js";
import { setIdentityState } from "../../store/host-identity.js";
import { revokeTokenById, setResetToken } from "../../store/host-removal.js";
import { insertHost, listHosts as listHostRows, lockHostByName, updateHost, type HostRow, type HostRuntimeDetail } from "../../store/hosts.js";
import { setHostAddressOfMachines } from "../../store/machines.js";
import { poolNamesOfProvider } from "../../store/pools.js";
import type { Tx } from "../../store/store.js";
import { accountEnrolledHost } from "./allocation-owners.js";
import { takeProof } from "./host-identity.js";

export interface EnrollInput {
  name: string;
  url: string;
  runtime: "process" | "gvisor";
  runtimeDetail?: HostRuntimeDetail;
  /** diskMib absent or null: not declared (an agent older than the disk dimension). */
  capacity: { vcpu: number; memoryMib: number; diskMib?: number | null; slots: number };
  ssh: { host: string; port: number; hostKey: string; fingerprint: string };
  identity?: { publicKey: string; challenge: string; signature: string };
}

export interface EnrollAnswer {
  hostId: string;
  hostCallToken: string;
  identity?: "active";
}

export async function enrollHost(ctx: Ctx, p: Principal, input: EnrollInput, secret: Uint8Array): Promise<EnrollAnswer> {
  requireRole(p, "agent");
  const now = ctx.now();
  const fresh = newId("h", ctx.randomBytes);
  const { identity, ...description } = input;
  const r = await ctx.store.transaction(async (tx): Promise<EnrollAnswer> => {
    const existing = await lockHostByName(tx, p.org, input.name);
    if (existing) {
      const why = refusalOfExisting(existing, p, identity !== undefined);
      if (why !== null) {
        ctx.metrics.hostIdentityRefusals.inc({ code: "host_exists" }); // a refusal commits nothing: counted here
        throw new BerthError("host_exists", `host_exists: ${why}`);
      }
      return bindAwaiting(tx, ctx, p, existing, input, secret, now);
    }
    if (identity !== undefined) {
      await takeProof(tx, ctx, secret, { key: identity.publicKey, purpose: "enroll", host: input.name, challenge: identity.challenge, signature: identity.signature });
    }
    await insertHost(tx, fresh, p.org, input.name, description, now, identity?.publicKey ?? null);
    await accountEnrolledHost(tx, ctx.actor, { id: fresh, org: p.org, name: input.name, ...input.capacity }, now);
    // New capacity: every hosts-provider pool of the org may now be filled.
    for (const pool of await poolNamesOfProvider(tx, p.org, "hosts")) await setDue(tx, "fill", poolRef(p.org, pool), now);
    if (identity === undefined) return { hostId: fresh, hostCallToken: hostCallToken(secret, fresh) };
    tx.afterCommit(() => ctx.metrics.hostIdentitySteps.inc({ step: "enrolled_active" }));
    return {
      hostId: fresh,
      hostCallToken: callTokenFor(secret, { id: fresh, url: input.url, identity_state: "active", identity_key: identity.publicKey }),
      identity: "active",
    };
  });
  ctx.kick();
  return r;
}

/** Why an enrollment under an existing host's name is refused; null only for the reset's own token with a key proof. */
function refusalOfExisting(h: HostRow, p: Principal, proven: boolean): string | null {
  const taken =
    `a host named ${h.name} is already enrolled (${h.id}); the enroll token only creates hosts that do not exist. ` +
    "Start a new machine under a new --name; to give this host a new identity key, an operator runs `berth host reset-identity " +
    `${h.name}\` and starts its agent with the one-time enroll token it prints`;
  if (h.removing_since !== null) return `host ${h.name} is being removed (\`berth host rm\`); enroll a new host under another name once it is gone`;
  if (h.identity_state !== "awaiting") return taken;
  if (h.reset_token_id !== p.tokenId) {
    return `host ${h.name} awaits its agent after an identity reset; only the one-time enroll token \`berth host reset-identity ${h.name}\` printed admits it`;
  }
  if (!proven) return `host ${h.name} binds only an identity key, and this enrollment carries no identity proof (an agent built before host identity); upgrade the agent`;
  return null;
}

/** A reset host's agent proves its key with the reset's one-time token: the key is the host's, `active`, and the token is spent. */
async function bindAwaiting(tx: Tx, ctx: Ctx, p: Principal, h: HostRow, input: EnrollInput, secret: Uint8Array, now: number): Promise<EnrollAnswer> {
  const { identity, ...d } = input;
  if (identity === undefined) throw new Error("bindAwaiting needs an identity proof");
  await takeProof(tx, ctx, secret, { key: identity.publicKey, purpose: "enroll", host: h.name, challenge: identity.challenge, signature: identity.signature });
  await updateHost(tx, h.id, d, now);
  await setHostAddressOfMachines(tx, h.id, d.ssh);
  await accountEnrolledHost(tx, ctx.actor, { id: h.id, org: h.org, name: h.name, ...d.capacity }, now);
  await setIdentityState(tx, h.id, { state: "active", key: identity.publicKey, pendingKey: null }, now);
  await setResetToken(tx, h.id, null);
  await revokeTokenById(tx, p.tokenId, now);
  await audit(tx, { at: now, machineId: h.id, subject: p.tokenId, event: "host_identity_bound", from: "awaiting", to: "active", generation: 0, actor: ctx.actor });
  for (const pool of await poolNamesOfProvider(tx, h.org, "hosts")) await setDue(tx, "fill", poolRef(h.org, pool), now);
  tx.afterCommit(() => {
    ctx.metrics.hostIdentitySteps.inc({ step: "bound" });
    ctx.log.info({ host: h.name, hostId: h.id }, "host identity: the reset host's agent bound its key; the one-time enroll token is spent");
  });
  return { hostId: h.id, hostCallToken: callTokenFor(secret, { id: h.id, url: d.url, identity_state: "active", identity_key: identity.publicKey }), identity: "active" };
}

export async function listHosts(ctx: Ctx, p: Principal): Promise<HostRow[]> {
  return ctx.store.transaction((tx) => listHostRows(tx, p.org));
}
