/**
 * Keeper borrows: borrow, heartbeat, return. Each is one transaction that
 * re-reads the authoritative rows. Borrow takes the compatible ready machine
 * that has waited longest (excluding machines near their hard TTL), advances
 * its generation and records a borrow whose token is returned once and
 * stored only as a hash.
 *
 * A client may choose the borrow's id and token itself (both; the token is
 * still stored only as a hash). A repeat of that request — a retry after a
 * lost reply — answers the same borrow (`repeated: true`, nothing taken
 * twice) while it is active; the same id with another token or from another
 * organisation is `conflict` (chosen-id.ts).
 */
import { BerthError } from "../../core/errors.js";
import { newId } from "../../core/ids.js";
import { hashToken, newToken, sameHash } from "../../core/tokens.js";
import { keeperBorrowMs, liveDecision, nextHeartbeatDeadline } from "../../core/borrow.js";
import { rotationMarginMs, type PoolRecord } from "../../core/pool.js";
import { formatDuration } from "../../core/durations.js";
import type { Tx } from "../../store/store.js";
import { clearDue, poolRef, requestFillCheck, setDue } from "../../store/due.js";
import { whyExhausted } from "./exhausted.js";
import { endBorrow, insertBorrow, lockBorrowAsToken, readBorrowWithMachineState, setBorrowHeartbeat, type BorrowRow } from "../../store/borrows.js";
import { lockMachine, lockShortLivedReady, readMachine, takeReadyMachine, type MachineRow } from "../../store/machines.js";
import { readPool, readPoolAsToken } from "../../store/pools.js";
import { tokenLive } from "../../store/api-tokens.js";
import type { Ctx } from "../context.js";
import { refuseDeadToken, type Principal } from "../auth.js";
import { applyTransition } from "./transition.js";
import { lentMachine, resentBorrowMachine } from "./lent-machine.js";
import { borrowOrRepeat, chosenIdConflict, chosenIdTaken } from "./chosen-id.js";
import { lendCheck, needsLendCheck, withdrawBorrow } from "./lend-check.js";

function lendExhausted(poolName: string, last: string): BerthError {
  return new BerthError("pool_exhausted", `pool_exhausted: pool ${poolName}: the machines taken failed the lend-time network check and were quarantined (last: ${last.slice(0, 600)}); borrow again`);
}

export interface KeeperBorrowResult {
  borrowId: string;
  borrowToken: string;
  pool: string;
  machine: { id: string; generation: number; ssh: { host: string | null; port: number | null; user: string | null; hostKey: string | null } };
  heartbeatMs: number;
  heartbeatDeadline: number;
  expiresAt: number;
  /** True when this answers an earlier request for the same client-chosen borrow. */
  repeated: boolean;
}

/** A borrow id and token the client chose (`POST …/borrow` with `borrowId` and `borrowToken`). */
export interface ChosenBorrow {
  borrowId: string;
  borrowToken: string;
}

/** A taken machine failed its lend-time network check: the borrow was withdrawn, the machine quarantined. */
class LendRefused extends Error {}

/** How many machines one borrow request may find failing their lend-time check before it gives up. */
const LEND_ATTEMPTS = 3;

/**
 * `durationMs`: how long the borrow lasts from now (null: the default,
 * core/borrow.ts). Only a machine that lives that long is lent; asking more
 * than the pool's machines live is `duration_too_long`.
 */
export async function borrowKeeper(ctx: Ctx, p: Principal, poolName: string, chosen: ChosenBorrow | null = null, durationMs: number | null = null): Promise<KeeperBorrowResult> {
  if (!chosen) {
    for (let attempt = 1; ; attempt++) {
      try {
        return await borrowKeeperOnce(ctx, p, poolName, null, durationMs);
      } catch (e) {
        if (!(e instanceof LendRefused)) throw e;
        if (attempt >= LEND_ATTEMPTS) throw lendExhausted(poolName, e.message);
      }
    }
  }
  return borrowOrRepeat(
    chosen.borrowId,
    () => borrowKeeperOnce(ctx, p, poolName, chosen, durationMs).catch((e: unknown) => {
      // A client-chosen id names the withdrawn borrow now: the client borrows again with a new one.
      throw e instanceof LendRefused ? lendExhausted(poolName, e.message) : e;
    }),
    () => ctx.store.transaction((tx) => earlierBorrow(tx, p, poolName, chosen, ctx.now()), { name: "borrow_repeat" }),
  );
}

