/**
 * Host enrollment. An agent presents an agent-role API token and describes
 * itself; the coordinator records the host (idempotently by name) and answers
 * with the token it will use to call the agent. That token is derived from
 * the coordinator's secret (HMAC over the host id, `hostCallToken` in
 * src/core/tokens.ts), so the database holds no credential at all; the agent
 * stores only its hash.
 */
import { newId } from "../../core/ids.js";
import { hostCallToken } from "../../core/tokens.js";
import type { Ctx } from "../context.js";
import type { Principal } from "../auth.js";
import { requireRole } from "../auth.js";
import { poolRef, setDue } from "../../store/due.js";
import { insertHost, listHosts as listHostRows, lockHostByName, updateHost, type HostRow } from "../../store/hosts.js";
import { setHostAddressOfMachines } from "../../store/machines.js";
import { poolNamesOfProvider } from "../../store/pools.js";
import { accountEnrolledHost } from "./alloc-owners.js";

export interface EnrollInput {
  name: string;
  url: string;
  runtime: "process" | "gvisor";
  capacity: { vcpu: number; memoryMb: number; slots: number };
  ssh: { host: string; port: number; hostKey: string; fingerprint: string };
}

export async function enrollHost(ctx: Ctx, p: Principal, input: EnrollInput, secret: Uint8Array): Promise<{ hostId: string; hostCallToken: string }> {
  requireRole(p, "agent");
  const now = ctx.now();
  const fresh = newId("h", ctx.randomBytes);
  const hostId = await ctx.store.transaction(async (tx) => {
    const existing = await lockHostByName(tx, p.org, input.name);
    if (existing) {
      await updateHost(tx, existing.id, input, now);
      // Machines on this host learn its (possibly new) gateway address.
      await setHostAddressOfMachines(tx, existing.id, input.ssh);
      await accountEnrolledHost(tx, ctx.actor, { id: existing.id, org: p.org, name: input.name, ...input.capacity }, now);
      return existing.id;
    }
    await insertHost(tx, fresh, p.org, input.name, input, now);
    await accountEnrolledHost(tx, ctx.actor, { id: fresh, org: p.org, name: input.name, ...input.capacity }, now);
    // New capacity: every hosts-provider pool of the org may now be filled.
    for (const pool of await poolNamesOfProvider(tx, p.org, "hosts")) await setDue(tx, "fill", poolRef(p.org, pool), now);
    return fresh;
  });
  ctx.kick();
  return { hostId, hostCallToken: hostCallToken(secret, hostId) };
}

export async function listHosts(ctx: Ctx, p: Principal): Promise<HostRow[]> {
  return ctx.store.transaction((tx) => listHostRows(tx, p.org));
}
