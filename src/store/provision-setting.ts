/**
 * A per-machine provision setting: a two-valued column that a pool holds
 * (part of its compatibility: a change rotates its machines) and that each
 * machine row keeps as it was provisioned. NULL stands for the default value
 * in both tables, so rows written before the column existed read as they
 * behaved. The forwarding switch (migration 13) and the files scope
 * (migration 16) are the two. Named statements that compose inside the
 * caller's transaction.
 */
import type { Tx } from "./store.js";

export interface ProvisionSetting<T extends string, C extends string> {
  /** The stored form: NULL for the default value. */
  column(v: T | undefined): string | null;
  /** The value a provisioning machine is made with. */
  setMachine(tx: Tx, machineId: string, v: T): Promise<void>;
  /** The value a row (machine or pool) holds. */
  of(row: { readonly [K in C]?: string | null }): T;
  /** Ready machines of a pool made with another value than `v` (rotated out, never changed live). */
  staleReadyMachineIds(tx: Tx, org: string, pool: string, v: T): Promise<string[]>;
}

/** The setting stored in column `column` of pools and machines: `other` is stored as itself, anything else reads as `byDefault`. */
export function provisionSetting<T extends string, C extends string>(column: C, byDefault: T, other: T): ProvisionSetting<T, C> {
  const stored = (v: T | undefined): string | null => (v === other ? other : null);
  return {
    column: stored,
    async setMachine(tx, machineId, v) {
      await tx.run(`UPDATE machines SET ${column} = ? WHERE id = ?`, [stored(v), machineId]);
    },
    of: (row) => (row[column] === other ? other : byDefault),
    async staleReadyMachineIds(tx, org, pool, v) {
      const rows = await tx.all<{ id: string }>(`SELECT id FROM machines WHERE org = ? AND pool = ? AND state = 'ready' AND COALESCE(${column}, ?) <> ? ORDER BY id`, [org, pool, byDefault, v]);
      return rows.map((r) => r.id);
    },
  };
}
