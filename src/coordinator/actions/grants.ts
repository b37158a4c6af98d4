/**
 * Portable access: bounded borrows with per-borrow keys and two-phase
 * acknowledgement.
 *
 *   borrow (one transaction; grant-borrow.ts): reserve the longest-waiting
 *     eligible ready machine, advance its generation, persist a pending grant
 *     with hashes, an ack deadline and the immutable expiry. No key is
 *     installed.
 *   ack: (1) one transaction re-checks everything (fresh authorization,
 *     hashes, key, generation, deadlines), persists install intent (the
 *     install_key operation row) and marks it running; (2) the provider call,
 *     outside any transaction, carrying op id and generation; (3) one
 *     transaction revalidates and publishes `active` only for exactly that
 *     generation and only while now < expiresAt.
 *   way out: return, expiry, ack timeout, missed heartbeat, drain, token
 *     revocation or failed revalidation durably invalidate the grant first;
 *     then remove-key, fence and scrub run as separate proven operations, and
 *     only then is the machine ready. A crash anywhere resumes from the
 *     operation rows and due index.
 *
 * A late or duplicated install completion never activates anything: the
 * completion transaction requires the grant to still be `installing` at the
 * op's generation.
 */
import { BerthError } from "../../core/errors.js";
import { hashToken, sameHash } from "../../core/tokens.js";
import { ackDecision, afterInvalidation, isExpired, type InvalidationReason } from "../../core/grant.js";
import { parsePublicKey } from "../../core/ssh-public-key.js";
import type { Tx } from "../../store/store.js";
import { audit } from "../../store/audit.js";
import { clearDue, poolRef, setDue, setDueNoLater } from "../../store/due.js";
import {
  activateGrant,
  advanceGrantCleanup,
  closeGrantsOfMachineRows,
  invalidateGrantRow,
  lockGrant,
  lockGrantAt,
  lockLiveGrantsOfBorrower,
  markGrantInstalling,
  readGrant,
  setGrantHeartbeat,
  type GrantRow,
} from "../../store/grants.js";
import { lockMachine, readMachine, type MachineRow } from "../../store/machines.js";
import { firstRemovalAt, leaseOp, type OpRow } from "../../store/operations.js";
import { readPool } from "../../store/pools.js";
import type { InstallKeyArgs, RemoveKeyArgs } from "../../protocol/operations.js";
import type { Ctx } from "../context.js";
import type { Principal } from "../auth.js";
import { applyTransition } from "./transition.js";
import { borrowPortable } from "./grant-borrow.js";
import type { PortableApi } from "./portable-api.js";

/** What the portable API needs from the rest of the coordinator (wired in server.ts). */
export interface PortableDeps {
  /** Carries out an operation this code leased itself (the ack's install), outside any transaction. */
  runLeased<T>(started: { op: OpRow; machine: MachineRow }, read: (tx: Tx) => Promise<T>): Promise<T | undefined>;
}

function presentGrant(g: GrantRow, m: MachineRow | undefined) {
  return {
    id: g.id,
    access: "portable",
    pool: g.pool,
    state: g.state,
    reason: g.reason,
    generation: g.generation,
    fingerprint: g.fingerprint,
    createdAt: g.created_at,
    ackDeadline: g.ack_deadline,
    heartbeatDeadline: g.heartbeat_deadline,
    expiresAt: g.expires_at,
    activatedAt: g.activated_at,
    endedAt: g.ended_at,
    machine: m
      ? { id: m.id, state: m.state, generation: m.generation, ssh: { host: m.ssh_host, port: m.ssh_port, user: m.ssh_user, hostKey: m.host_key } }
      : { id: g.machine_id, state: "pruned" },
    cleanup: cleanupStatus(g, m),
  };
}

/** A borrow as its borrower's organisation sees it. */
async function grantView(tx: Tx, p: Principal, grantId: string): Promise<ReturnType<typeof presentGrant>> {
  const g = await readGrant(tx, grantId);
  if (!g || g.org !== p.org) throw new BerthError("not_found", `not_found: no borrow ${grantId} in this organisation`);
  return presentGrant(g, await readMachine(tx, g.machine_id));
}

function cleanupStatus(g: GrantRow, m: MachineRow | undefined): string {
  if (g.state === "pending" || g.state === "installing" || g.state === "active") return "none";
  if (g.state === "closed") return m && m.generation === g.generation && m.state === "destroyed" ? "machine destroyed" : "done";
  if (!m) return "done";
  if (m.state === "quarantined" || m.state === "destroying" || m.state === "draining") return `machine ${m.state}`;
  return `in progress (${g.state})`;
}

async function loadGrant(tx: Tx, p: Principal, grantId: string, token: string, grantToken?: string): Promise<GrantRow> {
  const g = await lockGrant(tx, grantId);
  if (!g || g.org !== p.org) throw new BerthError("not_found", `not_found: no borrow ${grantId} in this organisation`);
  if (!sameHash(g.token_hash, hashToken("borrow", token))) throw new BerthError("token_mismatch", `token_mismatch: the borrow token does not match borrow ${grantId}`);
  if (grantToken !== undefined && !sameHash(g.grant_token_hash, hashToken("grant", grantToken))) {
    throw new BerthError("token_mismatch", `token_mismatch: the grant token does not match borrow ${grantId}`);
  }
  return g;
}

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

