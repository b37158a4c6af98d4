/**
 * Keys removed by `remove_key` (table `removed_keys`, migration 1), so that a
 * delayed `install_key` of the same grant or key at the same generation never
 * restores it.
 */
import type { Statements } from "../../store/sqlite/statements.js";

export class RemovedKeyTable {
  constructor(private readonly q: Statements) {}

  record(machineId: string, generation: number, grantId: string | null, fingerprint: string | null, now: number): void {
    this.q("INSERT INTO removed_keys (machine_id, generation, grant_id, fingerprint, removed_at) VALUES (?, ?, ?, ?, ?)")
      .run(machineId, generation, grantId, fingerprint, now);
  }

  /** Whether this grant or key was removed from the machine at this generation. */
  wasRemoved(machineId: string, generation: number, grantId: string, fingerprint: string): boolean {
    return (
      this.q("SELECT 1 FROM removed_keys WHERE machine_id = ? AND generation = ? AND (grant_id = ? OR fingerprint = ?) LIMIT 1")
        .get(machineId, generation, grantId, fingerprint) !== undefined
    );
  }

  /** Tombstones of older generations can never matter again (installs for them are refused). */
  prune(machineId: string, belowGeneration: number): void {
    this.q("DELETE FROM removed_keys WHERE machine_id = ? AND generation < ?").run(machineId, belowGeneration);
  }
}
