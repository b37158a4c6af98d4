/**
 * Portable access: bounded borrows with per-borrow keys and two-phase
 * acknowledgement.
 *
 *   borrow (one transaction): reserve the longest-waiting eligible ready
 *     machine, advance its generation, persist a pending grant with hashes,
 *     an ack deadline and the immutable expiry. No key is installed.
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
import { newId } from "../../core/ids.js";
import { hashToken, newToken, sameHash } from "../../core/tokens.js";
import { ackDecision, afterInvalidation, grantExpiresAt, isExpired, type GrantState, type InvalidationReason } from "../../core/grant.js";
import { parsePublicKey } from "../../core/ssh-public-key.js";
import type { Tx } from "../../store/store.js";
import { audit, clearDue, poolRef, setDue, setDueNoLater, type MachineRow } from "../../store/rows.js";
import type { Ctx } from "../context.js";
import type { Principal } from "../auth.js";
import { readPool, takeReadyMachine } from "./pool-read.js";
import { applyTransition } from "./transition.js";
import { checkPortable } from "./pools.js";
import { executeOp, type OpRow, type StartedOp } from "../executor.js";
import type { PortableApi } from "./portable-api.js";

export interface GrantRow {
  id: string;
  org: string;
  pool: string;
  machine_id: string;
  resource_id: string;
  borrower: string;
  token_hash: string;
  grant_token_hash: string;
  generation: number;
  fingerprint: string;
  public_key: string;
  state: GrantState;
  reason: string | null;
  created_at: number;
  ack_deadline: number;
  heartbeat_deadline: number;
  expires_at: number;
  activated_at: number | null;
  ended_at: number | null;
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

function cleanupStatus(g: GrantRow, m: MachineRow | undefined): string {
  if (g.state === "pending" || g.state === "installing" || g.state === "active") return "none";
  if (g.state === "closed") return m && m.generation === g.generation && m.state === "destroyed" ? "machine destroyed" : "done";
  if (!m) return "done";
  if (m.state === "quarantined" || m.state === "destroying" || m.state === "draining") return `machine ${m.state}`;
  return `in progress (${g.state})`;
}

async function loadGrant(tx: Tx, p: Principal, grantId: string, token: string, grantToken?: string): Promise<GrantRow> {
  const g = await tx.get<GrantRow>(`SELECT * FROM grants WHERE id = ?${tx.forUpdate}`, [grantId]);
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
  await tx.run("UPDATE grants SET state = 'invalidated', reason = ?, ended_at = ? WHERE id = ?", [reason, now, g.id]);
  await clearDue(tx, "ack", g.id);
  await clearDue(tx, "grant", g.id);
  tx.afterCommit(() => ctx.metrics.grants.inc({ pool: g.pool, event: reason === "expired" || reason === "ack_timeout" ? "expired" : reason === "token_revoked" ? "revoked" : "invalidated" }));
  const m = await tx.get<MachineRow>(`SELECT * FROM machines WHERE id = ?${tx.forUpdate}`, [g.machine_id]);
  if (!m || m.generation !== g.generation || !["reserved", "installing", "busy"].includes(m.state)) return false;
  const next = afterInvalidation(reason);
  if (next === "cleanup") {
    const r = await applyTransition(tx, ctx, m, { kind: "return", mode: "portable", scrub: true }, now, { subject: g.id, nonce, opArgs: { grantId: g.id, fingerprint: g.fingerprint } });
    return r.opIds.length > 0;
  }
  tx.afterCommit(() => ctx.metrics.quarantined.inc({ pool: m.pool, reason }));
  const r = await applyTransition(tx, ctx, m, { kind: "quarantine", reason: `grant ${g.id}: ${reason}` }, now, { subject: g.id, nonce });
  await setDueNoLater(tx, "fill", poolRef(m.org, m.pool), now);
  return r.opIds.length > 0;
}

/** Called by the executor when a machine's cleanup step is proven (keeps the grant's state in step). */
export async function onCleanupStep(tx: Tx, ctx: Ctx, machineId: string, generation: number, step: "revoked" | "fenced" | "closed", now: number): Promise<void> {
  const from = step === "revoked" ? "invalidated" : step === "fenced" ? "revoked" : "fenced";
  const ids = await tx.all<{ id: string }>("SELECT id FROM grants WHERE machine_id = ? AND generation = ? AND state = ?", [machineId, generation, from]);
  await tx.run(`UPDATE grants SET state = ?, ended_at = COALESCE(ended_at, ?) WHERE machine_id = ? AND generation = ? AND state = ?`, [step, now, machineId, generation, from]);
  if (step === "closed") for (const g of ids) await setDue(tx, "retention", `g:${g.id}`, now + ctx.config.retentionMs);
}

