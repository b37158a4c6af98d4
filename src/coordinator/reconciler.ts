/**
 * The reconciler visits only due rows. Every deadline (heartbeat, claim
 * expiry, fill re-check, hard TTL, retention, operation retry) is one row of
 * the `due` index ordered by time; a tick takes due rows one at a time, each
 * in its own transaction that locks the row (SKIP LOCKED on PostgreSQL, so
 * several coordinators never process the same row) and either deletes it or
 * moves it to its next time. A tick costs O(due rows), never O(machines).
 *
 * Provider operations found due are started in their row's transaction and
 * executed after its commit, by the executor the reconciler is given (see
 * executor.ts; the wiring is in server.ts).
 */
import type { Ctx } from "./context.js";
import type { Tx } from "../store/store.js";
import { audit } from "../store/audit.js";
import { clearDue, deferUnknownDue, poolRef, setDue, setDueNoLater, takeDueRow, type DueRow } from "../store/due.js";
import { deleteEndedBorrow, endBorrow, lockBorrow } from "../store/borrows.js";
import { deleteExpiredClaim, expireClaim, lockClaim } from "../store/claims.js";
import { deleteClosedGrant } from "../store/grants.js";
import { deleteMachine, lockMachine, lockReadyMachines } from "../store/machines.js";
import { countOpenOps, deleteOpsOfMachine } from "../store/operations.js";
import { lockPool } from "../store/pools.js";
import { liveDecision } from "../core/borrow.js";
import { applyTransition } from "./actions/transition.js";
import { fillPool } from "./actions/fill.js";
import type { OperationExecutor, StartedOp } from "./executor.js";
import { rotationMarginMs, fillDecision } from "../core/pool.js";
import { countCapacity } from "./actions/capacity.js";
import { handleGrantDueRow, invalidateGrantsOfBorrower } from "./actions/grants.js";
import { onAllocationExpiryDue } from "./actions/allocation-release.js";
import { onAllocationRestartDue, onAllocationWatchDue } from "./actions/allocation-watch.js";
import type { AllocationWorker } from "./allocation-worker.js";
import { STANDING_RETRY_MS } from "./actions/host-standing.js";

export interface TickResult {
  visited: number;
  started: StartedOp[];
}

export interface ReconcilerDeps {
  ctx: Ctx;
  /** Leases due operations (in the due row's transaction); the loop then carries them out. */
  executor: Pick<OperationExecutor, "start" | "execute">;
  /** Runs allocation launches and cleanups after the due row's commit (allocation-worker.ts). */
  allocations?: Pick<AllocationWorker, "drive">;
}

export class Reconciler {
  constructor(readonly deps: ReconcilerDeps) {}

  /** One pass over what is due now; starts due operations without waiting for them. */
  tick(limit = 256): Promise<TickResult> {
    return tick(this.deps, limit);
  }
}

async function tick({ ctx, executor, allocations }: ReconcilerDeps, limit: number): Promise<TickResult> {
  const now = ctx.now();
  const result: TickResult = { visited: 0, started: [] };
  // A row re-armed to "now" by another row's handling (a fill after a quarantine) is
  // legitimately due again in the same tick; a row coming back a third time means its
  // handler keeps re-arming it, and the rest of the tick waits for the next pass.
  const seen = new Map<string, number>();
  while (result.visited < limit) {
    const seed = ctx.randomBytes(32);
    const r = await ctx.store.transaction(async (tx) => {
      const row = await takeDueRow(tx, now);
      if (!row) return null;
      const started = await handle(tx, ctx, executor, row, now, seed, allocations);
      return { row, started };
    }, { name: "reconcile" });
    if (!r) break;
    result.visited++;
    ctx.metrics.reconcileVisits.inc();
    const key = `${r.row.kind}:${r.row.ref}`;
    const visits = (seen.get(key) ?? 0) + 1;
    seen.set(key, visits);
    if (visits >= 3) break;
    if (r.started) result.started.push(r.started);
  }
  return result;
}

