/**
 * Pool actions: ensure (store desired capacity, then fill in the same
 * transaction), show and list. `ensure` never lowers capacity by cancelling
 * an unexpired claim that already funds provisioning.
 */
import { BerthError } from "../../core/errors.js";
import { CAPACITY_LIMIT, type Access, type PoolIdentity, type PoolRecord, type ProviderName, type CapacityCounts } from "../../core/pool.js";
import { missingPortableCapabilities } from "../../providers/provider.js";
import { poolFromRow, poolRef, setDue, type PoolRow } from "../../store/rows.js";
import type { Ctx } from "../context.js";
import type { Principal } from "../auth.js";
import { fillPool, lockPool } from "./fill.js";
import { countCapacity, type IssuedClaim } from "./capacity.js";

export interface EnsureInput {
  name: string;
  minReady: number;
  maxReady: number;
  compatibilityKey: string;
  access: Access;
  provider: ProviderName;
  identity: PoolIdentity | null;
  hardTtlMs: number;
  heartbeatMs: number;
  keeperKey: string | null;
}

export interface EnsureResult {
  pool: PoolRecord;
  counts: CapacityCounts;
  claims: IssuedClaim[];
  note: string | null;
}

export function checkPortable(ctx: Ctx, providerName: string): void {
  if (!ctx.config.portable) {
    throw new BerthError("portable_unsupported", "portable_unsupported: this coordinator does not have portable access enabled (start it with --portable); no fallback to keeper access is made");
  }
  const provider = ctx.providers.get(providerName);
  const missing = provider ? missingPortableCapabilities(provider.capabilities) : ["provider"];
  if (missing.length > 0) {
    throw new BerthError("portable_unsupported", `portable_unsupported: provider ${providerName} lacks ${missing.join(", ")}; portable pools need exact key install, key revoke, session fencing, destruction evidence and identity observation`);
  }
}

export async function ensurePool(ctx: Ctx, p: Principal, input: EnsureInput): Promise<EnsureResult> {
  if (input.minReady > input.maxReady) throw new BerthError("invalid_request", `invalid_request: minReady (${input.minReady}) is above maxReady (${input.maxReady})`);
  if (input.maxReady > CAPACITY_LIMIT) throw new BerthError("invalid_request", `invalid_request: maxReady is at most ${CAPACITY_LIMIT}`);
  if (!ctx.providers.get(input.provider)) throw new BerthError("invalid_request", `invalid_request: provider ${input.provider} is not configured on this coordinator`);
  if (input.access === "portable") checkPortable(ctx, input.provider);
  const now = ctx.now();
  const seed = ctx.randomBytes(32);
  const result = await ctx.store.transaction(async (tx) => {
    // Insert-if-absent first, so concurrent first ensures of one pool serialize on its row.
    const created = await tx.run(
      "INSERT INTO pools (org, name, access, provider, compatibility_key, identity, min_ready, max_ready, hard_ttl_ms, heartbeat_ms, keeper_key, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (org, name) DO NOTHING",
      [p.org, input.name, input.access, input.provider, input.compatibilityKey, input.identity ? JSON.stringify(input.identity) : null, input.minReady, input.maxReady, input.hardTtlMs, input.heartbeatMs, input.keeperKey, now, now],
    );
    const existing = await lockPool(tx, p.org, input.name);
    if (created === 0 && existing) {
      if (existing.access !== input.access || existing.provider !== input.provider || existing.compatibilityKey !== input.compatibilityKey) {
        const live = await tx.get<{ n: number }>("SELECT COUNT(*) AS n FROM machines WHERE org = ? AND pool = ? AND state <> 'destroyed'", [p.org, input.name]);
        if (Number(live?.n ?? 0) > 0) {
          throw new BerthError(
            "conflict",
            `conflict: pool ${input.name} has live machines as ${existing.access}/${existing.provider}/${existing.compatibilityKey}; drain it before changing access, provider or compatibility key`,
          );
        }
      }
      await tx.run(
        "UPDATE pools SET access = ?, provider = ?, compatibility_key = ?, identity = ?, min_ready = ?, max_ready = ?, hard_ttl_ms = ?, heartbeat_ms = ?, keeper_key = ?, updated_at = ? WHERE org = ? AND name = ?",
        [input.access, input.provider, input.compatibilityKey, input.identity ? JSON.stringify(input.identity) : null, input.minReady, input.maxReady, input.hardTtlMs, input.heartbeatMs, input.keeperKey, now, p.org, input.name],
      );
    }
    const pool = (await lockPool(tx, p.org, input.name))!;
    const filled = await fillPool(tx, ctx, pool, now, seed);
    // Keep the reconciler looking at this pool while it is short.
    await setDue(tx, "fill", poolRef(p.org, input.name), now + 1000);
    const counts = await countCapacity(tx, p.org, input.name, now);
    return { pool, counts, claims: filled.issued, note: filled.why };
  }, { name: "ensure" });
  if (result.claims.length > 0) ctx.kick();
  // Claims of a self-provisioning provider are the coordinator's own; their tokens never leave it.
  const provider = ctx.providers.get(input.provider);
  return provider?.capabilities.provision ? { ...result, claims: [] } : result;
}

export async function getPool(ctx: Ctx, p: Principal, name: string): Promise<{ pool: PoolRecord; counts: CapacityCounts; states: Record<string, number> }> {
  const now = ctx.now();
  return ctx.store.transaction(async (tx) => {
    const row = await tx.get<PoolRow>("SELECT * FROM pools WHERE org = ? AND name = ?", [p.org, name]);
    if (!row) throw new BerthError("not_found", `not_found: no pool named ${name} in this organisation`);
    const counts = await countCapacity(tx, p.org, name, now);
    const states: Record<string, number> = {};
    for (const r of await tx.all<{ state: string; n: number }>("SELECT state, COUNT(*) AS n FROM machines WHERE org = ? AND pool = ? GROUP BY state", [p.org, name])) {
      states[r.state] = Number(r.n);
    }
    return { pool: poolFromRow(row), counts, states };
  });
}

export async function listPools(ctx: Ctx, p: Principal): Promise<Array<{ pool: PoolRecord; ready: number; total: number }>> {
  return ctx.store.transaction(async (tx) => {
    const pools = await tx.all<PoolRow>("SELECT * FROM pools WHERE org = ? ORDER BY name", [p.org]);
    const counts = await tx.all<{ pool: string; ready: number; total: number }>(
      "SELECT pool, SUM(CASE WHEN state = 'ready' THEN 1 ELSE 0 END) AS ready, COUNT(*) AS total FROM machines WHERE org = ? AND state <> 'destroyed' GROUP BY pool",
      [p.org],
    );
    const byPool = new Map(counts.map((c) => [c.pool, c]));
    return pools.map((r) => ({ pool: poolFromRow(r), ready: Number(byPool.get(r.name)?.ready ?? 0), total: Number(byPool.get(r.name)?.total ?? 0) }));
  });
}

