/**
 * Portable access, what the coordinator does to a grant on its own: the
 * borrower's calls are grant-borrow.ts (the borrow) and grant-calls.ts (ack,
 * heartbeat, return, show).
 *
 *   way out: return, expiry, ack timeout, missed heartbeat, drain, token
 *     revocation or failed revalidation durably invalidate the grant first
 *     (`invalidateGrant`); then remove-key, fence and scrub run as separate
 *     proven operations, and only then is the machine ready. A crash
 *     anywhere resumes from the operation rows and due index.
 *   proofs: the executor's install and cleanup outcomes keep the grant in
 *     step (`grantHooks`).
 *   deadlines: the ack and grant due rows (`handleGrantDueRow`).
 *
 * A late or duplicated install completion never activates anything: the
 * completion transaction requires the grant to still be `installing` at the
 * op's generation.
 */
import { afterInvalidation, isExpired, type InvalidationReason } from "../../core/grant.js";
import type { Tx } from "../../store/store.js";
import { audit } from "../../store/audit.js";
import { clearDue, poolRef, setDue, setDueNoLater } from "../../store/due.js";
import { activateGrant, advanceGrantCleanup, closeGrantsOfMachineRows, invalidateGrantRow, lockGrant, lockGrantAt, lockLiveGrantsOfBorrower, type GrantRow } from "../../store/grants.js";
import { lockMachine, type MachineRow } from "../../store/machines.js";
import { firstRemovalAt, type OpRow } from "../../store/operations.js";
import type { RemoveKeyArgs } from "../../protocol/operations.js";
import type { Ctx } from "../context.js";
import { applyTransition } from "./transition.js";

/**
 * Invalidates a grant durably and starts its machine's way out. Runs inside
 * the caller's transaction. Returns whether provider work was queued.
 */
export async function invalidateGrant(tx: Tx, ctx: Ctx, g: GrantRow, reason: InvalidationReason, now: number, nonce: string): Promise<boolean> {
  if (g.state !== "pending" && g.state !== "installing" && g.state !== "active") return false;
  await invalidateGrantRow(tx, g.id, reason, now);
  await clearDue(tx, "ack", g.id);
  await clearDue(tx, "grant", g.id);
  tx.afterCommit(() => ctx.metrics.grants.inc({ pool: g.pool, event: reason === "expired" || reason === "ack_timeout" ? "expired" : reason === "token_revoked" ? "revoked" : "invalidated" }));
  const m = await lockMachine(tx, g.machine_id);
  if (!m || m.generation !== g.generation || !["reserved", "installing", "busy"].includes(m.state)) return false;
  const next = afterInvalidation(reason);
  if (next === "cleanup") {
    const r = await applyTransition(tx, ctx, m, { kind: "return", mode: "portable", scrub: true }, now, { subject: g.id, nonce, opArgs: { grantId: g.id, fingerprint: g.fingerprint } satisfies RemoveKeyArgs });
    return r.opIds.length > 0;
  }
  tx.afterCommit(() => ctx.metrics.machineQuarantined(m, reason, now));
  const r = await applyTransition(tx, ctx, m, { kind: "quarantine", reason: `grant ${g.id}: ${reason}` }, now, { subject: g.id, nonce });
  await setDueNoLater(tx, "fill", poolRef(m.org, m.pool), now);
  return r.opIds.length > 0;
}

/** Called by the executor when a machine's cleanup step is proven (keeps the grant's state in step). */
export async function onCleanupStep(tx: Tx, ctx: Ctx, machineId: string, generation: number, step: "revoked" | "fenced" | "closed", now: number): Promise<void> {
  const from = step === "revoked" ? "invalidated" : step === "fenced" ? "revoked" : "fenced";
  const ids = await advanceGrantCleanup(tx, machineId, generation, from, step, now);
  if (step === "closed") for (const id of ids) await setDue(tx, "retention", `g:${id}`, now + ctx.config.retentionMs);
}

/** Closes every unclosed grant of a destroyed machine; closed grants age out after the retention window. */
export async function closeGrantsOfMachine(tx: Tx, ctx: Ctx, machineId: string, now: number): Promise<void> {
  const ids = await closeGrantsOfMachineRows(tx, machineId, now);
  for (const id of ids) await setDue(tx, "retention", `g:${id}`, now + ctx.config.retentionMs);
}

/**
 * The install_key completion: publish `active` only if the grant is still
 * installing at exactly the op's generation and unexpired. Anything else is
 * a late completion: audited, nothing activated (the invalidation already
 * queued the key's removal, and the agent refuses an install for a
 * generation it has already cleaned).
 */
/** Resolves to true when the grant became active (nothing else follows), false when cleanup was set in motion. */
export async function onInstallConfirmed(tx: Tx, ctx: Ctx, op: OpRow, m: MachineRow, now: number, nonce: string): Promise<boolean> {
  const g = await lockGrantAt(tx, m.id, op.generation);
  if (!g || g.state !== "installing" || m.state !== "installing" || m.generation !== op.generation) {
    await audit(tx, { at: now, machineId: m.id, subject: op.id, event: "late_install", from: m.state, to: m.state, generation: m.generation, actor: ctx.actor });
    await quarantineIfKeyMayOutliveRemoval(tx, ctx, op, m, now, nonce);
    return false;
  }
  if (isExpired(g.expires_at, now)) {
    await invalidateGrant(tx, ctx, g, "expired", now, nonce);
    return false;
  }
  if (g.resource_id !== m.resource_id) {
    await invalidateGrant(tx, ctx, g, "identity_drift", now, nonce);
    return false;
  }
  await applyTransition(tx, ctx, m, { kind: "install_confirmed" }, now, { subject: g.id, nonce });
  await activateGrant(tx, g.id, now);
  await setDue(tx, "grant", g.id, Math.min(g.heartbeat_deadline, g.expires_at));
  tx.afterCommit(() => ctx.metrics.grants.inc({ pool: g.pool, event: "active" }));
  return true;
}

