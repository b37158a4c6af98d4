/** The `audit` table: an append-only trail of every machine state change. */
import type { Tx } from "./store.js";

export interface AuditEntry {
  at: number;
  machineId: string;
  subject: string | null;
  event: string;
  from: string | null;
  to: string;
  generation: number;
  actor: string;
}

export async function audit(tx: Tx, e: AuditEntry): Promise<void> {
  await tx.write(
    "INSERT INTO audit (at, machine_id, subject, event, from_state, to_state, generation, actor) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
    [e.at, e.machineId, e.subject, e.event, e.from, e.to, e.generation, e.actor],
  );
}
