/**
 * The dashboard's labelled history series (migration 18, `history_series`),
 * beside the pools' buckets of migration 17 and at the same resolution and
 * retention (10-second buckets, kept 24 h):
 *
 * - per pool (`scope` is the pool's name), counted by the coordinator that saw
 *   them: `provision` (provisions given up, label `failed`; the pool's
 *   provisioning breaker opening, label `breaker_open`) and `quarantine`
 *   (machines quarantined, labelled by reason class as
 *   `berth_machines_quarantined_total`'s `reason`). A read sums instances.
 * - per organisation (`scope` is ''), taken at each write from the
 *   allocation accounts: `host_allocations` / `host_vcpu` (label: the host's
 *   name) and `owner_allocations` / `owner_vcpu` (label: the owner's token
 *   id). Only hosts and owners with something in use get a row. Every
 *   coordinator writes the same figures; a read takes the largest.
 */
import type { Migration } from "./migrate.js";
import type { Tx } from "./store.js";
import { HISTORY_RETENTION_MS } from "./history.js";

export const HISTORY_SERIES_MIGRATION: Migration = {
  version: 18,
  name: "history series",
  sql: `
CREATE TABLE history_series (
  org TEXT NOT NULL,
  scope TEXT NOT NULL,
  at BIGINT NOT NULL,
  instance TEXT NOT NULL,
  series TEXT NOT NULL,
  label TEXT NOT NULL,
  value INTEGER NOT NULL,
  PRIMARY KEY (org, scope, at, series, label, instance)
);
CREATE INDEX history_series_at ON history_series (at);
`,
};

/** Series counted per coordinator (a read sums them). */
export const COUNTED_SERIES = ["provision", "quarantine"] as const;
/** Series taken from the store at each write (a read takes the largest). */
export const USE_SERIES = ["host_allocations", "host_vcpu", "owner_allocations", "owner_vcpu"] as const;
export type SeriesName = (typeof COUNTED_SERIES)[number] | (typeof USE_SERIES)[number];

export interface SeriesRow {
  org: string;
  /** The pool's name, or '' for an organisation-wide series. */
  scope: string;
  /** The bucket's start (epoch ms). */
  at: number;
  series: SeriesName;
  label: string;
  value: number;
}

/** Writes rows of this instance: a counted series' value is added to the bucket's (it is an increment), a use series' replaces it. */
export async function writeSeries(tx: Tx, instance: string, rows: readonly SeriesRow[], now: number): Promise<void> {
  for (const r of rows) {
    const counted = (COUNTED_SERIES as readonly string[]).includes(r.series);
    await tx.write(
      `INSERT INTO history_series (org, scope, at, instance, series, label, value) VALUES (?, ?, ?, ?, ?, ?, ?)
       ON CONFLICT (org, scope, at, series, label, instance) DO UPDATE SET value = ${counted ? "history_series.value + excluded.value" : "excluded.value"}`,
      [r.org, r.scope, r.at, instance, r.series, r.label, r.value],
    );
  }
  await tx.write("DELETE FROM history_series WHERE at < ?", [now - HISTORY_RETENTION_MS]);
}

/** Allocation use of every organisation now, for the bucket `at` (hosts and owners with nothing in use are left out). */
export async function allocationUse(tx: Tx, at: number): Promise<SeriesRow[]> {
  const hosts = await tx.all<{ org: string; name: string; used_slots: number; used_vcpu: number }>("SELECT org, name, used_slots, used_vcpu FROM host_accounts WHERE used_slots > 0 OR used_vcpu > 0");
  const owners = await tx.all<{ org: string; owner: string; used_count: number; used_vcpu: number }>("SELECT org, owner, used_count, used_vcpu FROM alloc_owners WHERE used_count > 0 OR used_vcpu > 0");
  const rows: SeriesRow[] = [];
  for (const h of hosts) {
    rows.push({ org: h.org, scope: "", at, series: "host_allocations", label: h.name, value: Number(h.used_slots) });
    rows.push({ org: h.org, scope: "", at, series: "host_vcpu", label: h.name, value: Number(h.used_vcpu) });
  }
  for (const o of owners) {
    rows.push({ org: o.org, scope: "", at, series: "owner_allocations", label: o.owner, value: Number(o.used_count) });
    rows.push({ org: o.org, scope: "", at, series: "owner_vcpu", label: o.owner, value: Number(o.used_vcpu) });
  }
  return rows;
}

/** A scope's series from `from` on, every instance's merged (counted series summed, use series the largest), oldest first. */
export async function readSeries(tx: Tx, org: string, scope: string, series: readonly SeriesName[], from: number): Promise<SeriesRow[]> {
  if (series.length === 0) return [];
  const rows = await tx.all<{ at: number; series: SeriesName; label: string; value: number }>(
    `SELECT at, series, label, value FROM history_series WHERE org = ? AND scope = ? AND at >= ? AND series IN (${series.map(() => "?").join(", ")}) ORDER BY at, series, label`,
    [org, scope, from, ...series],
  );
  return mergeSeries(rows.map((r) => ({ org, scope, at: Number(r.at), series: r.series, label: r.label, value: Number(r.value) })));
}

/** Rows of the same (at, series, label) made one: counted series summed, use series the largest. */
export function mergeSeries(rows: readonly SeriesRow[]): SeriesRow[] {
  const out = new Map<string, SeriesRow>();
  for (const r of rows) {
    const key = `${r.at}\0${r.series}\0${r.label}`;
    const m = out.get(key);
    if (!m) out.set(key, { ...r });
    else m.value = (COUNTED_SERIES as readonly string[]).includes(r.series) ? m.value + r.value : Math.max(m.value, r.value);
  }
  return [...out.values()].sort((a, b) => a.at - b.at);
}
