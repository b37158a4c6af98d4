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
import { audit } from "../../store/audit.js";
import { setClaimMachine } from "../../store/claims.js";
import { takeHostSlot } from "../../store/hosts.js";
import { insertMachine } from "../../store/machines.js";
import { insertOp } from "../../store/operations.js";
import { createHmac } from "node:crypto";
import { policyFingerprint } from "../../core/network-policy.js";
import { setMachineFingerprint } from "../../store/machine-network.js";
import { setMachineImage } from "../../store/images.js";
import { openBreaker } from "../../store/provision-breaker.js";
import { setMachineForwarding } from "../../store/forwarding.js";
import { setMachineFilesScope } from "../../store/files-scope.js";
import type { Ctx } from "../context.js";

export interface FillResult {
  pool: PoolRecord;
  issued: IssuedClaim[];
  why: string | null;
  /** The pool's provisioning breaker is open until then: look again at that time. */
  pausedUntil?: number | null;
}

function derivedId(seed: Uint8Array, prefix: string, i: number): string {
  return `${prefix}_` + createHmac("sha256", seed).update(`${prefix}:${i}`).digest("hex").slice(0, 24);
}

export async function fillPool(tx: Tx, ctx: Ctx, pool: PoolRecord, now: number, seed: Uint8Array): Promise<FillResult> {
  const counts = await countCapacity(tx, pool.org, pool.name, now);
  const decision = fillDecision(pool, counts);
  if (decision.kind === "hold") return { pool, issued: [], why: decision.why };
  const provider = ctx.providers.get(pool.provider);
  if (provider?.capabilities.provision) {
    const b = await openBreaker(tx, pool.org, pool.name, now);
    if (b) return { pool, issued: [], why: `provisioning paused until ${new Date(b.openUntil!).toISOString()} after ${ctx.config.provisionBreakerThreshold} failed provisions in a row: ${b.cause ?? "unknown"}`, pausedUntil: b.openUntil };
  }
  let count = decision.claims;
  const hostIds: string[] = [];
  if (provider?.capabilities.provision && !provider.selfPlaced) {
    // Reserve a host slot per claim; stop where the hosts are full.
    // An image boots only in a gvisor sandbox: such a pool is placed on gvisor hosts.
    const runtime = pool.image !== null ? "gvisor" : null;
    for (let i = 0; i < count; i++) {
      const hostId = await takeHostSlot(tx, pool.org, runtime);
      if (hostId === null) break;
      hostIds.push(hostId);
    }
    count = hostIds.length;
    if (count === 0) return { pool, issued: [], why: runtime ? "no enrolled gvisor host has a free slot (the pool's image boots only on gvisor)" : "no enrolled host has a free slot" };
  }
  const issued = await insertClaims(tx, { org: pool.org, pool: pool.name, count, seed, now, ttlMs: ctx.config.claimTtlMs });
  // Counted on commit: this body may be re-run after a conflict.
  if (issued.length > 0) tx.afterCommit(() => ctx.metrics.claims.inc({ pool: pool.name, event: "created" }, issued.length));
  if (provider?.capabilities.provision) {
    for (let i = 0; i < issued.length; i++) {
      const claim = issued[i]!;
      const machineId = derivedId(seed, "m", i);
      const opId = derivedId(seed, "op", i);
      await insertMachine(tx, {
        id: machineId, org: pool.org, pool: pool.name, access: pool.access, provider: pool.provider, resourceId: machineId, hostId: hostIds[i] ?? null,
        state: "provisioning", ssh: { host: null, port: null, user: null, hostKey: null }, claimId: claim.id, now, hardExpiresAt: now + pool.hardTtlMs,
      });
      await setClaimMachine(tx, claim.id, machineId);
      await setMachineFingerprint(tx, machineId, policyFingerprint(pool.network));
      if (pool.image !== null) await setMachineImage(tx, machineId, pool.image);
      if (pool.forwarding === "off") await setMachineForwarding(tx, machineId, pool.forwarding);
      const forwarding = pool.forwarding === "off" ? { forwarding: "off" } : {};
      if (pool.files === "workspace") await setMachineFilesScope(tx, machineId, pool.files);
      const files = pool.files === "workspace" ? { files: "workspace" } : {};
      const network = pool.network.mode === "none" ? {} : { network: pool.network };
      const image = pool.image === null ? {} : { image: pool.image };
      await insertOp(tx, { id: opId, kind: "provision", machineId, hostId: hostIds[i] ?? null, generation: 0, args: { claimId: claim.id, keeperKey: pool.keeperKey, ...network, ...image, ...forwarding, ...files }, now });
      await audit(tx, { at: now, machineId, subject: claim.id, event: "provision", from: null, to: "provisioning", generation: 0, actor: ctx.actor });
    }
  }
  return { pool, issued, why: null };
}
