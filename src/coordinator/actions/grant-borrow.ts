/**
 * The portable borrow (one transaction): reserve the longest-waiting eligible
 * ready machine, advance its generation, persist a pending grant with hashes,
 * an ack deadline and the immutable expiry. No key is installed (the ack does
 * that; grants.ts).
 *
 * The client may choose the grant's id and both tokens (all three; stored only
 * as hashes). A repeat of that request with the same public key — a retry
 * after a lost reply — answers the same grant (`repeated: true`, nothing taken
 * twice) while it is pending, installing or active; once it is on its way out,
 * `borrow_not_active`; the id with other tokens, another key, organisation or
 * pool, `conflict` (chosen-id.ts).
 */
import { BerthError } from "../../core/errors.js";
import { newId } from "../../core/ids.js";
import { hashToken, newToken, sameHash } from "../../core/tokens.js";
import { grantExpiresAt } from "../../core/grant.js";
import { parsePublicKey } from "../../core/ssh-public-key.js";
import type { Tx } from "../../store/store.js";
import { poolRef, requestFillCheck, setDue, setDueNoLater } from "../../store/due.js";
import { insertGrant, readGrant } from "../../store/grants.js";
import { takeReadyMachine } from "../../store/machines.js";
import { readPoolAsToken } from "../../store/pools.js";
import type { Ctx } from "../context.js";
import { refuseDeadToken, type Principal } from "../auth.js";
import { applyTransition } from "./transition.js";
import { checkPortable } from "./pools.js";
import { whyExhausted } from "./exhausted.js";
import { borrowOrRepeat, chosenIdConflict, chosenIdTaken } from "./chosen-id.js";
import { lentMachine, resentBorrowMachine } from "./lent-machine.js";

/** A grant id and tokens the client chose (`POST …/borrow` with `borrowId`, `borrowToken` and `grantToken`). */
export interface ChosenGrant {
  borrowId: string;
  borrowToken: string;
  grantToken: string;
}

export interface PortableBorrowBody {
  publicKey?: string;
  durationMs?: number;
}

export async function borrowPortable(ctx: Ctx, p: Principal, poolName: string, body: PortableBorrowBody, chosen: ChosenGrant | null) {
  if (body.publicKey === undefined) throw new BerthError("invalid_request", "invalid_request: field publicKey: a portable borrow needs the client's ephemeral public key");
  const key = parsePublicKey(body.publicKey);
  if (key.type !== "ssh-ed25519") throw new BerthError("invalid_request", "invalid_request: field publicKey: portable borrows use Ed25519 keys");
  if (!chosen) return borrowOnce(ctx, p, poolName, body, key, null);
  return borrowOrRepeat(
    chosen.borrowId,
    () => borrowOnce(ctx, p, poolName, body, key, chosen),
    () => ctx.store.transaction((tx) => earlierGrant(tx, p, poolName, key.fingerprint, chosen, ctx.now()), { name: "borrow_repeat" }),
  );
}