/**
 * A late install the provider reports done, for the machine's current
 * generation, after the grant was invalidated. If the key's removal is still
 * to run, it will remove this key too. If the removal already ran (or the
 * machine moved past it), the provider may have installed the key after
 * removing it: that is doubt, and doubt quarantines (the machine is
 * destroyed, never lent with a stray key). Older generations are the
 * provider's to refuse (generation precondition).
 */
async function quarantineIfKeyMayOutliveRemoval(tx: Tx, ctx: Ctx, op: OpRow, m: MachineRow, now: number, nonce: string): Promise<void> {
  if (m.generation !== op.generation) return;
  if (m.state === "quarantined" || m.state === "draining" || m.state === "destroying" || m.state === "destroyed") return;
  const removal = await firstRemovalAt(tx, m.id, op.generation);
  if (m.state === "revoking" && removal && removal.state === "pending" && removal.attempts === 0) return;
  if (m.state === "reserved" || m.state === "installing" || m.state === "busy") return;
  tx.afterCommit(() => ctx.metrics.machineQuarantined(m, "late_install", now));
  await applyTransition(tx, ctx, m, { kind: "quarantine", reason: `install of operation ${op.id} completed after the grant was invalidated` }, now, { subject: op.id, nonce });
  await setDueNoLater(tx, "fill", poolRef(m.org, m.pool), now);
}

/** Counts a portable cleanup step that could not be proven (the executor quarantines the machine). */
export function onCleanupFailed(tx: Tx, ctx: Ctx, m: MachineRow, kind: string): void {
  if (m.access !== "portable") return;
  if (kind === "remove_key") tx.afterCommit(() => ctx.metrics.grants.inc({ pool: m.pool, event: "revoke_failed" }));
  if (kind === "fence") tx.afterCommit(() => ctx.metrics.grants.inc({ pool: m.pool, event: "fence_failed" }));
}

/** A failed or unprovable install: the grant is invalidated and the machine quarantined. */
export async function onInstallFailed(tx: Tx, ctx: Ctx, op: OpRow, m: MachineRow, now: number, nonce: string, error = ""): Promise<void> {
  const g = await lockGrantAt(tx, m.id, op.generation);
  // The provider found the machine's resource gone (terminated or stopped outside berth): the borrow says so.
  if (g) await invalidateGrant(tx, ctx, g, error.startsWith("machine_lost:") ? "machine_lost" : "revalidation_failed", now, nonce);
}

export async function handleGrantDueRow(tx: Tx, ctx: Ctx, kind: "ack" | "grant", grantId: string, now: number, nonce: string): Promise<boolean> {
  const g = await lockGrant(tx, grantId);
  if (!g) {
    await clearDue(tx, kind, grantId);
    return false;
  }
  if (kind === "ack") {
    await clearDue(tx, "ack", grantId);
    if (g.state === "pending" && now >= g.ack_deadline) return invalidateGrant(tx, ctx, g, isExpired(g.expires_at, now) ? "expired" : "ack_timeout", now, nonce);
    if (g.state === "pending") await setDue(tx, "ack", grantId, g.ack_deadline);
    return false;
  }
  if (g.state !== "active" && g.state !== "installing" && g.state !== "pending") {
    await clearDue(tx, "grant", grantId);
    return false;
  }
  if (isExpired(g.expires_at, now)) return invalidateGrant(tx, ctx, g, "expired", now, nonce);
  if (g.state === "active" && now >= g.heartbeat_deadline) return invalidateGrant(tx, ctx, g, "heartbeat_missed", now, nonce);
  await setDue(tx, "grant", grantId, g.state === "active" ? Math.min(g.heartbeat_deadline, g.expires_at) : g.expires_at);
  return false;
}

/** Token revocation: every live grant of the revoked token is invalidated in the same transaction. */
export async function invalidateGrantsOfBorrower(tx: Tx, ctx: Ctx, tokenId: string, now: number, nonce: string): Promise<number> {
  const live = await lockLiveGrantsOfBorrower(tx, tokenId);
  for (const g of live) await invalidateGrant(tx, ctx, g, "token_revoked", now, `${nonce}:${g.id}`);
  return live.length;
}

/** The grant steps the operation executor's proofs drive, bound to `ctx` (wired in server.ts). */
export function grantHooks(ctx: Ctx) {
  return {
    installConfirmed: (tx: Tx, op: OpRow, m: MachineRow, now: number, nonce: string) => onInstallConfirmed(tx, ctx, op, m, now, nonce),
    installFailed: (tx: Tx, op: OpRow, m: MachineRow, now: number, nonce: string, error: string) => onInstallFailed(tx, ctx, op, m, now, nonce, error),
    cleanupStep: (tx: Tx, machineId: string, generation: number, step: "revoked" | "fenced" | "closed", now: number) => onCleanupStep(tx, ctx, machineId, generation, step, now),
    cleanupFailed: (tx: Tx, m: MachineRow, kind: string) => onCleanupFailed(tx, ctx, m, kind),
    machineDestroyed: (tx: Tx, machineId: string, now: number) => closeGrantsOfMachine(tx, ctx, machineId, now),
  };
}
