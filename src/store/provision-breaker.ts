/**
 * The provisioning circuit breaker of a pool (migration 15, `pool_breakers`):
 * consecutive provisions given up, and, once they reach the threshold, a
 * pause of the pool's filling until `open_until` (doubling with each trip
 * in a row, capped). A provision that succeeds closes it; `berth pool
 * ensure` (the operator acted) closes it too. The cause is the last
 * failure's error, shown by `berth pool show`.
 */
import type { Migration } from "./migrate.js";
import type { Tx } from "./store.js";

export const PROVISION_BREAKER_MIGRATION: Migration = {
  version: 15,
  name: "provision breaker",
  sql: `
CREATE TABLE pool_breakers (
  org TEXT NOT NULL,
  pool TEXT NOT NULL,
  failures INTEGER NOT NULL,
  trips INTEGER NOT NULL,
  open_until BIGINT,
  cause TEXT,
  updated_at BIGINT NOT NULL,
  PRIMARY KEY (org, pool)
);
`,
};

export interface Breaker {
  /** Provisions given up in a row since the last success. */
  failures: number;
  /** Times it opened in a row since the last success. */
  trips: number;
  /** Filling is paused until then (null: closed). */
  openUntil: number | null;
  cause: string | null;
}

export interface BreakerSettings {
  threshold: number;
  backoffMs: number;
  maxBackoffMs: number;
}

export async function readBreaker(tx: Tx, org: string, pool: string): Promise<Breaker | null> {
  const r = await tx.get<{ failures: number; trips: number; open_until: number | string | null; cause: string | null }>("SELECT failures, trips, open_until, cause FROM pool_breakers WHERE org = ? AND pool = ?", [org, pool]);
  if (!r) return null;
  return { failures: Number(r.failures), trips: Number(r.trips), openUntil: r.open_until === null ? null : Number(r.open_until), cause: r.cause };
}

/** Is filling paused now? The breaker when it is, else null. */
export async function openBreaker(tx: Tx, org: string, pool: string, now: number): Promise<Breaker | null> {
  const b = await readBreaker(tx, org, pool);
  return b && b.openUntil !== null && b.openUntil > now ? b : null;
}

/** The breaker after one more failure: counted; opened at the threshold (for a backoff doubling with each trip in a row, capped). */
export function afterFailure(b: Breaker | null, cause: string, now: number, s: BreakerSettings): { next: Breaker; opened: boolean } {
  const was = b ?? { failures: 0, trips: 0, openUntil: null, cause: null };
  const failures = was.failures + 1;
  let { trips, openUntil } = was;
  let opened = false;
  if (failures >= s.threshold) {
    openUntil = now + Math.min(s.backoffMs * 2 ** trips, s.maxBackoffMs);
    trips += 1;
    opened = true;
  }
  // After a trip, the count starts again: the next window lets `threshold` more attempts through before pausing again (longer).
  return { next: { failures: opened ? 0 : failures, trips, openUntil, cause: cause.slice(0, 500) }, opened };
}

/** A provision of the pool was given up: count it; open the breaker at the threshold. Resolves to the breaker when it opened now. */
export async function provisionGaveUp(tx: Tx, org: string, pool: string, cause: string, now: number, s: BreakerSettings): Promise<Breaker | null> {
  const { next, opened } = afterFailure(await readBreaker(tx, org, pool), cause, now, s);
  await tx.run("DELETE FROM pool_breakers WHERE org = ? AND pool = ?", [org, pool]);
  await tx.run("INSERT INTO pool_breakers (org, pool, failures, trips, open_until, cause, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)", [org, pool, next.failures, next.trips, next.openUntil, next.cause, now]);
  return opened ? next : null;
}

/** A provision succeeded, or the operator re-ensured the pool: closed, counts cleared. */
export async function closeBreaker(tx: Tx, org: string, pool: string): Promise<void> {
  await tx.run("DELETE FROM pool_breakers WHERE org = ? AND pool = ?", [org, pool]);
}
