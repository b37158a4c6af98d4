import type { Tx } from "../../store/store.js";
import { poolFromRow, type PoolRow } from "../../store/rows.js";
import { rotationMarginMs, type Access, type PoolRecord } from "../../core/pool.js";
import type { MachineRow } from "../../store/rows.js";

/**
 * Reads a pool row without locking it: borrows need the pool's settings, not
 * exclusion from other borrows or from ensure (machine rows are locked one by
 * one, and a borrow moves ready to busy, which leaves the capacity total as it was).
 */
export async function readPool(tx: Tx, org: string, name: string): Promise<PoolRecord | undefined> {
  const row = await tx.get<PoolRow>(`SELECT * FROM pools WHERE org = ? AND name = ?`, [org, name]);
  return row ? poolFromRow(row) : undefined;
}

/**
 * The compatible ready machine of the pool's access namespace that has waited
 * longest, excluding machines near their hard TTL (they are being rotated
 * out). On PostgreSQL the row is locked and rows other borrowers hold are
 * skipped, so concurrent borrows never take the same machine.
 */
export async function takeReadyMachine(tx: Tx, pool: PoolRecord, access: Access, now: number): Promise<MachineRow | undefined> {
  return tx.get<MachineRow>(
    `SELECT * FROM machines WHERE org = ? AND pool = ? AND state = 'ready' AND access = ? AND hard_expires_at > ? ORDER BY ready_since, id LIMIT 1${tx.skipLocked}`,
    [pool.org, pool.name, access, now + rotationMarginMs(pool.hardTtlMs)],
  );
}
