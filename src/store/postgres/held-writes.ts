/**
 * Held writes on PostgreSQL (`Tx.write`): consecutive writes to different
 * tables leave in one statement, each a data-modifying CTE whose rows are
 * counted:
 *
 *   WITH w0 AS (UPDATE machines … RETURNING 1), w1 AS (INSERT INTO audit … RETURNING 1)
 *   SELECT (SELECT count(*) FROM w0) AS n0, (SELECT count(*) FROM w1) AS n1
 *
 * Every CTE of a statement sees the rows as they were before it, so two
 * writes to one table (an upsert and a delete of the same key, say) never
 * share a statement — a write to a table already held sends the held ones
 * first — unless each names the one row it touches and the rows differ
 * (due-index rows by `kind:ref`). Reads send them first too, so a transaction always reads its own
 * writes. Placeholders stay portable (`?`), numbered when the statement is
 * sent.
 */
import { checkWrite, writeTable, type Param, type WriteExpectation, type WriteOptions } from "../store.js";

export interface HeldWrite {
  sql: string;
  params: readonly Param[];
  table: string;
  row?: string;
  expect?: WriteExpectation;
}

/** A write to hold; throws for anything `Tx.write` does not take. */
export function heldWrite(sql: string, params: readonly Param[], opts: WriteOptions = {}): HeldWrite {
  return { sql, params, table: writeTable(sql), row: opts.row, expect: opts.expect };
}

/** True when `b` may not share a statement with the held `a`: one table, and not two different named rows. */
export function sameStatementRisk(a: HeldWrite, b: HeldWrite): boolean {
  return a.table === b.table && (a.row === undefined || b.row === undefined || a.row === b.row);
}

/** One statement for several held writes, in order; its single row has a count `n<i>` per write. */
export function batchStatement(writes: readonly HeldWrite[]): { sql: string; params: Param[] } {
  const ctes = writes.map((w, i) => `w${i} AS (${w.sql} RETURNING 1)`);
  const counts = writes.map((_, i) => `(SELECT count(*) FROM w${i})::int AS n${i}`);
  return { sql: `WITH ${ctes.join(", ")} SELECT ${counts.join(", ")}`, params: writes.flatMap((w) => [...w.params]) };
}

/** Checks each write of a batch against its expectation, given the batch's count row. */
export function checkBatch(writes: readonly HeldWrite[], counts: Record<string, number>): void {
  writes.forEach((w, i) => checkWrite(Number(counts[`n${i}`]), w.expect));
}
