import type { Tx } from "../../store/store.js";
import { poolFromRow, type PoolRow } from "../../store/rows.js";
import type { PoolRecord } from "../../core/pool.js";

/**
 * Reads a pool row without locking it: borrows need the pool's settings, not
 * exclusion from other borrows or from ensure (machine rows are locked one by
 * one, and a borrow moves ready to busy, which leaves the capacity total as it was).
 */
export async function readPool(tx: Tx, org: string, name: string): Promise<PoolRecord | undefined> {
  const row = await tx.get<PoolRow>(`SELECT * FROM pools WHERE org = ? AND name = ?`, [org, name]);
  return row ? poolFromRow(row) : undefined;
}
