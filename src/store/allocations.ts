/**
 * Allocation rows. The placement plan is written once at insert and no
 * statement here changes it: it is the immutable record of which host slot
 * was reserved, with which strategy, for which size. State changes are
 * compare-and-set on the state read under the owner's lock.
 */
import type { Tx } from "./store.js";
import { parseId } from "../core/ids.js";
import type { AllocationState } from "../core/allocation.js";
import type { Strategy } from "../core/allocation-placement.js";

export interface AllocationPlan {
  hostId: string;
  hostName: string;
  strategy: Strategy;
  size: string;
  vcpu: number;
  memoryMib: number;
  /** Absent in plans written before the disk dimension (their allocations carry 0). */
  diskMib?: number;
  placedAt: number;
}

export interface AllocationRow {
  id: string;
  org: string;
  owner: string;
  size: string;
  vcpu: number;
  memory_mib: number;
  disk_mib: number;
  request_hash: string;
  state: AllocationState;
  host_id: string;
  plan: string;
  created_at: number;
  expires_at: number;
  state_since: number;
  reason: string | null;
}

export interface AllocationRecord {
  id: string;
  org: string;
  owner: string;
  size: string;
  vcpu: number;
  memoryMib: number;
  /** The workspace disk charged (0 for allocations made before the disk dimension). */
  diskMib: number;
  requestHash: string;
  state: AllocationState;
  hostId: string;
  plan: AllocationPlan;
  createdAt: number;
  expiresAt: number;
  stateSince: number;
  reason: string | null;
}

export function allocationFromRow(r: AllocationRow): AllocationRecord {
  return {
    id: parseId(r.id, "stored allocation id"),
    org: r.org,
    owner: r.owner,
    size: r.size,
    vcpu: r.vcpu,
    memoryMib: r.memory_mib,
    diskMib: Number(r.disk_mib ?? 0),
    requestHash: r.request_hash,
    state: r.state,
    hostId: r.host_id,
    plan: JSON.parse(r.plan) as AllocationPlan,
    createdAt: r.created_at,
    expiresAt: r.expires_at,
    stateSince: r.state_since,
    reason: r.reason,
  };
}

export async function getAllocation(tx: Tx, id: string, lock = false): Promise<AllocationRecord | null> {
  const r = await tx.get<AllocationRow>(`SELECT * FROM allocations WHERE id = ?${lock ? tx.forUpdate : ""}`, [id]);
  return r ? allocationFromRow(r) : null;
}

/** The allocations on a host that are not released yet, by id. */
export async function unreleasedAllocationsOnHost(tx: Tx, hostId: string): Promise<Array<{ id: string; state: string }>> {
  return tx.all<{ id: string; state: string }>("SELECT id, state FROM allocations WHERE host_id = ? AND state <> 'released' ORDER BY id", [hostId]);
}

export async function listAllocations(tx: Tx, org: string, owner: string | null, includeReleased: boolean): Promise<AllocationRecord[]> {
  const rows = await tx.all<AllocationRow>(
    `SELECT * FROM allocations WHERE org = ?${owner !== null ? " AND owner = ?" : ""}${includeReleased ? "" : " AND state <> 'released'"} ORDER BY created_at, id`,
    owner !== null ? [org, owner] : [org],
  );
  return rows.map(allocationFromRow);
}

/** Inserts a new allocation; false if the id was taken meanwhile (the caller re-reads it). */
export async function insertAllocation(tx: Tx, a: AllocationRecord): Promise<boolean> {
  const n = await tx.run(
    `INSERT INTO allocations (id, org, owner, size, vcpu, memory_mib, disk_mib, request_hash, state, host_id, plan, created_at, expires_at, state_since, reason)
     VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING`,
    [a.id, a.org, a.owner, a.size, a.vcpu, a.memoryMib, a.diskMib, a.requestHash, a.state, a.hostId, JSON.stringify(a.plan), a.createdAt, a.expiresAt, a.stateSince, a.reason],
  );
  return n === 1;
}

/** Moves an allocation from `from` to `to`; false if it was not in `from`. */
export async function casAllocationState(tx: Tx, id: string, from: AllocationState, to: AllocationState, now: number, reason: string | null): Promise<boolean> {
  const n = await tx.run("UPDATE allocations SET state = ?, state_since = ?, reason = ? WHERE id = ? AND state = ?", [to, now, reason, id, from]);
  return n === 1;
}

/** Live allocations by state (metrics). */
export async function liveAllocationCounts(tx: Tx): Promise<Array<{ state: string; n: number }>> {
  const rows = await tx.all<{ state: string; n: number }>("SELECT state, COUNT(*) AS n FROM allocations WHERE state <> 'released' GROUP BY state");
  return rows.map((r) => ({ state: r.state, n: Number(r.n) }));
}
