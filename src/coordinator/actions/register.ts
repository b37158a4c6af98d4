/**
 * Registration: a provisioned machine becomes `ready` in the same transaction
 * that consumes its exact fill claim. A claim is used once; a second
 * registration with it is refused and changes nothing. A resource that is
 * live in the other access namespace (keeper vs portable) is refused
 * (invariant 10).
 */
import { BerthError } from "../../core/errors.js";
import { hashToken } from "../../core/tokens.js";
import { newId } from "../../core/ids.js";
import type { Tx } from "../../store/store.js";
import { audit } from "../../store/audit.js";
import { clearDue, setDue } from "../../store/due.js";
import { consumeClaim, lockClaim, lockClaimByTokenHash } from "../../store/claims.js";
import { insertMachine, liveMachineOfResource, markProvisioned, type MachineRow } from "../../store/machines.js";
import { lockPool } from "../../store/pools.js";
import { rotationMarginMs } from "../../core/pool.js";
import type { Ctx } from "../context.js";
import type { Principal } from "../auth.js";

export interface RegisterInput {
  pool: string;
  claimToken: string;
  resourceId: string;
  ssh: { host: string; port: number; user: string | null; hostKey: string | null };
  hardTtlMs: number | null;
}

/** Refuses a resource that is live under a different access mode or already registered. */
export async function checkResourceFree(tx: Tx, provider: string, resourceId: string, access: string, exceptMachine: string | null): Promise<void> {
  const live = await liveMachineOfResource(tx, provider, resourceId);
  if (!live || live.id === exceptMachine) return;
  if (live.access !== access) {
    throw new BerthError("namespace_conflict", `namespace_conflict: resource ${resourceId} is live as a ${live.access} machine (${live.id}); it cannot be registered for ${access} access`);
  }
  throw new BerthError("conflict", `conflict: resource ${resourceId} is already registered as machine ${live.id} (${live.state})`);
}

export async function registerMachine(ctx: Ctx, p: Principal, input: RegisterInput): Promise<{ machineId: string; state: string }> {
  const now = ctx.now();
  const machineId = newId("m", ctx.randomBytes);
  const result = await ctx.store.transaction(async (tx) => {
    const pool = await lockPool(tx, p.org, input.pool);
    if (!pool) throw new BerthError("not_found", `not_found: no pool named ${input.pool} in this organisation`);
    const claim = await lockClaimByTokenHash(tx, hashToken("claim", input.claimToken));
    if (!claim || claim.org !== p.org || claim.pool !== input.pool) throw new BerthError("claim_not_found", "claim_not_found: the fill claim token does not belong to this pool");
    if (claim.state === "consumed") throw new BerthError("claim_consumed", `claim_consumed: fill claim ${claim.id} was already used to register machine ${claim.machine_id}`);
    if (claim.state === "expired" || now >= claim.expires_at) {
      throw new BerthError("claim_expired", `claim_expired: fill claim ${claim.id} expired; ensure the pool again for a fresh claim`);
    }
    await checkResourceFree(tx, pool.provider, input.resourceId, pool.access, null);
    const hardExpiresAt = now + Math.min(input.hardTtlMs ?? pool.hardTtlMs, pool.hardTtlMs);
    await insertMachine(tx, {
      id: machineId, org: p.org, pool: pool.name, access: pool.access, provider: pool.provider, resourceId: input.resourceId, hostId: null,
      state: "ready", ssh: input.ssh, claimId: claim.id, now, hardExpiresAt,
    });
    await consumeClaim(tx, claim.id, machineId);
    await clearDue(tx, "claim", claim.id);
    await setDue(tx, "ttl", machineId, hardExpiresAt - rotationMarginMs(pool.hardTtlMs));
    await audit(tx, { at: now, machineId, subject: claim.id, event: "register", from: null, to: "ready", generation: 0, actor: ctx.actor });
    return { machineId, state: "ready", pool: pool.name };
  });
  ctx.metrics.claims.inc({ pool: result.pool, event: "completed" });
  return { machineId: result.machineId, state: result.state };
}

/**
 * Registration of a machine the coordinator's own provider created: the
 * provisioning row already exists; it becomes ready only if its claim is
 * still open and unexpired (consumed here). Otherwise the caller destroys it.
 */
export async function registerProvisioned(
  tx: Tx,
  ctx: Ctx,
  machine: MachineRow,
  found: { incarnation: string; sshHost: string; sshPort: number; hostKey: string },
  now: number,
): Promise<{ ok: true } | { ok: false; why: string }> {
  if (machine.state !== "provisioning") return { ok: false, why: `machine is ${machine.state}` };
  const claim = machine.claim_id ? await lockClaim(tx, machine.claim_id) : undefined;
  if (!claim || claim.state !== "open" || now >= claim.expires_at) return { ok: false, why: "its fill claim expired before provisioning finished" };
  const pool = await lockPool(tx, machine.org, machine.pool);
  if (!pool) return { ok: false, why: "its pool no longer exists" };
  await markProvisioned(tx, machine.id, found, now);
  await consumeClaim(tx, claim.id);
  await clearDue(tx, "claim", claim.id);
  await setDue(tx, "ttl", machine.id, machine.hard_expires_at - rotationMarginMs(pool.hardTtlMs));
  await audit(tx, { at: now, machineId: machine.id, subject: claim.id, event: "register", from: "provisioning", to: "ready", generation: machine.generation, actor: ctx.actor });
  tx.afterCommit(() => ctx.metrics.claims.inc({ pool: machine.pool, event: "completed" }));
  return { ok: true };
}
