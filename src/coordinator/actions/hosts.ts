/**
 * Host enrollment. An agent presents an agent-role API token (the shared
 * enroll token) and describes itself; the coordinator answers with the token
 * it will use to call the agent. That token is derived from the
 * coordinator's secret (`hostCallToken` in src/core/tokens.ts), so the
 * database holds no credential at all; the agent stores only its hash.
 *
 * Host identity (docs/host-identity.md) decides what the enroll token may do:
 *   - a new name with an identity proof: the host is recorded with its key,
 *     `active` at once, answered `identity: "active"`;
 *   - a new name without one (an agent built before host identity): a
 *     `legacy` host, re-enrolled by name with the token until it switches;
 *   - an existing legacy (or preparing/prepared) host: updated, and back on
 *     the token (`legacy`): an agent that enrolls with the token has not
 *     committed its switch;
 *   - an existing host whose floor is recorded: refused `host_activated`,
 *     changing nothing, unless the request proves the host's own key (an
 *     agent that crashed between its enrollment and its record).
 */
import { BerthError } from "../../core/errors.js";
import { floorRecorded } from "../../core/host-identity.js";
import { newId } from "../../core/ids.js";
import { hostCallToken } from "../../core/tokens.js";
import { callTokenFor } from "../../providers/hosts/agent-call.js";
import type { Ctx } from "../context.js";
import type { Principal } from "../auth.js";
import { requireRole } from "../auth.js";
import { poolRef, setDue } from "../../store/due.js";
import { deleteHostCredentials, setIdentityState } from "../../store/host-identity.js";
import { insertHost, listHosts as listHostRows, lockHostByName, updateHost, type HostRow, type HostRuntimeDetail } from "../../store/hosts.js";
import { setHostAddressOfMachines } from "../../store/machines.js";
import { poolNamesOfProvider } from "../../store/pools.js";
import { accountEnrolledHost } from "./alloc-owners.js";
import { takeProof } from "./host-identity.js";

export interface EnrollInput {
  name: string;
  url: string;
  runtime: "process" | "gvisor";
  runtimeDetail?: HostRuntimeDetail;
  capacity: { vcpu: number; memoryMb: number; slots: number };
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
    if (existing && floorRecorded(existing.identity_state)) {
      if (identity === undefined || identity.publicKey !== existing.identity_key) {
        ctx.metrics.hostIdentityRefusals.inc({ code: "host_activated" }); // a refusal commits nothing: counted here
        throw new BerthError(
          "host_activated",
          `host_activated: host ${input.name} proves itself with its own identity key; the enroll token no longer admits it. ` +
            "A new machine enrolls under a new name; a host that lost its key is removed and enrolled again by an operator",
        );
      }
      await takeProof(tx, ctx, secret, { key: existing.identity_key, purpose: "enroll", host: input.name, challenge: identity.challenge, signature: identity.signature });
      await describe(tx, ctx, existing, description, now);
      return { hostId: existing.id, hostCallToken: callTokenFor(secret, existing), identity: "active" };
    }
    if (existing) {
      await describe(tx, ctx, existing, description, now);
      if (existing.identity_state !== "legacy") {
        // Back on the token: the pending key's credentials go too (a new prepare records the key again).
        await setIdentityState(tx, existing.id, { state: "legacy", pendingKey: null }, now);
        await deleteHostCredentials(tx, existing.id);
      }
      return { hostId: existing.id, hostCallToken: hostCallToken(secret, existing.id) };
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

async function describe(tx: Parameters<typeof updateHost>[0], ctx: Ctx, h: HostRow, d: Omit<EnrollInput, "identity" | "name">, now: number): Promise<void> {
  await updateHost(tx, h.id, d, now);
  // Machines on this host learn its (possibly new) gateway address.
  await setHostAddressOfMachines(tx, h.id, d.ssh);
  await accountEnrolledHost(tx, ctx.actor, { id: h.id, org: h.org, name: h.name, ...d.capacity }, now);
}

export async function listHosts(ctx: Ctx, p: Principal): Promise<HostRow[]> {
  return ctx.store.transaction((tx) => listHostRows(tx, p.org));
}