export function createPortable(ctx: Ctx, deps: PortableDeps): PortableApi {
  return {
    borrow: (p, poolName, body, chosen) => borrowPortable(ctx, p, poolName, body, chosen),

    async ack(p, grantId, body) {
      const key = parsePublicKey(body.publicKey);
      const now = ctx.now();
      const first = await ctx.store.transaction(async (tx) => {
        const g = await loadGrant(tx, p, grantId, body.token, body.grantToken);
        const m = await lockMachine(tx, g.machine_id);
        const d = ackDecision({
          grant: { state: g.state, ackDeadline: g.ack_deadline, expiresAt: g.expires_at, fingerprint: g.fingerprint, generation: g.generation, borrower: g.borrower, org: g.org },
          machine: m ? { state: m.state, generation: m.generation } : null,
          principal: p,
          fingerprint: key.fingerprint,
          now,
        });
        if (d.kind === "replay") return { kind: "replay" as const };
        if (d.kind === "refuse") {
          // An ack that finds the grant unusable leaves it to the reconciler's deadlines; authorization
          // that no longer covers the grant invalidates it now.
          if (d.code === "forbidden" && g.state === "pending" && p.tokenId === g.borrower) {
            await invalidateGrant(tx, ctx, g, "revalidation_failed", now, `${g.id}:ack`);
            return { kind: "refuse" as const, code: d.code, why: d.why, invalidated: true };
          }
          return { kind: "refuse" as const, code: d.code, why: d.why, invalidated: false };
        }
        // Install intent is durable before the provider is called: a crash from here on resumes
        // from this operation row, and a retry carries the same op id (no blind second install).
        const applied = await applyTransition(tx, ctx, m!, { kind: "install_started" }, now, {
          subject: g.id,
          nonce: g.id,
          opArgs: { publicKey: g.public_key, mode: "grant", grantId: g.id, expiresAt: g.expires_at } satisfies InstallKeyArgs,
        });
        await markGrantInstalling(tx, g.id);
        tx.afterCommit(() => ctx.metrics.grants.inc({ pool: g.pool, event: "acked" }));
        const opId = applied.opIds[0]!;
        // Lease the op here so the reconciler leaves it to this request.
        const op = await leaseOp(tx, opId, now);
        return { kind: "install" as const, started: { op, machine: applied.machine } };
      });
      if (first.kind === "refuse") {
        if (first.invalidated) ctx.kick();
        throw new BerthError(first.code, `${first.code}: borrow ${grantId}: ${first.why}`);
      }
      if (first.kind === "install") {
        // The answer is read in the transaction that records the install's outcome. Access is
        // never answered active at or after the grant's expiry: a grant found so (the install
        // took that long) is invalidated here, as the reconciler would at its deadline.
        let expired = false;
        const view = await deps.runLeased(first.started, async (tx) => {
          const g = await lockGrant(tx, grantId);
          const at = ctx.now();
          if (!g || g.org !== p.org || g.state !== "active" || !isExpired(g.expires_at, at)) return g && g.org === p.org ? presentGrant(g, await readMachine(tx, g.machine_id)) : grantView(tx, p, grantId);
          expired = await invalidateGrant(tx, ctx, g, "expired", at, `${g.id}:ack-expired`);
          return grantView(tx, p, grantId);
        });
        if (expired) ctx.kick();
        if (view) return view;
      }
      return this.show(p, grantId);
    },

    async heartbeat(p, grantId, body) {
      const now = ctx.now();
      const r = await ctx.store.transaction(async (tx) => {
        const g = await loadGrant(tx, p, grantId, body.token, body.grantToken);
        if (g.state !== "active" && g.state !== "installing" && g.state !== "pending") {
          throw new BerthError("borrow_not_active", `borrow_not_active: borrow ${g.id} is ${g.state}${g.reason ? ` (${g.reason})` : ""}; borrow again`);
        }
        if (isExpired(g.expires_at, now)) throw new BerthError("grant_expired", `grant_expired: the grant for borrow ${g.id} expired at ${new Date(g.expires_at).toISOString()}; borrow again`);
        if (g.state === "active" && now >= g.heartbeat_deadline) {
          throw new BerthError("borrow_expired", `borrow_expired: borrow ${g.id} missed its heartbeat deadline and is being quarantined; borrow again`);
        }
        const pool = await readPool(tx, g.org, g.pool);
        // A heartbeat proves liveness only: expiresAt is never touched.
        const deadline = Math.min(now + (pool?.heartbeatMs ?? 60_000), g.expires_at);
        await setGrantHeartbeat(tx, g.id, deadline);
        if (g.state === "active") await setDue(tx, "grant", g.id, Math.min(deadline, g.expires_at));
        return { heartbeatDeadline: deadline, expiresAt: g.expires_at, state: g.state };
      });
      ctx.metrics.heartbeats.inc({ outcome: "ok" });
      return r;
    },

    async return(p, grantId, body) {
      const now = ctx.now();
      const work = await ctx.store.transaction(async (tx) => {
        const g = await loadGrant(tx, p, grantId, body.token, body.grantToken);
        if (g.state !== "pending" && g.state !== "installing" && g.state !== "active") {
          // Already on its way out (expired, revoked…): returning again is answered with where it stands.
          return false;
        }
        tx.afterCommit(() => ctx.metrics.history.returned(g.org, g.pool, now));
        return invalidateGrant(tx, ctx, g, body.disposition === "drain" ? "drained" : "returned", now, `${g.id}:return`);
      });
      if (work) ctx.kick();
      return this.show(p, grantId);
    },

    async show(p, grantId) {
      return ctx.store.transaction((tx) => grantView(tx, p, grantId));
    },
  };
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
