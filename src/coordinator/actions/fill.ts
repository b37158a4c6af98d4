/**
 * Filling a pool: inside the caller's transaction, lock the pool row, count
 * capacity, and issue the claims `fillDecision` allows. For a pool whose
 * provider provisions machines itself (hosts), each claim immediately funds
 * a machine row in `provisioning` on a host with a free slot and a durable
 * `provision` operation; the operation executor carries it out after commit.
 * For an outside keeper (external), the claims are returned to the caller,
 * who provisions and registers with the claim token.
 */
import type { Tx } from "../../store/store.js";
import { fillDecision, type PoolRecord } from "../../core/pool.js";
import { countCapacity, insertClaims, type IssuedClaim } from "./capacity.js";
import { audit, poolFromRow, setDue, type PoolRow } from "../../store/rows.js";
import { createHmac } from "node:crypto";
import type { Ctx } from "../context.js";

export interface FillResult {
  pool: PoolRecord;
  issued: IssuedClaim[];
  why: string | null;
}

export async function lockPool(tx: Tx, org: string, name: string): Promise<PoolRecord | undefined> {
  const row = await tx.get<PoolRow>(`SELECT * FROM pools WHERE org = ? AND name = ?${tx.forUpdate}`, [org, name]);
  return row ? poolFromRow(row) : undefined;
}

function derivedId(seed: Uint8Array, prefix: string, i: number): string {
  return `${prefix}_` + createHmac("sha256", seed).update(`${prefix}:${i}`).digest("hex").slice(0, 24);
}

export async function fillPool(tx: Tx, ctx: Ctx, pool: PoolRecord, now: number, seed: Uint8Array): Promise<FillResult> {
  const counts = await countCapacity(tx, pool.org, pool.name, now);
  const decision = fillDecision(pool, counts);
  if (decision.kind === "hold") return { pool, issued: [], why: decision.why };
  const provider = ctx.providers.get(pool.provider);
  let count = decision.claims;
  const hostIds: string[] = [];
  if (provider?.capabilities.provision) {
    // Reserve a host slot per claim; stop where the hosts are full.
    for (let i = 0; i < count; i++) {
      const host = await tx.get<{ id: string }>(
        `SELECT id FROM hosts WHERE org = ? AND used_slots < slots ORDER BY used_slots, id LIMIT 1${tx.forUpdate}`,
        [pool.org],
      );
      if (!host) break;
      await tx.run("UPDATE hosts SET used_slots = used_slots + 1 WHERE id = ?", [host.id]);
      hostIds.push(host.id);
    }
    count = hostIds.length;
    if (count === 0) return { pool, issued: [], why: "no enrolled host has a free slot" };
  }
  const issued = await insertClaims(tx, { org: pool.org, pool: pool.name, count, seed, now, ttlMs: ctx.config.claimTtlMs });
  // Counted on commit: this body may be re-run after a conflict.
  if (issued.length > 0) tx.afterCommit(() => ctx.metrics.claims.inc({ pool: pool.name, event: "created" }, issued.length));
  if (provider?.capabilities.provision) {
    for (let i = 0; i < issued.length; i++) {
      const claim = issued[i]!;
      const machineId = derivedId(seed, "m", i);
      const opId = derivedId(seed, "op", i);
      await tx.run(
        `INSERT INTO machines (id, org, pool, access, provider, resource_id, host_id, state, generation, incarnation, ssh_host, ssh_port, ssh_user, host_key, claim_id, lent_to, created_at, state_since, ready_since, hard_expires_at, reason)
         VALUES (?, ?, ?, ?, ?, ?, ?, 'provisioning', 0, NULL, NULL, NULL, NULL, NULL, ?, NULL, ?, ?, NULL, ?, NULL)`,
        [machineId, pool.org, pool.name, pool.access, pool.provider, machineId, hostIds[i]!, claim.id, now, now, now + pool.hardTtlMs],
      );
      await tx.run("UPDATE claims SET machine_id = ? WHERE id = ?", [machineId, claim.id]);
      await tx.run(
        "INSERT INTO operations (id, kind, machine_id, host_id, generation, state, attempts, args, result, error, created_at, updated_at) VALUES (?, 'provision', ?, ?, 0, 'pending', 0, ?, NULL, NULL, ?, ?)",
        [opId, machineId, hostIds[i]!, JSON.stringify({ claimId: claim.id, keeperKey: pool.keeperKey }), now, now],
      );
      await setDue(tx, "op", opId, now);
      await audit(tx, { at: now, machineId, subject: claim.id, event: "provision", from: null, to: "provisioning", generation: 0, actor: ctx.actor });
    }
  }
  return { pool, issued, why: null };
}
