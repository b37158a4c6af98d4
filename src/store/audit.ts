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

export interface OrgAuditEntry extends AuditEntry {
  seq: number;
  /** The machine's or host's name where it is a host's entry (host ids share the column). */
  hostName: string | null;
  /** The entry's record is a machine of the organisation (its page exists). */
  isMachine: boolean;
}

/**
 * An organisation's trail, newest first: entries of its machines and hosts
 * (a machine pruned after retention no longer names its organisation: its
 * entries stay in the table but are not listed). Filters are exact; `before`
 * pages by sequence number.
 */
export async function orgTrail(tx: Tx, org: string, f: { event?: string; record?: string; before?: number; limit: number }): Promise<OrgAuditEntry[]> {
  const where: string[] = ["(m.org = ? OR h.org = ?)"];
  const params: Array<string | number> = [org, org];
  const add = (sql: string, v: string | number) => {
    where.push(sql);
    params.push(v);
  };
  if (f.event) add("a.event = ?", f.event);
  if (f.record) add("a.machine_id = ?", f.record);
  if (f.before !== undefined) add("a.seq < ?", f.before);
  params.push(f.limit);
  const rows = await tx.all<{ seq: number; at: number; machine_id: string; subject: string | null; event: string; from_state: string | null; to_state: string; generation: number; actor: string; detail: string | null; host_name: string | null; m_id: string | null }>(
    `SELECT a.seq, a.at, a.machine_id, a.subject, a.event, a.from_state, a.to_state, a.generation, a.actor, a.detail, h.name AS host_name, m.id AS m_id
     FROM audit a LEFT JOIN machines m ON m.id = a.machine_id LEFT JOIN hosts h ON h.id = a.machine_id
     WHERE ${where.join(" AND ")} ORDER BY a.seq DESC LIMIT ?`,
    params,
  );
  return rows.map((r) => ({ seq: Number(r.seq), at: Number(r.at), machineId: r.machine_id, subject: r.subject, event: r.event, from: r.from_state, to: r.to_state, generation: r.generation, actor: r.actor, detail: r.detail, hostName: r.host_name, isMachine: r.m_id !== null }));
}

/** The events an organisation's trail holds (the audit view's filter). */
export async function orgAuditEvents(tx: Tx, org: string): Promise<string[]> {
  const rows = await tx.all<{ event: string }>(
    "SELECT DISTINCT a.event FROM audit a LEFT JOIN machines m ON m.id = a.machine_id LEFT JOIN hosts h ON h.id = a.machine_id WHERE (m.org = ? OR h.org = ?) ORDER BY a.event",
    [org, org],
  );
  return rows.map((r) => r.event);
}
