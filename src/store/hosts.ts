/** The `hosts` table: enrolled agents, their gateway address and slots. */
import type { Store, Tx } from "./store.js";
import type { HostIdentityColumns } from "./host-identity.js";
import type { HostRemovalColumns } from "./host-removal.js";

export interface HostRow extends HostIdentityColumns, HostRemovalColumns {
  id: string;
  org: string;
  name: string;
  url: string;
  runtime: string;
  vcpu: number;
  memory_mb: number;
  /** null: not declared by its agent (older than the disk dimension). */
  disk_mib: number | null;
  slots: number;
  used_slots: number;
  ssh_host: string;
  ssh_port: number;
  host_key: string;
  fingerprint: string;
  enrolled_at: number;
  /** JSON of HostRuntimeDetail (migration 8); null for a host that reported none. */
  runtime_detail?: string | null;
}

/** What an agent reports of its runtime beside the kind: the runsc release and gVisor platform, and a warning. */
export interface HostRuntimeDetail {
  runsc?: { version: string; platform: string };
  warning?: string;
}

export function runtimeDetailOf(h: Pick<HostRow, "runtime_detail">): HostRuntimeDetail | null {
  return h.runtime_detail ? (JSON.parse(h.runtime_detail) as HostRuntimeDetail) : null;
}

function detailColumn(d: HostRuntimeDetail | undefined): string | null {
  return d === undefined || Object.keys(d).length === 0 ? null : JSON.stringify(d);
}

export interface HostDescription {
  url: string;
  runtime: string;
  runtimeDetail?: HostRuntimeDetail;
  capacity: { vcpu: number; memoryMib: number; diskMib?: number | null; slots: number };
  ssh: { host: string; port: number; hostKey: string; fingerprint: string };
}

export async function readHost(tx: Tx, id: string): Promise<HostRow | undefined> {
  return tx.get<HostRow>("SELECT * FROM hosts WHERE id = ?", [id]);
}

/** A host's committed row outside the transaction queue (the address and identity an agent call needs). */
export async function readHostCommitted(store: Store, id: string): Promise<HostRow | undefined> {
  return store.readCommitted<HostRow>("SELECT * FROM hosts WHERE id = ?", [id]);
}

/** Reads and locks a host row. */
export async function lockHost(tx: Tx, id: string): Promise<HostRow | undefined> {
  return tx.get<HostRow>(`SELECT * FROM hosts WHERE id = ?${tx.forUpdate}`, [id]);
}

/** Free and total slots of the organisation's hosts that take machines (legacy or active identity, not being removed). */
export async function hostSlotTotals(tx: Tx, org: string): Promise<{ free: number; slots: number }> {
  const h = await tx.get<{ free: number | null; slots: number | null }>(
    "SELECT SUM(CASE WHEN used_slots < slots THEN slots - used_slots ELSE 0 END) AS free, SUM(slots) AS slots FROM hosts WHERE org = ? AND identity_state IN ('legacy', 'active') AND removing_since IS NULL",
    [org],
  );
  return { free: Number(h?.free ?? 0), slots: Number(h?.slots ?? 0) };
}

export async function lockHostByName(tx: Tx, org: string, name: string): Promise<HostRow | undefined> {
  return tx.get<HostRow>(`SELECT * FROM hosts WHERE org = ? AND name = ?${tx.forUpdate}`, [org, name]);
}

export async function listHosts(tx: Tx, org: string): Promise<HostRow[]> {
  return tx.all<HostRow>("SELECT * FROM hosts WHERE org = ? ORDER BY name", [org]);
}

/** A new host; `identityKey` given: recorded straight into identity mode (`active`), else on the shared token (`legacy`). */
export async function insertHost(tx: Tx, id: string, org: string, name: string, d: HostDescription, now: number, identityKey: string | null = null): Promise<void> {
  await tx.run(
    "INSERT INTO hosts (id, org, name, url, runtime, runtime_detail, vcpu, memory_mb, disk_mib, slots, used_slots, ssh_host, ssh_port, host_key, fingerprint, enrolled_at, identity_state, identity_key, identity_since) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, ?, ?, ?, ?, ?, ?, ?, ?)",
    [id, org, name, d.url, d.runtime, detailColumn(d.runtimeDetail), d.capacity.vcpu, d.capacity.memoryMib, d.capacity.diskMib ?? null, d.capacity.slots, d.ssh.host, d.ssh.port, d.ssh.hostKey, d.ssh.fingerprint, now, identityKey === null ? "legacy" : "active", identityKey, identityKey === null ? null : now],
  );
}

export async function updateHost(tx: Tx, id: string, d: HostDescription, now: number): Promise<void> {
  await tx.run("UPDATE hosts SET url = ?, runtime = ?, runtime_detail = ?, vcpu = ?, memory_mb = ?, disk_mib = ?, slots = ?, ssh_host = ?, ssh_port = ?, host_key = ?, fingerprint = ?, enrolled_at = ? WHERE id = ?", [
    d.url, d.runtime, detailColumn(d.runtimeDetail), d.capacity.vcpu, d.capacity.memoryMib, d.capacity.diskMib ?? null, d.capacity.slots, d.ssh.host, d.ssh.port, d.ssh.hostKey, d.ssh.fingerprint, now, id,
  ]);
}

/** How many of the org's hosts run each runtime. */
export async function countHostsByRuntime(tx: Tx, org: string): Promise<Map<string, number>> {
  const rows = await tx.all<{ runtime: string; n: number }>("SELECT runtime, COUNT(*) AS n FROM hosts WHERE org = ? GROUP BY runtime", [org]);
  return new Map(rows.map((r) => [r.runtime, Number(r.n)]));
}

/**
 * Takes a slot on the org's least-used host with one free (of `runtime`, when given: an image pool needs gvisor);
 * resolves to its id, or null when every such host is full.
 * A host switching to its identity key, awaiting its agent after a reset, or being removed takes none
 * (only `legacy` and `active` hosts do, unless removed).
 */
export async function takeHostSlot(tx: Tx, org: string, runtime: string | null = null): Promise<string | null> {
  const host = await tx.get<{ id: string }>(
    `SELECT id FROM hosts WHERE org = ? AND used_slots < slots AND identity_state IN ('legacy', 'active') AND removing_since IS NULL${runtime === null ? "" : " AND runtime = ?"} ORDER BY used_slots, id LIMIT 1${tx.forUpdate}`,
    runtime === null ? [org] : [org, runtime],
  );
  if (!host) return null;
  await tx.run("UPDATE hosts SET used_slots = used_slots + 1 WHERE id = ?", [host.id]);
  return host.id;
}

export async function releaseHostSlot(tx: Tx, hostId: string): Promise<void> {
  await tx.run("UPDATE hosts SET used_slots = used_slots - 1 WHERE id = ? AND used_slots > 0", [hostId]);
}
