/**
 * Change marks: one read that summarises everything the dashboard shows of
 * one organisation (machines, pools, borrows, grants, hosts and their
 * accounts, allocations, owners, tokens) into a short string. The dashboard's
 * live stream compares successive marks and tells the browser to refresh
 * only when the mark moved. It reads committed state, so it sees changes made
 * by any coordinator sharing the database, not only this process's.
 *
 * Each table contributes aggregates that move on every change the pages
 * show (a state change moves its `state_since` sum and its state-length sum;
 * a reservation its generation sum; a new or ended row its count and dates).
 */
import type { Store } from "./store.js";

const AGGREGATES: Array<[string, string[]]> = [
  ["machines", ["COUNT(*)", "COALESCE(SUM(state_since), 0)", "COALESCE(SUM(generation), 0)", "COALESCE(SUM(LENGTH(state)), 0)"]],
  ["pools", ["COUNT(*)", "COALESCE(SUM(updated_at), 0)"]],
  ["borrows", ["COUNT(*)", "COALESCE(SUM(CASE WHEN state = 'active' THEN 1 ELSE 0 END), 0)", "COALESCE(MAX(created_at), 0)", "COALESCE(MAX(ended_at), 0)"]],
  ["grants", ["COUNT(*)", "COALESCE(SUM(LENGTH(state)), 0)", "COALESCE(MAX(created_at), 0)", "COALESCE(MAX(ended_at), 0)", "COALESCE(MAX(activated_at), 0)"]],
  ["hosts", ["COUNT(*)", "COALESCE(SUM(used_slots), 0)", "COALESCE(MAX(enrolled_at), 0)"]],
  ["host_accounts", ["COUNT(*)", "COALESCE(SUM(used_vcpu + used_memory_mib + used_slots), 0)", "COALESCE(SUM(standing_since), 0)"]],
  ["allocations", ["COUNT(*)", "COALESCE(SUM(state_since), 0)"]],
  ["alloc_owners", ["COUNT(*)", "COALESCE(SUM(updated_at), 0)"]],
  ["api_tokens", ["COUNT(*)", "COALESCE(MAX(revoked_at), 0)"]],
];

// One row: per table, its aggregates joined into one text column.
const SQL = "SELECT " + AGGREGATES.map(([table, cols]) => `(SELECT ${cols.join(" || ',' || ")} FROM ${table} WHERE org = ?) AS ${table}`).join(", ");

/** The organisation's change mark (equal marks: nothing the dashboard shows changed). One committed read, outside the transaction queue. */
export async function changeMark(store: Store, org: string): Promise<string> {
  const row = await store.readCommitted<Record<string, unknown>>(SQL, AGGREGATES.map(() => org));
  return row ? Object.values(row).map(String).join(";") : "";
}
