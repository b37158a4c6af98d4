/**
 * The `due` table: every deadline is one row `(kind, ref, due_at)`. The
 * reconciler takes due rows one at a time (SKIP LOCKED on PostgreSQL).
 */
import type { Tx } from "./store.js";

/** Kinds of rows in the due index; each names what its `ref` points at. */
export type DueKind = "heartbeat" | "claim" | "fill" | "ttl" | "retention" | "op" | "ack" | "grant" | "revoke" | "alloc_expiry";

export interface DueRow {
  kind: string;
  ref: string;
  due_at: number;
}

export async function setDue(tx: Tx, kind: DueKind, ref: string, at: number): Promise<void> {
  await tx.run("INSERT INTO due (kind, ref, due_at) VALUES (?, ?, ?) ON CONFLICT (kind, ref) DO UPDATE SET due_at = excluded.due_at", [kind, ref, at]);
}

/** Sets the due time only if the row is absent or due later (never postpones an earlier wake). */
export async function setDueNoLater(tx: Tx, kind: DueKind, ref: string, at: number): Promise<void> {
  await tx.run(
    "INSERT INTO due (kind, ref, due_at) VALUES (?, ?, ?) ON CONFLICT (kind, ref) DO UPDATE SET due_at = excluded.due_at WHERE due.due_at > excluded.due_at",
    [kind, ref, at],
  );
}

export async function clearDue(tx: Tx, kind: DueKind, ref: string): Promise<void> {
  await tx.run("DELETE FROM due WHERE kind = ? AND ref = ?", [kind, ref]);
}

/** The earliest row due at `now`, locked; rows another coordinator holds are skipped. */
export async function takeDueRow(tx: Tx, now: number): Promise<DueRow | undefined> {
  return tx.get<DueRow>(`SELECT kind, ref, due_at FROM due WHERE due_at <= ? ORDER BY due_at, kind, ref LIMIT 1${tx.skipLocked}`, [now]);
}

/** The `ref` of a pool's fill row. */
export function poolRef(org: string, pool: string): string {
  return `${org}:${pool}`;
}