/** A machine taken and its borrow recorded, in the borrow's transaction. */
interface Taken {
  miss: false;
  repeat: null;
  pool: string;
  machine: MachineRow;
  readySince: number | null;
  heartbeatMs: number;
  heartbeatDeadline: number;
  expiresAt: number;
  /** The transition queued operations: the reconciler is woken. */
  work: boolean;
}

/** No machine to lend: why, and whether a short-lived one was retired (work for the reconciler). */
interface Missed {
  miss: true;
  pool: string;
  why: string;
  work: boolean;
}

/** A resent client-chosen borrow whose first request took the machine: that borrow again. */
interface Repeated {
  miss: false;
  repeat: KeeperBorrowResult;
}

/**
 * One borrow attempt: one transaction (take a machine and record the borrow,
 * or find why none is lent), then, after the commit, the lend-time check
 * where the machine needs one, the metrics, and the answer.
 */
async function borrowKeeperOnce(ctx: Ctx, p: Principal, poolName: string, chosen: ChosenBorrow | null, durationMs: number | null): Promise<KeeperBorrowResult> {
  const started = process.hrtime.bigint();
  const now = ctx.now();
  const borrowId = chosen?.borrowId ?? newId("b", ctx.randomBytes);
  const token = chosen?.borrowToken ?? newToken("borrow", ctx.randomBytes);
  const tokenHash = hashToken("borrow", token);
  const out = await ctx.store.transaction(async (tx): Promise<Taken | Missed | Repeated> => {
    const { pool, lengthMs } = await keeperPoolFor(tx, p, poolName, durationMs);
    // Only a machine that outlives the borrow is lent: its deadline is the borrow's own.
    const m = await takeReadyMachine(tx, pool, "keeper", now, lengthMs);
    if (!m) return noMachine(tx, ctx, p, pool, { borrowId, chosen, lengthMs }, now);
    return lendMachine(tx, ctx, p, pool, m, { borrowId, tokenHash, chosen, lengthMs }, now);
  }, { name: "borrow" });
  if (!out.miss && out.repeat) return out.repeat;
  if (out.miss) refuseMissed(ctx, out);
  if (out.work) ctx.kick();
  if (needsLendCheck(out.machine)) {
    // After the commit, before the answer: the machine's rules must be the ones its evidence was probed against.
    const why = await lendCheck(ctx, out.machine);
    if (why !== null) {
      await withdrawBorrow(ctx, borrowId, out.machine.id, out.machine.generation, why);
      throw new LendRefused(`machine ${out.machine.id}: ${why}`);
    }
  }
  countLent(ctx, p, out, started, now);
  return keeperAnswer(borrowId, token, out);
}

/** The pool to borrow from and how long the borrow lasts; refuses a dead token, an unknown or portable pool, a duration too long. */
async function keeperPoolFor(tx: Tx, p: Principal, poolName: string, durationMs: number | null): Promise<{ pool: PoolRecord; lengthMs: number }> {
  // The token is checked again here, in the transaction that acts (the route may have taken it from its cache).
  const { pool, tokenLive: live } = await readPoolAsToken(tx, p.org, poolName, p.tokenId);
  refuseDeadToken(live);
  if (!pool) throw new BerthError("not_found", `not_found: no pool named ${poolName} in this organisation`);
  if (pool.access !== "keeper") {
    throw new BerthError("namespace_conflict", `namespace_conflict: pool ${poolName} is a ${pool.access} pool; borrow it with --access ${pool.access}`);
  }
  const length = keeperBorrowMs(durationMs, pool, rotationMarginMs(pool.hardTtlMs));
  if (length.kind === "too_long") {
    throw new BerthError(
      "duration_too_long",
      `duration_too_long: pool ${poolName}'s machines live ${formatDuration(pool.hardTtlMs)} (its hard TTL), so a borrow there lasts at most ${formatDuration(length.maxMs)}; ask --duration ${formatDuration(length.maxMs)} or less, or raise the pool's --hard-ttl`,
    );
  }
  return { pool, lengthMs: length.ms };
}

