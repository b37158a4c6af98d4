/**
 * The portable borrower's calls on a grant (docs/portable.md), behind the
 * `PortableApi` the routes call; the borrow itself is grant-borrow.ts, what
 * the coordinator does to a grant on its own (invalidation, operation
 * proofs, deadlines) grants.ts.
 *
 *   ack: (1) one transaction re-checks everything (fresh authorization,
 *     hashes, key, generation, deadlines), persists install intent (the
 *     install_key operation row) and leases it; (2) the provider call,
 *     outside any transaction, carrying op id and generation (`runLeased`,
 *     the executor's); (3) its recording transaction publishes `active` only
 *     for exactly that generation and only while now < expiresAt, and the
 *     answer is read in it.
 *   heartbeat: moves the heartbeat deadline only, never the expiry.
 *   return: invalidates the grant durably (grants.ts); its machine's way out
 *     runs as operations after that.
 *   show: the grant as its borrower's organisation sees it.
 */
import { BerthError } from "../../core/errors.js";
import { hashToken, sameHash } from "../../core/tokens.js";
import { ackDecision, isExpired } from "../../core/grant.js";
import { parsePublicKey } from "../../core/ssh-public-key.js";
import type { Tx } from "../../store/store.js";
import { setDue } from "../../store/due.js";
import { lockGrant, markGrantInstalling, readGrant, setGrantHeartbeat, type GrantRow } from "../../store/grants.js";
import { lockMachine, readMachine, type MachineRow } from "../../store/machines.js";
import { leaseOp, type OpRow } from "../../store/operations.js";
import { readPool } from "../../store/pools.js";
import type { InstallKeyArgs } from "../../protocol/operations.js";
import type { Ctx } from "../context.js";
import type { Principal } from "../auth.js";
import { applyTransition } from "./transition.js";
import { lentMachine } from "./lent-machine.js";
import { borrowPortable } from "./grant-borrow.js";
import { invalidateGrant } from "./grants.js";
import type { PortableApi } from "./portable-api.js";

/** What the portable API needs from the rest of the coordinator (wired in server.ts). */
export interface PortableDeps {
  /** Carries out an operation this code leased itself (the ack's install), outside any transaction. */
  runLeased<T>(started: { op: OpRow; machine: MachineRow }, read: (tx: Tx) => Promise<T>): Promise<T | undefined>;
}

export function createPortable(ctx: Ctx, deps: PortableDeps): PortableApi {
  return {
    borrow: (p, poolName, body, chosen) => borrowPortable(ctx, p, poolName, body, chosen),
    ack: (p, grantId, body) => ackGrant(ctx, deps, p, grantId, body),
    heartbeat: (p, grantId, body) => heartbeatGrant(ctx, p, grantId, body),
    return: (p, grantId, body) => returnGrant(ctx, p, grantId, body),
    show: (p, grantId) => showGrant(ctx, p, grantId),
  };
}

async function ackGrant(ctx: Ctx, deps: PortableDeps, p: Principal, grantId: string, body: { token: string; grantToken: string; publicKey: string }) {
  const key = parsePublicKey(body.publicKey);
  const now = ctx.now();
  const first = await ctx.store.transaction((tx) => recordInstallIntent(tx, ctx, p, grantId, body, key.fingerprint, now));
  if (first.kind === "refuse") {
    if (first.invalidated) ctx.kick();
    throw new BerthError(first.code, `${first.code}: borrow ${grantId}: ${first.why}`);
  }
  if (first.kind === "install") {
    const view = await installAndAnswer(ctx, deps, p, grantId, first.started);
    if (view) return view;
  }
  return showGrant(ctx, p, grantId);
}

/** The ack's step 1, in its transaction: the decision, then (to install) the durable intent, leased to this request. */
async function recordInstallIntent(tx: Tx, ctx: Ctx, p: Principal, grantId: string, body: { token: string; grantToken: string }, fingerprint: string, now: number) {
  const g = await loadGrant(tx, p, grantId, body.token, body.grantToken);
  const m = await lockMachine(tx, g.machine_id);
  const d = ackDecision({
    grant: { state: g.state, ackDeadline: g.ack_deadline, expiresAt: g.expires_at, fingerprint: g.fingerprint, generation: g.generation, borrower: g.borrower, org: g.org },
    machine: m ? { state: m.state, generation: m.generation } : null,
    principal: p,
    fingerprint,
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
}

/**
 * The ack's steps 2 and 3: the install, and the answer read in the
 * transaction that records its outcome (undefined when the recording did
 * not run). Access is never answered active at or after the grant's expiry:
 * a grant found so (the install took that long) is invalidated here, as the
 * reconciler would at its deadline.
 */
async function installAndAnswer(ctx: Ctx, deps: PortableDeps, p: Principal, grantId: string, started: { op: OpRow; machine: MachineRow }) {
  let expired = false;
  const view = await deps.runLeased(started, async (tx) => {
    const g = await lockGrant(tx, grantId);
    const at = ctx.now();
    if (!g || g.org !== p.org || g.state !== "active" || !isExpired(g.expires_at, at)) return g && g.org === p.org ? presentGrant(g, await readMachine(tx, g.machine_id)) : grantView(tx, p, grantId);
    expired = await invalidateGrant(tx, ctx, g, "expired", at, `${g.id}:ack-expired`);
    return grantView(tx, p, grantId);
  });
  if (expired) ctx.kick();
  return view;
}

async function heartbeatGrant(ctx: Ctx, p: Principal, grantId: string, body: { token: string; grantToken?: string }) {
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
}

async function returnGrant(ctx: Ctx, p: Principal, grantId: string, body: { token: string; grantToken?: string; disposition: "ready" | "drain" }) {
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
  return showGrant(ctx, p, grantId);
}

async function showGrant(ctx: Ctx, p: Principal, grantId: string) {
  return ctx.store.transaction((tx) => grantView(tx, p, grantId));
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
      ? { ...lentMachine(m, m.generation), state: m.state }
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
