/** Bulk rows for scale tests and benches: multi-row INSERTs, a few hundred rows per statement. */
import type { Param, Tx } from "../../src/store/store.js";

export async function insertMany(tx: Tx, table: string, columns: string[], rows: Param[][]): Promise<void> {
  const per = Math.max(1, Math.floor(800 / columns.length));
  for (let i = 0; i < rows.length; i += per) {
    const chunk = rows.slice(i, i + per);
    const one = `(${columns.map(() => "?").join(", ")})`;
    await tx.run(`INSERT INTO ${table} (${columns.join(", ")}) VALUES ${chunk.map(() => one).join(", ")}`, chunk.flat());
  }
}

const HOUR = 3_600_000;

export const MACHINE_COLUMNS = ["id", "org", "pool", "access", "provider", "resource_id", "state", "generation", "claim_id", "created_at", "state_since", "ready_since", "hard_expires_at"];

/** A machine row of pool `pool` in org `org`, in `state` since an hour ago, its hard TTL a day away. */
export function machineRow(id: string, state: string, now: number, org = "acme", pool = "ci"): Param[] {
  return [id, org, pool, "keeper", "external", `vm-${id}`, state, 0, `clm_${id}`, now - HOUR, now - HOUR, state === "ready" ? now - HOUR : null, now + 24 * HOUR];
}