/** No ready machine outlives the borrow: the earlier borrow of a resent request, or why the pool is exhausted. */
async function noMachine(tx: Tx, ctx: Ctx, p: Principal, pool: PoolRecord, b: { borrowId: string; chosen: ChosenBorrow | null; lengthMs: number }, now: number): Promise<Missed | Repeated> {
  // A resent borrow whose first request took the last machine gets that borrow, not pool_exhausted.
  const repeat = b.chosen ? await earlierBorrow(tx, p, pool.name, b.chosen, now) : null;
  if (repeat) return { miss: false, repeat };
  // A ready machine too short-lived for this borrow is retired (one per refused borrow), so a fresh one replaces it.
  const provisions = Boolean(ctx.providers.get(pool.provider)?.capabilities.provision);
  const short = provisions ? await lockShortLivedReady(tx, pool, now, b.lengthMs) : undefined;
  let work = false;
  if (short) {
    const drained = await applyTransition(tx, ctx, short, { kind: "drain", reason: `retired: less than ${formatDuration(b.lengthMs)} left for a ${formatDuration(b.lengthMs)} borrow` }, now, { subject: b.borrowId, nonce: `${b.borrowId}:short` });
    work = drained.opIds.length > 0;
  }
  const why = await whyExhausted(tx, pool, now, { provisions, retired: short ? { lifeMs: b.lengthMs } : null });
  await requestFillCheck(tx, poolRef(p.org, pool.name), now);
  return { miss: true, pool: pool.name, why, work };
}

/** Reserves machine `m` for the borrow and records the borrow and its heartbeat deadline. */
async function lendMachine(tx: Tx, ctx: Ctx, p: Principal, pool: PoolRecord, m: MachineRow, b: { borrowId: string; tokenHash: string; chosen: ChosenBorrow | null; lengthMs: number }, now: number): Promise<Taken> {
  const { borrowId } = b;
  const applied = await applyTransition(tx, ctx, m, { kind: "reserve", mode: "keeper" }, now, { subject: borrowId, lentTo: borrowId, nonce: borrowId });
  const expiresAt = now + b.lengthMs;
  const heartbeatDeadline = nextHeartbeatDeadline(now, pool.heartbeatMs, expiresAt);
  await insertBorrow(
    tx,
    { id: borrowId, org: p.org, pool: pool.name, machineId: m.id, principal: p.tokenId, tokenHash: b.tokenHash, generation: applied.machine.generation, now, heartbeatDeadline, expiresAt },
    // A client-chosen id or token may meet a concurrent insert of the same: roll back, then read it.
    b.chosen ? chosenIdTaken : null,
  );
  await setDue(tx, "heartbeat", borrowId, heartbeatDeadline);
  // The pool may now be short of minReady: the reconciler's next pass looks
  // (no wake-up per borrow; one fill visit serves every borrow before it).
  // Last statement, so the shared lock it may take is held only until commit.
  // A pool whose provider does not provision (an outside keeper fills it
  // through ensure) has nothing a borrow could make its fill visit do.
  if (ctx.providers.get(pool.provider)?.capabilities.provision) await requestFillCheck(tx, poolRef(p.org, pool.name), now);
  return { miss: false, repeat: null, pool: pool.name, machine: applied.machine, readySince: m.ready_since, heartbeatMs: pool.heartbeatMs, heartbeatDeadline, expiresAt, work: applied.opIds.length > 0 };
}

/** Counts the miss, wakes the reconciler, and refuses with `pool_exhausted`. */
function refuseMissed(ctx: Ctx, out: Missed): never {
  ctx.metrics.warm.inc({ pool: out.pool, result: "miss" });
  ctx.metrics.borrowRequests.inc({ pool: out.pool, access: "keeper", outcome: "exhausted" });
  ctx.kick();
  throw new BerthError("pool_exhausted", `pool_exhausted: ${out.why}`);
}

