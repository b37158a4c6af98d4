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

/** A machine's trail, newest first (at most `limit` entries). */
export async function machineTrail(tx: Tx, machineId: string, limit: number): Promise<Array<AuditEntry & { seq: number }>> {
  const rows = await tx.all<{ seq: number; at: number; machine_id: string; subject: string | null; event: string; from_state: string | null; to_state: string; generation: number; actor: string }>(
    "SELECT seq, at, machine_id, subject, event, from_state, to_state, generation, actor FROM audit WHERE machine_id = ? ORDER BY seq DESC LIMIT ?",
    [machineId, limit],
  );
  return rows.map((r) => ({ seq: Number(r.seq), at: r.at, machineId: r.machine_id, subject: r.subject, event: r.event, from: r.from_state, to: r.to_state, generation: r.generation, actor: r.actor }));
}