async function handle(tx: Tx, ctx: Ctx, executor: ReconcilerDeps["executor"], row: DueRow, now: number, seed: Uint8Array, allocations?: ReconcilerDeps["allocations"]): Promise<StartedOp | null> {
  switch (row.kind) {
    case "op":
      return executor.start(tx, row.ref, now);
    case "heartbeat":
      await onHeartbeatDue(tx, ctx, row.ref, now, seed);
      return null;
    case "claim":
      await onClaimDue(tx, ctx, row.ref, now);
      return null;
    case "fill":
      await onFillDue(tx, ctx, row.ref, now, seed);
      return null;
    case "ttl":
      await onTtlDue(tx, ctx, row.ref, now, seed);
      return null;
    case "retention":
      await onRetentionDue(tx, ctx, row.ref, now);
      return null;
    case "revoke":
      await clearDue(tx, "revoke", row.ref);
      if (await invalidateGrantsOfBorrower(tx, ctx, row.ref, now, nonceOf(seed))) tx.afterCommit(() => ctx.kick());
      return null;
    case "ack":
    case "grant":
      if (await handleGrantDueRow(tx, ctx, row.kind, row.ref, now, nonceOf(seed))) tx.afterCommit(() => ctx.kick());
      return null;
    case "alloc_expiry":
      await onAllocationExpiryDue(tx, ctx, row.ref, now);
      return null;
    case "alloc_launch":
    case "alloc_cleanup": {
      // Pushed to the lease end before the step runs: if this coordinator dies, the row comes due for another.
      const kind = row.kind;
      await setDue(tx, kind, row.ref, now + ctx.config.allocationActorLeaseMs);
      if (allocations) tx.afterCommit(() => allocations.drive(kind, row.ref));
      return null;
    }
    case "alloc_watch":
      if ((await onAllocationWatchDue(tx, ctx, row.ref, now)) && allocations) tx.afterCommit(() => allocations.drive("alloc_watch", row.ref));
      return null;
    case "alloc_restart":
      if ((await onAllocationRestartDue(tx, ctx, row.ref, now)) && allocations) tx.afterCommit(() => allocations.drive("alloc_restart", row.ref));
      return null;
    case "host_standing":
      // Pushed back before the push runs: if it fails (or this coordinator dies), the row comes due again.
      await setDue(tx, "host_standing", row.ref, now + STANDING_RETRY_MS);
      if (allocations) tx.afterCommit(() => allocations.drive("host_standing", row.ref));
      return null;
    default:
      // An unknown kind (a newer coordinator's) is left for it, pushed back so it does not block the index.
      await deferUnknownDue(tx, row, now + 60_000);
      return null;
  }
}

function nonceOf(seed: Uint8Array): string {
  return Buffer.from(seed.subarray(0, 8)).toString("hex");
}

async function onHeartbeatDue(tx: Tx, ctx: Ctx, borrowId: string, now: number, seed: Uint8Array): Promise<void> {
  const b = await lockBorrow(tx, borrowId);
  if (!b) return clearDue(tx, "heartbeat", borrowId);
  const d = liveDecision({ state: b.state, heartbeatDeadline: b.heartbeat_deadline, expiresAt: b.expires_at }, now);
  if (d.kind === "ended") return clearDue(tx, "heartbeat", borrowId);
  if (d.kind === "live") return setDue(tx, "heartbeat", borrowId, Math.min(b.heartbeat_deadline, b.expires_at));
  // Missed or expired: the borrow ends and its machine is quarantined, never made ready by time passing.
  const state = d.kind === "expired" ? "expired" : "abandoned";
  const reason = d.kind === "expired" ? "hard deadline reached" : "heartbeat deadline missed";
  await endBorrow(tx, b.id, state, reason, now);
  await clearDue(tx, "heartbeat", borrowId);
  await setDue(tx, "retention", `b:${b.id}`, now + ctx.config.retentionMs);
  tx.afterCommit(() => ctx.metrics.heartbeats.inc({ outcome: "missed" }));
  const m = await lockMachine(tx, b.machine_id);
  if (m && m.generation === b.generation && m.state === "busy") {
    tx.afterCommit(() => ctx.metrics.machineQuarantined(m, d.kind === "expired" ? "expired" : "abandoned", now));
    await applyTransition(tx, ctx, m, { kind: "quarantine", reason: `borrow ${b.id}: ${reason}` }, now, { subject: b.id, nonce: nonceOf(seed) });
    await setDueNoLater(tx, "fill", poolRef(m.org, m.pool), now);
  }
}

async function onClaimDue(tx: Tx, ctx: Ctx, claimId: string, now: number): Promise<void> {
  const c = await lockClaim(tx, claimId);
  await clearDue(tx, "claim", claimId);
  if (!c || c.state !== "open") return;
  if (now < c.expires_at) return setDue(tx, "claim", claimId, c.expires_at);
  await expireClaim(tx, claimId);
  await setDue(tx, "retention", `c:${claimId}`, now + ctx.config.retentionMs);
  tx.afterCommit(() => ctx.metrics.claims.inc({ pool: c.pool, event: "expired" }));
  await setDueNoLater(tx, "fill", poolRef(c.org, c.pool), now);
}