/** The warm hit, the borrow request and its latency and ready age, in the metrics. */
function countLent(ctx: Ctx, p: Principal, out: Taken, started: bigint, now: number): void {
  ctx.metrics.warm.inc({ pool: out.pool, result: "hit" });
  ctx.metrics.borrowRequests.inc({ pool: out.pool, access: "keeper", outcome: "ok" });
  ctx.metrics.observeBorrow({
    org: p.org,
    pool: out.pool,
    access: "keeper",
    latencySeconds: Number(process.hrtime.bigint() - started) / 1e9,
    readyAgeSeconds: out.readySince !== null ? Math.max(0, now - out.readySince) / 1000 : null,
    at: now,
  });
}

function keeperAnswer(borrowId: string, token: string, out: Taken): KeeperBorrowResult {
  const m = out.machine;
  return {
    borrowId,
    borrowToken: token,
    pool: out.pool,
    machine: lentMachine(m, m.generation),
    heartbeatMs: out.heartbeatMs,
    heartbeatDeadline: out.heartbeatDeadline,
    expiresAt: out.expiresAt,
    repeated: false,
  };
}

/** The answer to a resent client-chosen borrow: null when none is recorded; the same borrow while it is active; else why not. */
async function earlierBorrow(tx: Tx, p: Principal, poolName: string, chosen: ChosenBorrow, now: number): Promise<KeeperBorrowResult | null> {
  const b = await lockBorrowAsToken(tx, chosen.borrowId, p.tokenId);
  if (!b) {
    refuseDeadToken(await tokenLive(tx, p.tokenId));
    return null;
  }
  refuseDeadToken(b.token_live);
  if (b.org !== p.org || b.pool !== poolName || !sameHash(b.token_hash, hashToken("borrow", chosen.borrowToken))) throw chosenIdConflict(b.id);
  refuseNotLive(b, now);
  const { m, pool } = await resentBorrowMachine(tx, b.id, b.machine_id, p.org, poolName);
  return {
    borrowId: b.id,
    borrowToken: chosen.borrowToken,
    pool: b.pool,
    machine: lentMachine(m, b.generation),
    heartbeatMs: pool.heartbeatMs,
    heartbeatDeadline: b.heartbeat_deadline,
    expiresAt: b.expires_at,
    repeated: true,
  };
}

/** The borrow, locked; the API token checked again in this transaction (the route may have taken it from its cache). */
async function loadBorrow(tx: Tx, p: Principal, borrowId: string, token: string): Promise<BorrowRow> {
  const b = await lockBorrowAsToken(tx, borrowId, p.tokenId);
  refuseDeadToken(b ? b.token_live : await tokenLive(tx, p.tokenId));
  if (!b || b.org !== p.org) throw new BerthError("not_found", `not_found: no borrow ${borrowId} in this organisation`);
  if (!sameHash(b.token_hash, hashToken("borrow", token))) throw new BerthError("token_mismatch", `token_mismatch: the borrow token does not match borrow ${borrowId}`);
  return b;
}

/** What happened to a borrow whose deadline passed, and what to do: nothing is left to return. */
function expiredError(b: BorrowRow): BerthError {
  const length = formatDuration(b.expires_at - b.created_at);
  return new BerthError(
    "borrow_expired",
    `borrow_expired: borrow ${b.id} ended at ${new Date(b.expires_at).toISOString()}: its deadline (--duration ${length}) passed, so its machine was taken back and is destroyed, never lent again; nothing to return; borrow again, with a longer --duration if the work needs more than ${length}`,
  );
}

function refuseNotLive(b: BorrowRow, now: number): void {
  const d = liveDecision({ state: b.state, heartbeatDeadline: b.heartbeat_deadline, expiresAt: b.expires_at }, now);
  switch (d.kind) {
    case "live":
      return;
    case "ended":
      if (d.state === "expired") throw expiredError(b);
      throw new BerthError("borrow_not_active", `borrow_not_active: borrow ${b.id} is ${d.state}${b.reason ? ` (${b.reason})` : ""}; borrow again`);
    case "expired":
      throw expiredError(b);
    case "heartbeat_missed":
      throw new BerthError("borrow_expired", `borrow_expired: borrow ${b.id} missed its heartbeat deadline ${new Date(d.at).toISOString()} and is being quarantined; borrow again`);
  }
}

