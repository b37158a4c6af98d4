/**
 * The `claims` table: a fill claim funds exactly one machine and is consumed
 * by its registration (or expires).
 */
import type { Tx } from "./store.js";

export interface ClaimRow {
  id: string;
  org: string;
  pool: string;
  token_hash: string;
  state: "open" | "consumed" | "expired";
  created_at: number;
  expires_at: number;
  machine_id: string | null;
}

export async function insertClaim(tx: Tx, c: { id: string; org: string; pool: string; tokenHash: string; now: number; expiresAt: number }): Promise<void> {
  await tx.run("INSERT INTO claims (id, org, pool, token_hash, state, created_at, expires_at, machine_id) VALUES (?, ?, ?, ?, 'open', ?, ?, NULL)", [
    c.id, c.org, c.pool, c.tokenHash, c.now, c.expiresAt,
  ]);
}

export async function lockClaim(tx: Tx, id: string): Promise<ClaimRow | undefined> {
  return tx.get<ClaimRow>(`SELECT * FROM claims WHERE id = ?${tx.forUpdate}`, [id]);
}

export async function lockClaimByTokenHash(tx: Tx, tokenHash: string): Promise<ClaimRow | undefined> {
  return tx.get<ClaimRow>(`SELECT * FROM claims WHERE token_hash = ?${tx.forUpdate}`, [tokenHash]);
}

/** The machine a claim funds (set when the coordinator provisions it). */
export async function setClaimMachine(tx: Tx, id: string, machineId: string): Promise<void> {
  await tx.run("UPDATE claims SET machine_id = ? WHERE id = ?", [machineId, id]);
}

/** Consumes a claim (with the registered machine, when it was not known before). */
export async function consumeClaim(tx: Tx, id: string, machineId?: string): Promise<void> {
  if (machineId === undefined) await tx.run("UPDATE claims SET state = 'consumed' WHERE id = ?", [id]);
  else await tx.run("UPDATE claims SET state = 'consumed', machine_id = ? WHERE id = ?", [machineId, id]);
}

export async function expireClaim(tx: Tx, id: string): Promise<void> {
  await tx.run("UPDATE claims SET state = 'expired' WHERE id = ?", [id]);
}

/** Prunes an expired claim; resolves to the rows deleted. */
export async function deleteExpiredClaim(tx: Tx, id: string): Promise<number> {
  return tx.run("DELETE FROM claims WHERE id = ? AND state = 'expired'", [id]);
}

export async function countOpenClaims(tx: Tx, org: string, pool: string, now: number): Promise<number> {
  const r = await tx.get<{ n: number }>("SELECT COUNT(*) AS n FROM claims WHERE org = ? AND pool = ? AND state = 'open' AND expires_at > ?", [org, pool, now]);
  return Number(r?.n ?? 0);
}
