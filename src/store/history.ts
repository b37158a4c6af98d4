/**
 * The dashboard's history (migration 17, `history`): one row per
 * (organisation, pool, 10-second bucket, coordinator instance) with the
 * borrows that instance served and saw returned in the bucket, its borrow
 * latency histogram (the bounds of `berth_borrow_latency_seconds`), and the
 * pool's machines by state class counted at the bucket's end.
 *
 * Each coordinator writes its own rows (several share one PostgreSQL
 * database); a read adds the counts and histograms of every instance and
 * takes the largest state count. Rows older than the retention (24 h) are
 * deleted at each write, so the table holds at most 8,640 rows per pool per
 * coordinator instance.
 */
import type { Migration } from "./migrate.js";
import type { Tx } from "./store.js";

export const HISTORY_MIGRATION: Migration = {
  version: 17,
  name: "history",
  sql: `
CREATE TABLE history (
  org TEXT NOT NULL,
  pool TEXT NOT NULL,
  at BIGINT NOT NULL,
  instance TEXT NOT NULL,
  started INTEGER NOT NULL,
  returned INTEGER NOT NULL,
  latency TEXT NOT NULL,
  ready INTEGER NOT NULL,
  lent INTEGER NOT NULL,
  cleanup INTEGER NOT NULL,
  quarantined INTEGER NOT NULL,
  PRIMARY KEY (org, pool, at, instance)
);
CREATE INDEX history_at ON history (at);
`,
};

/** One bucket's width. */
export const HISTORY_BUCKET_MS = 10_000;
/** How long buckets are kept. */
export const HISTORY_RETENTION_MS = 24 * 3_600_000;

export interface HistoryRow {
  org: string;
  pool: string;
  /** The bucket's start (epoch ms, a multiple of HISTORY_BUCKET_MS). */
  at: number;
  started: number;
  returned: number;
  /** Borrow latency: per-bucket counts (not cumulative; the last is above every bound). */
  latency: number[];
  /** Machines by state class at the bucket's end; null where the bucket was not closed yet (this process's open bucket). */
  ready: number | null;
  lent: number | null;
  cleanup: number | null;
  quarantined: number | null;
}

export async function writeHistory(tx: Tx, instance: string, rows: readonly HistoryRow[], now: number): Promise<void> {
  for (const r of rows) {
    await tx.write(
      `INSERT INTO history (org, pool, at, instance, started, returned, latency, ready, lent, cleanup, quarantined) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
       ON CONFLICT (org, pool, at, instance) DO UPDATE SET started = excluded.started, returned = excluded.returned, latency = excluded.latency,
       ready = excluded.ready, lent = excluded.lent, cleanup = excluded.cleanup, quarantined = excluded.quarantined`,
      [r.org, r.pool, r.at, instance, r.started, r.returned, JSON.stringify(r.latency), r.ready ?? 0, r.lent ?? 0, r.cleanup ?? 0, r.quarantined ?? 0],
    );
  }
  await tx.write("DELETE FROM history WHERE at < ?", [now - HISTORY_RETENTION_MS]);
}

/** Machines of every organisation's pools by state, for the buckets' state counts. */
export async function machineStatesOfAllPools(tx: Tx): Promise<Array<{ org: string; pool: string; state: string; n: number }>> {
  const rows = await tx.all<{ org: string; pool: string; state: string; n: number }>("SELECT org, pool, state, COUNT(*) AS n FROM machines WHERE state <> 'destroyed' GROUP BY org, pool, state");
  return rows.map((r) => ({ ...r, n: Number(r.n) }));
}

/** Every pool of every organisation (a pool with no machine still has a row per bucket). */
export async function allPools(tx: Tx): Promise<Array<{ org: string; pool: string }>> {
  return tx.all<{ org: string; pool: string }>("SELECT org, name AS pool FROM pools");
}

/** A pool's buckets from `from` on, every instance's merged, oldest first. */
export async function readHistory(tx: Tx, org: string, pool: string, from: number): Promise<HistoryRow[]> {
  const rows = await tx.all<{ at: number; started: number; returned: number; latency: string; ready: number; lent: number; cleanup: number; quarantined: number }>(
    "SELECT at, started, returned, latency, ready, lent, cleanup, quarantined FROM history WHERE org = ? AND pool = ? AND at >= ? ORDER BY at",
    [org, pool, from],
  );
  const out: HistoryRow[] = [];
  for (const r of rows) {
    const at = Number(r.at);
    const latency = JSON.parse(r.latency) as number[];
    const last = out[out.length - 1];
    if (last && last.at === at) {
      last.started += r.started;
      last.returned += r.returned;
      last.latency = last.latency.map((n, i) => n + (latency[i] ?? 0));
      last.ready = Math.max(last.ready ?? 0, r.ready);
      last.lent = Math.max(last.lent ?? 0, r.lent);
      last.cleanup = Math.max(last.cleanup ?? 0, r.cleanup);
      last.quarantined = Math.max(last.quarantined ?? 0, r.quarantined);
    } else {
      out.push({ org, pool, at, started: r.started, returned: r.returned, latency, ready: r.ready, lent: r.lent, cleanup: r.cleanup, quarantined: r.quarantined });
    }
  }
  return out;
}