async function onFillDue(tx: Tx, ctx: Ctx, ref: string, now: number, seed: Uint8Array): Promise<void> {
  const i = ref.indexOf(":");
  const org = ref.slice(0, i);
  const name = ref.slice(i + 1);
  // Deleted before counting: on PostgreSQL the delete waits for the borrows
  // holding the row's KEY SHARE lock (requestFillCheck) to commit, so the
  // counts below include their machines; a borrow after the delete writes
  // the row anew. The row is set again below if the pool is still short.
  // (The delete is a held write: the lockPool read below sends it first.)
  await clearDue(tx, "fill", ref);
  const pool = await lockPool(tx, org, name);
  if (!pool) return;
  // Above maxReady (desired capacity lowered, or the pool drained): retire the
  // longest-ready machines beyond it. Claims already funding provisioning stay.
  const counts = await countCapacity(tx, org, name, now);
  const excess = Math.min(counts.ready, counts.ready + counts.lent + counts.cleanup - pool.maxReady);
  if (excess > 0) {
    const extra = await lockReadyMachines(tx, org, name, excess);
    for (const m of extra) await applyTransition(tx, ctx, m, { kind: "drain", reason: "above maxReady" }, now, { nonce: `${nonceOf(seed)}:${m.id}` });
    if (extra.length > 0) tx.afterCommit(() => ctx.kick());
  }
  const provider = ctx.providers.get(pool.provider);
  if (!provider?.capabilities.provision) {
    // An outside keeper fills its pool through ensure; nothing to issue here.
    return;
  }
  const r = await fillPool(tx, ctx, pool, now, seed);
  const after = await countCapacity(tx, org, name, now);
  if (r.pausedUntil) {
    // The provisioning breaker is open: look again when it closes, not before.
    await setDue(tx, "fill", ref, r.pausedUntil);
  } else if (fillDecision(pool, after).kind === "issue" || (r.why !== null && r.why.startsWith("no enrolled host"))) {
    // Still short (hosts full): look again later rather than spinning.
    await setDue(tx, "fill", ref, now + 5_000);
  }
}

async function onTtlDue(tx: Tx, ctx: Ctx, machineId: string, now: number, seed: Uint8Array): Promise<void> {
  const m = await lockMachine(tx, machineId);
  if (!m) return clearDue(tx, "ttl", machineId);
  const pool = await lockPool(tx, m.org, m.pool);
  const margin = rotationMarginMs(pool?.hardTtlMs ?? 0);
  if (now < m.hard_expires_at - margin) return setDue(tx, "ttl", machineId, m.hard_expires_at - margin);
  if (m.state === "ready") {
    tx.afterCommit(() => ctx.metrics.ttlRotations.inc({ pool: m.pool }));
    await applyTransition(tx, ctx, m, { kind: "drain", reason: "hard TTL rotation" }, now, { nonce: nonceOf(seed) });
    // Replacement capacity: the drained machine no longer counts, so the pool can fill within maxReady.
    await setDueNoLater(tx, "fill", poolRef(m.org, m.pool), now);
    return clearDue(tx, "ttl", machineId);
  }
  if (m.state === "destroyed" || m.state === "destroying" || m.state === "draining" || m.state === "quarantined") return clearDue(tx, "ttl", machineId);
  // Lent or in cleanup: the borrow's own deadline (capped at the hard TTL) ends it; look again soon.
  await setDue(tx, "ttl", machineId, now + 10_000);
}

async function onRetentionDue(tx: Tx, ctx: Ctx, ref: string, now: number): Promise<void> {
  await clearDue(tx, "retention", ref);
  const kind = ref.slice(0, 2);
  const id = ref.slice(2);
  if (kind === "b:") {
    const n = await deleteEndedBorrow(tx, id, now - ctx.config.retentionMs);
    if (n) tx.afterCommit(() => ctx.metrics.pruned.inc({ kind: "borrow" }));
  } else if (kind === "g:") {
    // A closed grant's cleanup is proven (scrubbed, or its machine destroyed): only a display record is left.
    const n = await deleteClosedGrant(tx, id, now - ctx.config.retentionMs);
    if (n) tx.afterCommit(() => ctx.metrics.pruned.inc({ kind: "grant" }));
  } else if (kind === "c:") {
    const n = await deleteExpiredClaim(tx, id);
    if (n) tx.afterCommit(() => ctx.metrics.pruned.inc({ kind: "claim" }));
  } else if (kind === "m:") {
    // Only a destroyed machine with no unfinished operation is pruned: never the only record of a resource that may still exist.
    const m = await lockMachine(tx, id);
    if (!m || m.state !== "destroyed") return;
    if ((await countOpenOps(tx, id)) > 0) return setDue(tx, "retention", ref, now + ctx.config.retentionMs);
    await deleteOpsOfMachine(tx, id);
    await deleteMachine(tx, id);
    await audit(tx, { at: now, machineId: id, subject: null, event: "pruned", from: "destroyed", to: "pruned", generation: m.generation, actor: ctx.actor });
    tx.afterCommit(() => ctx.metrics.pruned.inc({ kind: "machine" }));
  }
}
