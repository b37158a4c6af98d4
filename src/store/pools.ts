/** The `pools` table: desired capacity and settings of each pool, keyed by (org, name). */
import { filesScopeColumn, filesScopeOf } from "./files-scope.js";
import { forwardingColumn, forwardingOf } from "./forwarding.js";
import type { Tx } from "./store.js";
import type { PoolRecord } from "../core/pool.js";
import { parsePolicy } from "../core/network-policy.js";

export interface PoolRow {
  org: string;
  name: string;
  access: string;
  provider: string;
  compatibility_key: string;
  identity: string | null;
  min_ready: number;
  max_ready: number;
  hard_ttl_ms: number;
  heartbeat_ms: number;
  keeper_key: string | null;
  network?: string | null;
  /** Canonical image reference (migration 8); NULL: the host's root. */
  image?: string | null;
  /** "off" (migration 13): forwards refused; NULL: on. */
  forwarding?: string | null;
  /** "workspace" (migration 16): SFTP confined; NULL: machine. */
  files_scope?: string | null;
  created_at: number;
  updated_at: number;
}

export function poolFromRow(r: PoolRow): PoolRecord {
  return {
    org: r.org,
    name: r.name,
    access: r.access as PoolRecord["access"],
    provider: r.provider as PoolRecord["provider"],
    compatibilityKey: r.compatibility_key,
    identity: r.identity ? (JSON.parse(r.identity) as PoolRecord["identity"]) : null,
    minReady: r.min_ready,
    maxReady: r.max_ready,
    hardTtlMs: r.hard_ttl_ms,
    heartbeatMs: r.heartbeat_ms,
    keeperKey: r.keeper_key,
    network: parsePolicy(r.network ? JSON.parse(r.network) : null),
    image: r.image ?? null,
    forwarding: forwardingOf(r),
    files: filesScopeOf(r),
    createdAt: r.created_at,
    updatedAt: r.updated_at,
  };
}

/** Reads and locks a pool row: serializes capacity decisions (ensure, fill, registration). */
export async function lockPool(tx: Tx, org: string, name: string): Promise<PoolRecord | undefined> {
  const row = await tx.get<PoolRow>(`SELECT * FROM pools WHERE org = ? AND name = ?${tx.forUpdate}`, [org, name]);
  return row ? poolFromRow(row) : undefined;
}

/**
 * A keeper borrow's first read: the pool as `readPool` reads it, and in the
 * same statement whether the API token acting (by id) is still live (known
 * and not revoked), read in the borrow's own transaction (coordinator/auth.ts,
 * `TokenCache`).
 */
export async function readPoolAsToken(tx: Tx, org: string, name: string, tokenId: string): Promise<{ pool: PoolRecord | undefined; tokenLive: boolean }> {
  const row = await tx.get<Partial<PoolRow> & { token_live: number | boolean }>(
    "SELECT p.*, t.revoked_at IS NULL AS token_live FROM api_tokens t LEFT JOIN pools p ON p.org = ? AND p.name = ? WHERE t.id = ?",
    [org, name, tokenId],
  );
  if (!row) return { pool: undefined, tokenLive: false };
  return { pool: row.name == null ? undefined : poolFromRow(row as PoolRow), tokenLive: Boolean(row.token_live) };
}

/**
 * Reads a pool row without locking it: borrows need the pool's settings, not
 * exclusion from other borrows or from ensure (machine rows are locked one by
 * one, and a borrow moves ready to busy, which leaves the capacity total as it was).
 */
export async function readPool(tx: Tx, org: string, name: string): Promise<PoolRecord | undefined> {
  const row = await tx.get<PoolRow>(`SELECT * FROM pools WHERE org = ? AND name = ?`, [org, name]);
  return row ? poolFromRow(row) : undefined;
}

export async function listPools(tx: Tx, org: string): Promise<PoolRecord[]> {
  return (await tx.all<PoolRow>("SELECT * FROM pools WHERE org = ? ORDER BY name", [org])).map(poolFromRow);
}

/** What an ensure sets: the pool's record less its key and timestamps. */
export type PoolSettings = Omit<PoolRecord, "org" | "name" | "createdAt" | "updatedAt">;

/** Inserts the pool if absent; resolves to whether it was created. */
export async function insertPoolIfAbsent(tx: Tx, org: string, name: string, s: PoolSettings, now: number): Promise<boolean> {
  const n = await tx.run(
    "INSERT INTO pools (org, name, access, provider, compatibility_key, identity, min_ready, max_ready, hard_ttl_ms, heartbeat_ms, keeper_key, network, image, forwarding, files_scope, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (org, name) DO NOTHING",
    [org, name, s.access, s.provider, s.compatibilityKey, s.identity ? JSON.stringify(s.identity) : null, s.minReady, s.maxReady, s.hardTtlMs, s.heartbeatMs, s.keeperKey, networkColumn(s.network), s.image, forwardingColumn(s.forwarding), filesScopeColumn(s.files), now, now],
  );
  return n > 0;
}

export async function updatePool(tx: Tx, org: string, name: string, s: PoolSettings, now: number): Promise<void> {
  await tx.run(
    "UPDATE pools SET access = ?, provider = ?, compatibility_key = ?, identity = ?, min_ready = ?, max_ready = ?, hard_ttl_ms = ?, heartbeat_ms = ?, keeper_key = ?, network = ?, image = ?, forwarding = ?, files_scope = ?, updated_at = ? WHERE org = ? AND name = ?",
    [s.access, s.provider, s.compatibilityKey, s.identity ? JSON.stringify(s.identity) : null, s.minReady, s.maxReady, s.hardTtlMs, s.heartbeatMs, s.keeperKey, networkColumn(s.network), s.image, forwardingColumn(s.forwarding), filesScopeColumn(s.files), now, org, name],
  );
}

/** The stored form of a policy: NULL for `none` (rows written before migration 5 read the same). */
function networkColumn(p: PoolSettings["network"] | undefined): string | null {
  return p === undefined || p.mode === "none" ? null : JSON.stringify(p);
}

/** A drained pool wants no machines. */
export async function zeroPoolCapacity(tx: Tx, org: string, name: string, now: number): Promise<void> {
  await tx.run("UPDATE pools SET min_ready = 0, max_ready = 0, updated_at = ? WHERE org = ? AND name = ?", [now, org, name]);
}

/** Names of the org's pools filled by a given provider. */
export async function poolNamesOfProvider(tx: Tx, org: string, provider: string): Promise<string[]> {
  return (await tx.all<{ name: string }>("SELECT name FROM pools WHERE org = ? AND provider = ?", [org, provider])).map((r) => r.name);
}