async function borrowOnce(ctx: Ctx, p: Principal, poolName: string, body: PortableBorrowBody, key: { fingerprint: string; line: string }, chosen: ChosenGrant | null) {
  const started = process.hrtime.bigint();
  const now = ctx.now();
  const grantId = chosen?.borrowId ?? newId("g", ctx.randomBytes);
  const token = chosen?.borrowToken ?? newToken("borrow", ctx.randomBytes);
  const grantToken = chosen?.grantToken ?? newToken("grant", ctx.randomBytes);
  const out = await ctx.store.transaction(async (tx) => {
    // The token is checked here, in the transaction that acts (the route may have taken it from its cache).
    const { pool, tokenLive: live } = await readPoolAsToken(tx, p.org, poolName, p.tokenId);
    refuseDeadToken(live);
    if (!pool) throw new BerthError("not_found", `not_found: no pool named ${poolName} in this organisation`);
    if (pool.access !== "portable") throw new BerthError("namespace_conflict", `namespace_conflict: pool ${poolName} is a ${pool.access} pool; portable access is refused (no fallback)`);
    checkPortable(ctx, pool.provider);
    // Not near hard TTL: the machine must outlive the longest grant we could issue on it.
    const m = await takeReadyMachine(tx, pool, "portable", now);
    if (!m) {
      // A resent borrow whose first request took the last machine gets that grant, not pool_exhausted.
      const repeat = chosen ? await earlierGrant(tx, p, poolName, key.fingerprint, chosen, now) : null;
      if (repeat) return { repeat };
      await setDueNoLater(tx, "fill", poolRef(p.org, poolName), now);
      return { miss: await whyExhausted(tx, pool, now, { provisions: Boolean(ctx.providers.get(pool.provider)?.capabilities.provision), retired: null }) };
    }
    const expiresAt = grantExpiresAt({ now, requestedMs: body.durationMs ?? null, maxMs: ctx.config.maxBorrowMs, machineHardExpiresAt: m.hard_expires_at, authorizationExpiresAt: p.expiresAt });
    const ackDeadline = Math.min(now + ctx.config.ackTimeoutMs, expiresAt);
    const heartbeatDeadline = Math.min(now + pool.heartbeatMs, expiresAt);
    const applied = await applyTransition(tx, ctx, m, { kind: "reserve", mode: "portable" }, now, { subject: grantId, lentTo: grantId, nonce: grantId });
    await insertGrant(
      tx,
      {
        id: grantId, org: p.org, pool: poolName, machineId: m.id, resourceId: m.resource_id, borrower: p.tokenId,
        tokenHash: hashToken("borrow", token), grantTokenHash: hashToken("grant", grantToken), generation: applied.machine.generation,
        fingerprint: key.fingerprint, publicKey: key.line, now, ackDeadline, heartbeatDeadline, expiresAt,
      },
      chosen ? chosenIdTaken : null,
    );
    await setDue(tx, "ack", grantId, ackDeadline);
    await setDue(tx, "grant", grantId, expiresAt);
    // As a keeper borrow does (actions/borrow.ts): last, and only where a fill can provision.
    if (ctx.providers.get(pool.provider)?.capabilities.provision) await requestFillCheck(tx, poolRef(p.org, poolName), now);
    return { repeat: null, machine: applied.machine, readySince: m.ready_since, expiresAt, ackDeadline, heartbeatDeadline, heartbeatMs: pool.heartbeatMs };
  });
  if ("miss" in out) {
    ctx.kick();
    ctx.metrics.warm.inc({ pool: poolName, result: "miss" });
    ctx.metrics.borrowRequests.inc({ pool: poolName, access: "portable", outcome: "exhausted" });
    throw new BerthError("pool_exhausted", `pool_exhausted: ${out.miss}`);
  }
  if (out.repeat) return out.repeat;
  // No reconciler wake-up on a hit (as a keeper borrow): the fill row set above is visited on the
  // loop's next pass. A wake-up here ran a fill visit, with a commit of its own, just as the
  // client's ack arrived, and the ack waited behind it (test/coordinator/hot-path-counts).
  ctx.metrics.warm.inc({ pool: poolName, result: "hit" });
  ctx.metrics.borrowRequests.inc({ pool: poolName, access: "portable", outcome: "ok" });
  ctx.metrics.grants.inc({ pool: poolName, event: "issued" });
  ctx.metrics.observeBorrow({
    org: p.org,
    pool: poolName,
    access: "portable",
    latencySeconds: Number(process.hrtime.bigint() - started) / 1e9,
    readyAgeSeconds: out.readySince !== null ? Math.max(0, now - out.readySince) / 1000 : null,
    at: now,
  });
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
    heartbeatDeadline: out.heartbeatDeadline,
    heartbeatMs: out.heartbeatMs,
    expiresAt: out.expiresAt,
    machine: lentMachine(m, m.generation),
    repeated: false,
  };
}

/** The answer to a resent client-chosen portable borrow: null when none is recorded; the same grant while it is live; else why not. */
async function earlierGrant(tx: Tx, p: Principal, poolName: string, fingerprint: string, chosen: ChosenGrant, now: number) {
  const g = await readGrant(tx, chosen.borrowId);
  if (!g) return null;
  const same =
    g.org === p.org &&
    g.pool === poolName &&
    g.fingerprint === fingerprint &&
    sameHash(g.token_hash, hashToken("borrow", chosen.borrowToken)) &&
    sameHash(g.grant_token_hash, hashToken("grant", chosen.grantToken));
  if (!same) throw chosenIdConflict(g.id);
  const live = (g.state === "pending" || g.state === "installing" || g.state === "active") && now < g.expires_at;
  if (!live) throw new BerthError("borrow_not_active", `borrow_not_active: borrow ${g.id} is ${g.state}${g.reason ? ` (${g.reason})` : ""}; borrow again`);
  const { m, pool } = await resentBorrowMachine(tx, g.id, g.machine_id, p.org, poolName);
  return {
    borrowId: g.id,
    borrowToken: chosen.borrowToken,
    grantToken: chosen.grantToken,
    access: "portable",
    state: g.state,
    pool: g.pool,
    generation: g.generation,
    fingerprint: g.fingerprint,
    ackDeadline: g.ack_deadline,
    heartbeatDeadline: g.heartbeat_deadline,
    heartbeatMs: pool.heartbeatMs,
    expiresAt: g.expires_at,
    machine: lentMachine(m, g.generation),
    repeated: true,
  };
}