export async function heartbeatKeeper(ctx: Ctx, p: Principal, borrowId: string, token: string): Promise<{ heartbeatDeadline: number; expiresAt: number }> {
  const now = ctx.now();
  try {
    const r = await ctx.store.transaction(async (tx) => {
      const b = await loadBorrow(tx, p, borrowId, token);
      refuseNotLive(b, now);
      const pool = await readPool(tx, b.org, b.pool);
      const deadline = nextHeartbeatDeadline(now, pool?.heartbeatMs ?? 60_000, b.expires_at);
      await setBorrowHeartbeat(tx, b.id, deadline);
      await setDue(tx, "heartbeat", b.id, deadline);
      return { heartbeatDeadline: deadline, expiresAt: b.expires_at };
    });
    ctx.metrics.heartbeats.inc({ outcome: "ok" });
    return r;
  } catch (e) {
    ctx.metrics.heartbeats.inc({ outcome: "refused" });
    throw e;
  }
}

export type Disposition = "ready" | "drain";

/**
 * A return whose reply was lost is retried with the same token: a borrow
 * already returned answers where its machine went (HTTP 200, `repeated`),
 * never an error. A machine that moved on to a later generation was ready
 * again before it was lent out, so that is the state this return reached.
 */
export async function returnKeeper(ctx: Ctx, p: Principal, borrowId: string, token: string, disposition: Disposition): Promise<{ machineId: string; state: string; repeated?: true }> {
  const now = ctx.now();
  const r = await ctx.store.transaction(async (tx) => {
    const b = await loadBorrow(tx, p, borrowId, token);
    if (b.state === "returned") {
      const m = await readMachine(tx, b.machine_id);
      const state = !m ? "pruned" : m.generation === b.generation ? m.state : "ready";
      return { machineId: b.machine_id, state, work: false, repeated: true as const };
    }
    refuseNotLive(b, now);
    const m = await lockMachine(tx, b.machine_id);
    if (!m || m.generation !== b.generation || m.state !== "busy") {
      throw new BerthError("generation_mismatch", `generation_mismatch: machine of borrow ${b.id} moved on (generation ${m?.generation ?? "gone"}); nothing was changed`);
    }
    await endBorrow(tx, b.id, "returned", disposition === "drain" ? "returned for drain" : "returned", now);
    tx.afterCommit(() => ctx.metrics.history.returned(b.org, b.pool, now));
    await clearDue(tx, "heartbeat", b.id);
    await setDue(tx, "retention", `b:${b.id}`, now + ctx.config.retentionMs);
    const provider = ctx.providers.get(m.provider);
    if (disposition === "drain") {
      // Destruction proves the borrower's sessions gone; a provider that cannot
      // destroy (an outside keeper's) leaves the machine draining until the
      // keeper confirms destruction, and nothing is pruned before that.
      const drained = await applyTransition(tx, ctx, m, { kind: "drain", reason: "returned for drain" }, now, { subject: b.id, nonce: b.id });
      return { machineId: m.id, state: drained.machine.state, work: drained.opIds.length > 0 };
    }
    const back = await applyTransition(tx, ctx, m, { kind: "return", mode: "keeper", scrub: Boolean(provider?.capabilities.fence) }, now, { subject: b.id, nonce: b.id });
    return { machineId: m.id, state: back.machine.state, work: back.opIds.length > 0 };
  }, { name: "return" });
  if (r.work) ctx.kick();
  return { machineId: r.machineId, state: r.state, ...("repeated" in r ? { repeated: true as const } : {}) };
}

export async function getBorrow(ctx: Ctx, p: Principal, borrowId: string): Promise<BorrowRow & { machine_state: string | null }> {
  return ctx.store.transaction(async (tx) => {
    const b = await readBorrowWithMachineState(tx, borrowId);
    if (!b || b.org !== p.org) throw new BerthError("not_found", `not_found: no borrow ${borrowId} in this organisation`);
    return b;
  });
}
