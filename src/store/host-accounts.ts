/**
 * Host capacity accounts (`host_accounts`): one per enrolled host, with its
 * standing (ready, draining, withdrawn, not_ready), its capacity and what
 * allocations use of it. Placement reads the org's accounts without locks,
 * then locks only the chosen host's row and decides again on what it read
 * under the lock.
 */
import type { Tx } from "./store.js";
import type { Capacity, HostAccount, HostStanding, Strategy } from "../core/allocation-placement.js";

export interface HostAccountRow {
  host_id: string;
  org: string;
  name: string;
  standing: HostStanding;
  vcpu: number;
  memory_mib: number;
  slots: number;
  used_vcpu: number;
  used_memory_mib: number;
  used_slots: number;
  disk_mib: number | null;
  used_disk_mib: number;
  standing_since: number;
  standing_epoch: number;
  standing_acked: number;
  gone_epoch: number | null;
}

export function hostAccountFromRow(r: HostAccountRow): HostAccount & { org: string; standingSince: number; standingEpoch: number; standingAcked: number; goneEpoch: number | null } {
  return {
    hostId: r.host_id,
    org: r.org,
    name: r.name,
    standing: r.standing,
    capacity: { vcpu: r.vcpu, memoryMib: r.memory_mib, diskMib: r.disk_mib === null || r.disk_mib === undefined ? null : Number(r.disk_mib), slots: r.slots },
    used: { vcpu: r.used_vcpu, memoryMib: r.used_memory_mib, diskMib: Number(r.used_disk_mib ?? 0), slots: r.used_slots },
    standingSince: r.standing_since,
    standingEpoch: Number(r.standing_epoch ?? 0),
    standingAcked: Number(r.standing_acked ?? 0),
    /** The standing epoch under which an operator attested the host gone (null: never). */
    goneEpoch: r.gone_epoch === null || r.gone_epoch === undefined ? null : Number(r.gone_epoch),
  };
}

/**
 * A host in the middle of its identity switch (docs/host-identity.md: from
 * prepare until it is active), awaiting its agent after an identity reset,
 * or being removed takes no new allocation: its account reads as
 * `not_ready` while its recorded standing is `ready` (an operator's own
 * standing is kept as it is).
 */
const SWITCHING = "EXISTS (SELECT 1 FROM hosts h WHERE h.id = a.host_id AND (h.identity_state NOT IN ('legacy', 'active') OR h.removing_since IS NOT NULL))";
const ACCOUNT_COLUMNS = `a.host_id, a.org, a.name, CASE WHEN a.standing = 'ready' AND ${SWITCHING} THEN 'not_ready' ELSE a.standing END AS standing,
  a.vcpu, a.memory_mib, a.slots, a.used_vcpu, a.used_memory_mib, a.used_slots, a.disk_mib, a.used_disk_mib, a.standing_since, a.standing_epoch, a.standing_acked, a.gone_epoch`;

export async function listHostAccounts(tx: Tx, org: string): Promise<ReturnType<typeof hostAccountFromRow>[]> {
  return (await tx.all<HostAccountRow>(`SELECT ${ACCOUNT_COLUMNS} FROM host_accounts a WHERE a.org = ? ORDER BY a.host_id`, [org])).map(hostAccountFromRow);
}

/**
 * The best few ready hosts with room for `need`, in the strategy's order
 * (the same order as core `choose`, which makes the decision over them):
 * the database filters and sorts, so a create does not ship every host row.
 */
export async function candidateHostAccounts(tx: Tx, org: string, need: { vcpu: number; memoryMib: number; diskMib: number }, strategy: Strategy, limit: number): Promise<HostAccount[]> {
  const order = strategy === "spread" ? "memory_mib - used_memory_mib DESC, vcpu - used_vcpu DESC, slots - used_slots DESC, host_id" : "memory_mib - used_memory_mib, vcpu - used_vcpu, host_id";
  const rows = await tx.all<HostAccountRow>(
    `SELECT * FROM host_accounts a WHERE org = ? AND standing = 'ready' AND NOT ${SWITCHING} AND vcpu - used_vcpu >= ? AND memory_mib - used_memory_mib >= ? AND (disk_mib IS NULL OR disk_mib - used_disk_mib >= ?) AND slots - used_slots >= 1 ORDER BY ${order} LIMIT ?`,
    [org, need.vcpu, need.memoryMib, need.diskMib, limit],
  );
  return rows.map(hostAccountFromRow);
}

export async function lockHostAccount(tx: Tx, hostId: string): Promise<ReturnType<typeof hostAccountFromRow> | null> {
  const r = await tx.get<HostAccountRow>(`SELECT * FROM host_accounts WHERE host_id = ?${tx.forUpdate}`, [hostId]);
  return r ? hostAccountFromRow(r) : null;
}

/** Creates a host's account at enrollment (ready), or updates its name and capacity on re-enrollment (standing and usage kept). */
export async function upsertHostAccount(tx: Tx, hostId: string, org: string, name: string, cap: Capacity, now: number): Promise<void> {
  await tx.run(
    `INSERT INTO host_accounts (host_id, org, name, standing, vcpu, memory_mib, disk_mib, slots, used_vcpu, used_memory_mib, used_disk_mib, used_slots, standing_since)
     VALUES (?, ?, ?, 'ready', ?, ?, ?, ?, 0, 0, 0, 0, ?)
     ON CONFLICT (host_id) DO UPDATE SET name = excluded.name, vcpu = excluded.vcpu, memory_mib = excluded.memory_mib, disk_mib = excluded.disk_mib, slots = excluded.slots`,
    [hostId, org, name, cap.vcpu, cap.memoryMib, cap.diskMib, cap.slots, now],
  );
}

/** Sets the standing under a new epoch (the caller holds the row lock); returns the epoch. */
export async function setHostStanding(tx: Tx, hostId: string, standing: HostStanding, now: number): Promise<number> {
  await tx.run("UPDATE host_accounts SET standing = ?, standing_since = ?, standing_epoch = standing_epoch + 1 WHERE host_id = ?", [standing, now, hostId]);
  const r = await tx.get<{ standing_epoch: number }>("SELECT standing_epoch FROM host_accounts WHERE host_id = ?", [hostId]);
  return Number(r!.standing_epoch);
}

/** Writes the host's usage; the caller holds the row lock and computed `used` from the locked row. */
export async function setHostUsage(tx: Tx, hostId: string, used: Capacity): Promise<void> {
  await tx.run("UPDATE host_accounts SET used_vcpu = ?, used_memory_mib = ?, used_disk_mib = ?, used_slots = ? WHERE host_id = ?", [used.vcpu, used.memoryMib, used.diskMib ?? 0, used.slots, hostId]);
}
