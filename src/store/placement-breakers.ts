/**
 * Provisioning breakers per placement (migration 19, `placement_breakers`):
 * the same counting as a pool's breaker (provision-breaker.ts), kept per
 * (pool, placement), where a placement is what a self-placed provider names
 * as the place an attempt launched in (the aws provider: `region/instance
 * type/subnet`). A placement whose breaker is open is left out of the pool's
 * next launches, so they move to its next configured placement; a provision
 * proven on a placement closes that placement's breaker; `berth pool
 * resume` closes all of the pool's.
 */
import type { Migration } from "./migrate.js";
import type { Tx } from "./store.js";
import { afterFailure, type Breaker, type BreakerSettings } from "./provision-breaker.js";

export const PLACEMENT_BREAKERS_MIGRATION: Migration = {
  version: 19,
  name: "placement breakers",
  sql: `
CREATE TABLE placement_breakers (
  org TEXT NOT NULL,
  pool TEXT NOT NULL,
  placement TEXT NOT NULL,
  failures INTEGER NOT NULL,
  trips INTEGER NOT NULL,
  open_until BIGINT,
  cause TEXT,
  updated_at BIGINT NOT NULL,
  PRIMARY KEY (org, pool, placement)
);
`,
};

export type PlacementBreaker = Breaker & { placement: string };

type Row = { placement: string; failures: number; trips: number; open_until: number | string | null; cause: string | null };

function fromRow(r: Row): PlacementBreaker {
  return { placement: r.placement, failures: Number(r.failures), trips: Number(r.trips), openUntil: r.open_until === null ? null : Number(r.open_until), cause: r.cause };
}

/** Every placement of the pool with a failure since its last success, by placement. */
export async function readPlacementBreakers(tx: Tx, org: string, pool: string): Promise<PlacementBreaker[]> {
  const rows = await tx.all<Row>("SELECT placement, failures, trips, open_until, cause FROM placement_breakers WHERE org = ? AND pool = ? ORDER BY placement", [org, pool]);
  return rows.map(fromRow);
}

/** The placements of the pool whose breaker is open now. */
export async function openPlacements(tx: Tx, org: string, pool: string, now: number): Promise<string[]> {
  return (await readPlacementBreakers(tx, org, pool)).filter((b) => b.openUntil !== null && b.openUntil > now).map((b) => b.placement);
}

/** A provision launched on `placement` was given up: count it; open that placement's breaker at the threshold. Resolves to it when it opened now. */
export async function placementGaveUp(tx: Tx, org: string, pool: string, placement: string, cause: string, now: number, s: BreakerSettings): Promise<PlacementBreaker | null> {
  const had = (await readPlacementBreakers(tx, org, pool)).find((b) => b.placement === placement) ?? null;
  const { next, opened } = afterFailure(had, cause, now, s);
  await tx.run("DELETE FROM placement_breakers WHERE org = ? AND pool = ? AND placement = ?", [org, pool, placement]);
  await tx.run("INSERT INTO placement_breakers (org, pool, placement, failures, trips, open_until, cause, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", [
    org,
    pool,
    placement,
    next.failures,
    next.trips,
    next.openUntil,
    next.cause,
    now,
  ]);
  return opened ? { ...next, placement } : null;
}

/** A provision was proven on `placement`: its breaker closes, counts cleared. */
export async function closePlacement(tx: Tx, org: string, pool: string, placement: string): Promise<void> {
  await tx.run("DELETE FROM placement_breakers WHERE org = ? AND pool = ? AND placement = ?", [org, pool, placement]);
}

/** The operator resumed the pool: every placement breaker of it closes. */
export async function closePlacements(tx: Tx, org: string, pool: string): Promise<void> {
  await tx.run("DELETE FROM placement_breakers WHERE org = ? AND pool = ?", [org, pool]);
}