/** Closes every unclosed grant of a destroyed machine; closed grants age out after the retention window. */
export async function closeGrantsOfMachine(tx: Tx, ctx: Ctx, machineId: string, now: number): Promise<void> {
  const ids = await tx.all<{ id: string }>("SELECT id FROM grants WHERE machine_id = ? AND state <> 'closed'", [machineId]);
  await tx.run("UPDATE grants SET state = 'closed', ended_at = COALESCE(ended_at, ?) WHERE machine_id = ? AND state <> 'closed'", [now, machineId]);
  for (const g of ids) await setDue(tx, "retention", `g:${g.id}`, now + ctx.config.retentionMs);
}

/**
 * The install_key completion: publish `active` only if the grant is still
 * installing at exactly the op's generation and unexpired. Anything else is
 * a late completion: audited, nothing activated (the invalidation already
 * queued the key's removal, and the agent refuses an install for a
 * generation it has already cleaned).
 */
export async function onInstallConfirmed(tx: Tx, ctx: Ctx, op: OpRow, m: MachineRow, now: number, nonce: string): Promise<void> {
  const g = await tx.get<GrantRow>(`SELECT * FROM grants WHERE machine_id = ? AND generation = ?${tx.forUpdate}`, [m.id, op.generation]);
  if (!g || g.state !== "installing" || m.state !== "installing" || m.generation !== op.generation) {
    await audit(tx, { at: now, machineId: m.id, subject: op.id, event: "late_install", from: m.state, to: m.state, generation: m.generation, actor: ctx.actor });
    await quarantineIfKeyMayOutliveRemoval(tx, ctx, op, m, now, nonce);
    return;
  }
  if (isExpired(g.expires_at, now)) {
    await invalidateGrant(tx, ctx, g, "expired", now, nonce);
    return;
  }
  if (g.resource_id !== m.resource_id) {
    await invalidateGrant(tx, ctx, g, "identity_drift", now, nonce);
    return;
  }
  await applyTransition(tx, ctx, m, { kind: "install_confirmed" }, now, { subject: g.id, nonce });
  await tx.run("UPDATE grants SET state = 'active', activated_at = ? WHERE id = ?", [now, g.id]);
  await setDue(tx, "grant", g.id, Math.min(g.heartbeat_deadline, g.expires_at));
  tx.afterCommit(() => ctx.metrics.grants.inc({ pool: g.pool, event: "active" }));
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
  const removal = await tx.get<{ attempts: number; state: string }>("SELECT attempts, state FROM operations WHERE machine_id = ? AND generation = ? AND kind = 'remove_key' ORDER BY created_at LIMIT 1", [m.id, op.generation]);
  if (m.state === "revoking" && removal && removal.state === "pending" && removal.attempts === 0) return;
  if (m.state === "reserved" || m.state === "installing" || m.state === "busy") return;
  tx.afterCommit(() => ctx.metrics.quarantined.inc({ pool: m.pool, reason: "late_install" }));
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
export async function onInstallFailed(tx: Tx, ctx: Ctx, op: OpRow, m: MachineRow, now: number, nonce: string): Promise<void> {
  const g = await tx.get<GrantRow>(`SELECT * FROM grants WHERE machine_id = ? AND generation = ?${tx.forUpdate}`, [m.id, op.generation]);
  if (g) await invalidateGrant(tx, ctx, g, "revalidation_failed", now, nonce);
}

export async function handleGrantDueRow(tx: Tx, ctx: Ctx, kind: "ack" | "grant", grantId: string, now: number, nonce: string): Promise<boolean> {
  const g = await tx.get<GrantRow>(`SELECT * FROM grants WHERE id = ?${tx.forUpdate}`, [grantId]);
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
  const live = await tx.all<GrantRow>(`SELECT * FROM grants WHERE borrower = ? AND state IN ('pending','installing','active')${tx.forUpdate}`, [tokenId]);
  for (const g of live) await invalidateGrant(tx, ctx, g, "token_revoked", now, `${nonce}:${g.id}`);
  return live.length;
}

export function createPortable(ctx: Ctx): PortableApi {
  return {
    async borrow(p, poolName, body) {
      const started = process.hrtime.bigint();
      if (body.publicKey === undefined) throw new BerthError("invalid_request", "invalid_request: field publicKey: a portable borrow needs the client's ephemeral public key");
      const key = parsePublicKey(body.publicKey);
      if (key.type !== "ssh-ed25519") throw new BerthError("invalid_request", "invalid_request: field publicKey: portable borrows use Ed25519 keys");
      const now = ctx.now();
      const grantId = newId("g", ctx.randomBytes);
      const token = newToken("borrow", ctx.randomBytes);
      const grantToken = newToken("grant", ctx.randomBytes);
      const out = await ctx.store.transaction(async (tx) => {
        const pool = await readPool(tx, p.org, poolName);
        if (!pool) throw new BerthError("not_found", `not_found: no pool named ${poolName} in this organisation`);
        if (pool.access !== "portable") throw new BerthError("namespace_conflict", `namespace_conflict: pool ${poolName} is a ${pool.access} pool; portable access is refused (no fallback)`);
        checkPortable(ctx, pool.provider);
        // Not near hard TTL: the machine must outlive the longest grant we could issue on it.
        const m = await takeReadyMachine(tx, pool, "portable", now);
        if (!m) {
          await setDueNoLater(tx, "fill", poolRef(p.org, poolName), now);
          return null;
        }
        const expiresAt = grantExpiresAt({ now, requestedMs: body.durationMs ?? null, maxMs: ctx.config.maxBorrowMs, machineHardExpiresAt: m.hard_expires_at, authorizationExpiresAt: p.expiresAt });
        const ackDeadline = Math.min(now + ctx.config.ackTimeoutMs, expiresAt);
        const heartbeatDeadline = Math.min(now + pool.heartbeatMs, expiresAt);
        const applied = await applyTransition(tx, ctx, m, { kind: "reserve", mode: "portable" }, now, { subject: grantId, lentTo: grantId, nonce: grantId });
        await tx.run(
          `INSERT INTO grants (id, org, pool, machine_id, resource_id, borrower, token_hash, grant_token_hash, generation, fingerprint, public_key, state, reason, created_at, ack_deadline, heartbeat_deadline, expires_at, activated_at, ended_at)
           VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', NULL, ?, ?, ?, ?, NULL, NULL)`,
          [grantId, p.org, poolName, m.id, m.resource_id, p.tokenId, hashToken("borrow", token), hashToken("grant", grantToken), applied.machine.generation, key.fingerprint, key.line, now, ackDeadline, heartbeatDeadline, expiresAt],
        );
        await setDue(tx, "ack", grantId, ackDeadline);
        await setDue(tx, "grant", grantId, expiresAt);
        await setDueNoLater(tx, "fill", poolRef(p.org, poolName), now);
        return { machine: applied.machine, readySince: m.ready_since, expiresAt, ackDeadline, heartbeatDeadline, heartbeatMs: pool.heartbeatMs };
      });
      ctx.kick();
      if (!out) {
        ctx.metrics.warm.inc({ pool: poolName, result: "miss" });
        ctx.metrics.borrowRequests.inc({ pool: poolName, access: "portable", outcome: "exhausted" });
        throw new BerthError("pool_exhausted", `pool_exhausted: pool ${poolName} has no ready machine right now; try again shortly (the pool is being refilled)`);
      }
      ctx.metrics.warm.inc({ pool: poolName, result: "hit" });
      ctx.metrics.borrowRequests.inc({ pool: poolName, access: "portable", outcome: "ok" });
      ctx.metrics.grants.inc({ pool: poolName, event: "issued" });
      if (out.readySince !== null) ctx.metrics.readyAge.observe(Math.max(0, now - out.readySince) / 1000);
      ctx.metrics.borrowLatency.observe({ access: "portable" }, Number(process.hrtime.bigint() - started) / 1e9);
      const m = out.machine;
      return {
        borrowId: grantId,
        borrowToken: token,
        grantToken,
        access: "portable",
        state: "pending",
        pool: poolName,
        generation: m.generation,
        fingerprint: key.fingerprint,
        ackDeadline: out.ackDeadline,
        heartbeatMs: out.heartbeatMs,
        heartbeatDeadline: out.heartbeatDeadline,
        expiresAt: out.expiresAt,
        machine: { id: m.id, generation: m.generation, ssh: { host: m.ssh_host, port: m.ssh_port, user: m.ssh_user, hostKey: m.host_key } },
      };
    },

    async ack(p, grantId, body) {
      const key = parsePublicKey(body.publicKey);
      const now = ctx.now();
      const first = await ctx.store.transaction(async (tx) => {
        const g = await loadGrant(tx, p, grantId, body.token, body.grantToken);
        const m = await tx.get<MachineRow>(`SELECT * FROM machines WHERE id = ?${tx.forUpdate}`, [g.machine_id]);
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
          opArgs: { publicKey: g.public_key, mode: "grant", grantId: g.id, expiresAt: g.expires_at },
        });
        await tx.run("UPDATE grants SET state = 'installing' WHERE id = ?", [g.id]);
        tx.afterCommit(() => ctx.metrics.grants.inc({ pool: g.pool, event: "acked" }));
        const opId = applied.opIds[0]!;
        // Mark the op running here so the reconciler leaves it to this request (lease).
        await tx.run("UPDATE operations SET state = 'running', attempts = attempts + 1, updated_at = ? WHERE id = ?", [now, opId]);
        await setDue(tx, "op", opId, now + 30_000);
        const op = await tx.get<OpRow>("SELECT * FROM operations WHERE id = ?", [opId]);
        return { kind: "install" as const, started: { op: op!, machine: applied.machine } satisfies StartedOp };
      });
      if (first.kind === "refuse") {
        if (first.invalidated) ctx.kick();
        throw new BerthError(first.code, `${first.code}: borrow ${grantId}: ${first.why}`);
      }
      if (first.kind === "install") await executeOp(ctx, first.started);
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
        await tx.run("UPDATE grants SET heartbeat_deadline = ? WHERE id = ?", [deadline, g.id]);
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
        return invalidateGrant(tx, ctx, g, body.disposition === "drain" ? "drained" : "returned", now, `${g.id}:return`);
      });
      if (work) ctx.kick();
      return this.show(p, grantId);
    },

    async show(p, grantId) {
      return ctx.store.transaction(async (tx) => {
        const g = await tx.get<GrantRow>("SELECT * FROM grants WHERE id = ?", [grantId]);
        if (!g || g.org !== p.org) throw new BerthError("not_found", `not_found: no borrow ${grantId} in this organisation`);
        const m = await tx.get<MachineRow>("SELECT * FROM machines WHERE id = ?", [g.machine_id]);
        return presentGrant(g, m);
      });
    },
  };
}

