/**
 * The `due` table: every deadline is one row `(kind, ref, due_at)`. The
 * reconciler takes due rows one at a time (SKIP LOCKED on PostgreSQL).
 */
import type { Tx } from "./store.js";

/** Kinds of rows in the due index; each names what its `ref` points at. */
export type DueKind = "heartbeat" | "claim" | "fill" | "ttl" | "retention" | "op" | "ack" | "grant" | "revoke" | "alloc_expiry" | "alloc_launch" | "alloc_cleanup" | "host_standing" | "alloc_watch" | "alloc_restart";

export interface DueRow {
  kind: string;
  ref: string;
  due_at: number;
}

export async function setDue(tx: Tx, kind: DueKind, ref: string, at: number): Promise<void> {
  await tx.write("INSERT INTO due (kind, ref, due_at) VALUES (?, ?, ?) ON CONFLICT (kind, ref) DO UPDATE SET due_at = excluded.due_at", [kind, ref, at], { row: `${kind}:${ref}` });
}

/** Sets the due time only if the row is absent or due later (never postpones an earlier wake). */
export async function setDueNoLater(tx: Tx, kind: DueKind, ref: string, at: number): Promise<void> {
  await tx.write(
    "INSERT INTO due (kind, ref, due_at) VALUES (?, ?, ?) ON CONFLICT (kind, ref) DO UPDATE SET due_at = excluded.due_at WHERE due.due_at > excluded.due_at",
    [kind, ref, at],
    { row: `${kind}:${ref}` },
  );
}

/** Pushes back a due row of a kind this coordinator does not know (a newer coordinator's), so it does not block the index. */
export async function deferUnknownDue(tx: Tx, row: { kind: string; ref: string }, at: number): Promise<void> {
  await tx.write("UPDATE due SET due_at = ? WHERE kind = ? AND ref = ?", [at, row.kind, row.ref], { row: `${row.kind}:${row.ref}` });
}

/** Whether a row of this kind and ref is armed. */
export async function hasDue(tx: Tx, kind: DueKind, ref: string): Promise<boolean> {
  return (await tx.get<{ n: number }>("SELECT 1 AS n FROM due WHERE kind = ? AND ref = ?", [kind, ref])) !== undefined;
}

export async function clearDue(tx: Tx, kind: DueKind, ref: string): Promise<void> {
  await tx.write("DELETE FROM due WHERE kind = ? AND ref = ?", [kind, ref], { row: `${kind}:${ref}` });
}

/**
 * Asks for a fill check of a pool no later than `now` after a borrow took one
 * of its ready machines, without queueing borrows behind each other on the
 * pool's one `fill` row.
 *
 * On PostgreSQL, when a check is already pending (the row exists, due by
 * `now`), the borrow takes only a KEY SHARE lock on it: borrows share that
 * lock, so they neither write the row nor wait for each other. The lock is
 * what keeps the wake-up: the reconciler's fill visit deletes the row before
 * it counts, and the delete waits until every borrow holding the lock has
 * committed, so the count it then takes includes their machines. A borrow
 * that arrives while the reconciler holds the row waits for it and, the row
 * being gone, inserts a new one. Otherwise (no row, or one due later) the
 * statement sets it to `now`, as `setDueNoLater` does. On SQLite (one writer
 * at a time) it is `setDueNoLater`.
 */
export async function requestFillCheck(tx: Tx, ref: string, now: number): Promise<void> {
  if (tx.dialect !== "postgres") return setDueNoLater(tx, "fill", ref, now);
  await tx.run(
    `WITH pending AS (SELECT 1 FROM due WHERE kind = 'fill' AND ref = ? AND due_at <= ? FOR KEY SHARE)
     INSERT INTO due (kind, ref, due_at) SELECT 'fill', ?, ? WHERE NOT EXISTS (SELECT 1 FROM pending)
     ON CONFLICT (kind, ref) DO UPDATE SET due_at = excluded.due_at WHERE due.due_at > excluded.due_at`,
    [ref, now, ref, now],
  );
}

/**
 * The earliest row due at `now`, locked; rows another coordinator holds are
 * skipped. On PostgreSQL the lock is NO KEY UPDATE: it excludes other
 * reconcilers (and upserts of the row) as FOR UPDATE would, but not borrows
 * holding a fill row's KEY SHARE lock (requestFillCheck), which would
 * otherwise keep that row skipped while borrows keep coming.
 */
export async function takeDueRow(tx: Tx, now: number): Promise<DueRow | undefined> {
  const lock = tx.dialect === "postgres" ? " FOR NO KEY UPDATE SKIP LOCKED" : tx.skipLocked;
  return tx.get<DueRow>(`SELECT kind, ref, due_at FROM due WHERE due_at <= ? ORDER BY due_at, kind, ref LIMIT 1${lock}`, [now]);
}

/** The `ref` of a pool's fill row. */
export function poolRef(org: string, pool: string): string {
  return `${org}:${pool}`;
}
