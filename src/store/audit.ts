/** The `audit` table: an append-only trail of every machine state change (with why, migration 11: `detail`). */
import type { Migration } from "./migrate.js";
import type { Tx } from "./store.js";

export const AUDIT_DETAIL_MIGRATION: Migration = {
  version: 11,
  name: "audit detail",
  sql: `
ALTER TABLE audit ADD COLUMN detail TEXT;
`,
};

export interface AuditEntry {
  at: number;
  machineId: string;
  subject: string | null;
  event: string;
  from: string | null;
  to: string;
  generation: number;
  actor: string;
  /** Why, where the event carries a reason (quarantine, drain): e.g. what changed in a machine's network rules. */
  detail?: string | null;
}

export async function audit(tx: Tx, e: AuditEntry): Promise<void> {
  await tx.write(
    "INSERT INTO audit (at, machine_id, subject, event, from_state, to_state, generation, actor, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
    [e.at, e.machineId, e.subject, e.event, e.from, e.to, e.generation, e.actor, e.detail ?? null],
  );
}

/** A machine's trail, newest first (at most `limit` entries). */
export async function machineTrail(tx: Tx, machineId: string, limit: number): Promise<Array<AuditEntry & { seq: number }>> {
  const rows = await tx.all<{ seq: number; at: number; machine_id: string; subject: string | null; event: string; from_state: string | null; to_state: string; generation: number; actor: string; detail: string | null }>(
    "SELECT seq, at, machine_id, subject, event, from_state, to_state, generation, actor, detail FROM audit WHERE machine_id = ? ORDER BY seq DESC LIMIT ?",
    [machineId, limit],
  );
  return rows.map((r) => ({ seq: Number(r.seq), at: r.at, machineId: r.machine_id, subject: r.subject, event: r.event, from: r.from_state, to: r.to_state, generation: r.generation, actor: r.actor, detail: r.detail }));
}
