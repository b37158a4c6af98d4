/**
 * The `machines` table: one row per lent resource. State changes go through
 * `writeTransition` (a compare-and-set on state and generation), which only
 * the coordinator's `applyTransition` calls.
 */
import { BerthError } from "../core/errors.js";
import type { Tx } from "./store.js";
import type { MachineState } from "../core/machine.js";
import { rotationMarginMs, type Access, type PoolRecord } from "../core/pool.js";
import { policyFingerprint } from "../core/network-policy.js";

export interface MachineRow {
  id: string;
  org: string;
  pool: string;
  access: string;
  provider: string;
  resource_id: string;
  host_id: string | null;
  state: MachineState;
  generation: number;
  incarnation: string | null;
  ssh_host: string | null;
  ssh_port: number | null;
  ssh_user: string | null;
  host_key: string | null;
  claim_id: string | null;
  lent_to: string | null;
  created_at: number;
  state_since: number;
  ready_since: number | null;
  hard_expires_at: number;
  reason: string | null;
  /** The fingerprint of the network policy the machine was provisioned for (migration 5); NULL: none. */
  network_fingerprint?: string | null;
  /** JSON of its last readiness evidence (migration 5). */
  network_evidence?: string | null;
  /** The image it was provisioned for (migration 8); NULL: the host's root. */
  image?: string | null;
  /** "off": provisioned with forwards refused (migration 13); NULL: on. */
  forwarding?: string | null;
  /** "workspace": provisioned with SFTP confined (migration 16); NULL: machine. */
  files_scope?: string | null;
}

/** Reads and locks a machine row (the read every transition starts from). */
export async function lockMachine(tx: Tx, id: string): Promise<MachineRow | undefined> {
  return tx.get<MachineRow>(`SELECT * FROM machines WHERE id = ?${tx.forUpdate}`, [id]);
}

/** Live machines on hosts, counted by pool, most first (who holds the organisation's host slots). */
export async function hostMachinesByPool(tx: Tx, org: string): Promise<Array<{ pool: string; n: number }>> {
  const rows = await tx.all<{ pool: string; n: number }>(
    "SELECT pool, COUNT(*) AS n FROM machines WHERE org = ? AND host_id IS NOT NULL AND state <> 'destroyed' GROUP BY pool ORDER BY COUNT(*) DESC, pool",
    [org],
  );
  return rows.map((r) => ({ pool: r.pool, n: Number(r.n) }));
}

/** Machines of one provider in any of `states`, by id. */
export async function machinesOfProviderIn(tx: Tx, provider: string, states: readonly string[]): Promise<MachineRow[]> {
  return tx.all<MachineRow>(`SELECT * FROM machines WHERE provider = ? AND state IN (${states.map(() => "?").join(", ")}) ORDER BY id`, [provider, ...states]);
}

/** Which of `ids` are machines of `provider` not yet destroyed. */
export async function liveMachineIdsOf(tx: Tx, provider: string, ids: readonly string[]): Promise<string[]> {
  if (ids.length === 0) return [];
  const rows = await tx.all<{ id: string }>(`SELECT id FROM machines WHERE provider = ? AND state <> 'destroyed' AND id IN (${ids.map(() => "?").join(", ")})`, [provider, ...ids]);
  return rows.map((r) => r.id);
}

/** Reads a machine row without locking it (presentation). */
export async function readMachine(tx: Tx, id: string): Promise<MachineRow | undefined> {
  return tx.get<MachineRow>("SELECT * FROM machines WHERE id = ?", [id]);
}

/**
 * The compatible ready machine of the pool's access namespace that has waited
 * longest, excluding machines near their hard TTL (they are being rotated
 * out). On PostgreSQL the row is locked and rows other borrowers hold are
 * skipped, so concurrent borrows never take the same machine.
 */
/** The compatible ready machine that has waited longest, outside its rotation margin and living at least `lifeMs` more. */
export async function takeReadyMachine(tx: Tx, pool: PoolRecord, access: Access, now: number, lifeMs = 0): Promise<MachineRow | undefined> {
  return tx.get<MachineRow>(
    `SELECT * FROM machines WHERE org = ? AND pool = ? AND state = 'ready' AND access = ? AND hard_expires_at > ? AND COALESCE(network_fingerprint, 'none') = ? ORDER BY ready_since, id LIMIT 1${tx.skipLocked}`,
    [pool.org, pool.name, access, Math.max(now + rotationMarginMs(pool.hardTtlMs), now + lifeMs - 1), policyFingerprint(pool.network)],
  );
}

/** A ready machine of the pool with less than `lifeMs` to live (the shortest-lived first), locked; none when every one lives long enough. */
export async function lockShortLivedReady(tx: Tx, pool: PoolRecord, now: number, lifeMs: number): Promise<MachineRow | undefined> {
  return tx.get<MachineRow>(
    `SELECT * FROM machines WHERE org = ? AND pool = ? AND state = 'ready' AND hard_expires_at < ? ORDER BY hard_expires_at, id LIMIT 1${tx.skipLocked}`,
    [pool.org, pool.name, now + lifeMs],
  );
}

/** The pool's ready machines, longest-ready first, locked (at most `limit`; all when null). */
export async function lockReadyMachines(tx: Tx, org: string, pool: string, limit: number | null): Promise<MachineRow[]> {
  if (limit === null) return tx.all<MachineRow>(`SELECT * FROM machines WHERE org = ? AND pool = ? AND state = 'ready'${tx.forUpdate}`, [org, pool]);
  return tx.all<MachineRow>(`SELECT * FROM machines WHERE org = ? AND pool = ? AND state = 'ready' ORDER BY ready_since, id LIMIT ?${tx.forUpdate}`, [org, pool, limit]);
}

export interface NewMachine {
  id: string;
  org: string;
  pool: string;
  access: string;
  provider: string;
  resourceId: string;
  hostId: string | null;
  state: "provisioning" | "ready";
  ssh: { host: string | null; port: number | null; user: string | null; hostKey: string | null };
  claimId: string;
  now: number;
  hardExpiresAt: number;
}

/** A new machine at generation 0: `ready` (registered by an outside keeper) or `provisioning` (ours to create). */
export async function insertMachine(tx: Tx, m: NewMachine): Promise<void> {
  await tx.run(
    `INSERT INTO machines (id, org, pool, access, provider, resource_id, host_id, state, generation, incarnation, ssh_host, ssh_port, ssh_user, host_key, claim_id, lent_to, created_at, state_since, ready_since, hard_expires_at, reason)
     VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0, NULL, ?, ?, ?, ?, ?, NULL, ?, ?, ?, ?, NULL)`,
    [m.id, m.org, m.pool, m.access, m.provider, m.resourceId, m.hostId, m.state, m.ssh.host, m.ssh.port, m.ssh.user, m.ssh.hostKey, m.claimId, m.now, m.now, m.state === "ready" ? m.now : null, m.hardExpiresAt],
  );
}

/**
 * Writes a transition's outcome only if state and generation are still those
 * observed; if they are not, the transaction fails with `conflict` (when the
 * write is sent: it may be held with the writes that follow it).
 */
export async function writeTransition(
  tx: Tx,
  observed: Pick<MachineRow, "id" | "state" | "generation">,
  next: Pick<MachineRow, "state" | "generation" | "state_since" | "ready_since" | "reason" | "lent_to">,
): Promise<void> {
  await tx.write(
    "UPDATE machines SET state = ?, generation = ?, state_since = ?, ready_since = ?, reason = ?, lent_to = ? WHERE id = ? AND state = ? AND generation = ?",
    [next.state, next.generation, next.state_since, next.ready_since, next.reason, next.lent_to, observed.id, observed.state, observed.generation],
    { expect: { rows: 1, error: () => new BerthError("conflict", `conflict: machine ${observed.id} changed while it was being updated; try again`) } },
  );
}

/** A provisioned machine becomes ready with the address its provider reported. */
export async function markProvisioned(tx: Tx, id: string, found: { incarnation: string; sshHost: string; sshPort: number; hostKey: string }, now: number): Promise<void> {
  await tx.run(
    "UPDATE machines SET state = 'ready', incarnation = ?, ssh_host = ?, ssh_port = ?, ssh_user = ?, host_key = ?, state_since = ?, ready_since = ? WHERE id = ? AND state = 'provisioning'",
    [found.incarnation, found.sshHost, found.sshPort, id, found.hostKey, now, now, id],
  );
}

/** An outside keeper's confirmation of destruction, at the observed generation. */
export async function markDestroyedByKeeper(tx: Tx, id: string, generation: number, now: number): Promise<void> {
  await tx.run("UPDATE machines SET state = 'destroyed', state_since = ?, ready_since = NULL, lent_to = NULL WHERE id = ? AND generation = ?", [now, id, generation]);
}

export async function setIncarnation(tx: Tx, id: string, incarnation: string): Promise<void> {
  await tx.run("UPDATE machines SET incarnation = ? WHERE id = ?", [incarnation, id]);
}

/** Machines on a host learn its (possibly new) gateway address. */
export async function setHostAddressOfMachines(tx: Tx, hostId: string, ssh: { host: string; port: number; hostKey: string }): Promise<void> {
  await tx.run("UPDATE machines SET ssh_host = ?, ssh_port = ?, host_key = ? WHERE host_id = ? AND state <> 'destroyed'", [ssh.host, ssh.port, ssh.hostKey, hostId]);
}

/** The machine holding a resource, unless destroyed. */
export async function liveMachineOfResource(tx: Tx, provider: string, resourceId: string): Promise<Pick<MachineRow, "id" | "access" | "state"> | undefined> {
  return tx.get<{ id: string; access: string; state: MachineRow["state"] }>(
    "SELECT id, access, state FROM machines WHERE provider = ? AND resource_id = ? AND state <> 'destroyed'",
    [provider, resourceId],
  );
}

/** Per-state counts of a pool's machines. */
export async function countMachinesByState(tx: Tx, org: string, pool: string): Promise<Array<{ state: string; n: number }>> {
  const rows = await tx.all<{ state: string; n: number }>("SELECT state, COUNT(*) AS n FROM machines WHERE org = ? AND pool = ? GROUP BY state", [org, pool]);
  return rows.map((r) => ({ state: r.state, n: Number(r.n) }));
}

/** Per-state counts of a pool's machines that hold capacity (ready, lent or in cleanup). */
export async function countHoldingMachines(tx: Tx, org: string, pool: string): Promise<Array<{ state: string; n: number }>> {
  const rows = await tx.all<{ state: string; n: number }>(
    "SELECT state, COUNT(*) AS n FROM machines WHERE org = ? AND pool = ? AND state IN ('ready','reserved','installing','busy','revoking','fencing','scrubbing') GROUP BY state",
    [org, pool],
  );
  return rows.map((r) => ({ state: r.state, n: Number(r.n) }));
}

/** Machines of a pool that are not destroyed. */
export async function countLiveMachines(tx: Tx, org: string, pool: string): Promise<number> {
  const r = await tx.get<{ n: number }>("SELECT COUNT(*) AS n FROM machines WHERE org = ? AND pool = ? AND state <> 'destroyed'", [org, pool]);
  return Number(r?.n ?? 0);
}

/** Per pool of the org: ready and live (not destroyed) machines. */
export async function poolTotals(tx: Tx, org: string): Promise<Map<string, { ready: number; total: number }>> {
  const rows = await tx.all<{ pool: string; ready: number; total: number }>(
    "SELECT pool, SUM(CASE WHEN state = 'ready' THEN 1 ELSE 0 END) AS ready, COUNT(*) AS total FROM machines WHERE org = ? AND state <> 'destroyed' GROUP BY pool",
    [org],
  );
  return new Map(rows.map((r) => [r.pool, { ready: Number(r.ready), total: Number(r.total) }]));
}

/** Machine counts per pool and state, every org (metrics). */
export async function machineCounts(tx: Tx): Promise<Array<{ pool: string; state: string; n: number }>> {
  const rows = await tx.all<{ pool: string; state: string; n: number }>("SELECT pool, state, COUNT(*) AS n FROM machines GROUP BY pool, state");
  return rows.map((r) => ({ ...r, n: Number(r.n) }));
}

export async function deleteMachine(tx: Tx, id: string): Promise<void> {
  await tx.run("DELETE FROM machines WHERE id = ?", [id]);
}

/** Machine counts per pool and state of one org (the dashboard's overview). */
export async function countMachinesByPoolState(tx: Tx, org: string): Promise<Array<{ pool: string; state: MachineState; n: number }>> {
  const rows = await tx.all<{ pool: string; state: MachineState; n: number }>("SELECT pool, state, COUNT(*) AS n FROM machines WHERE org = ? GROUP BY pool, state", [org]);
  return rows.map((r) => ({ ...r, n: Number(r.n) }));
}

/** A pool's machines that are not destroyed, by state then age (the dashboard's pool page). */
export async function listLiveMachinesOfPool(tx: Tx, org: string, pool: string): Promise<MachineRow[]> {
  return tx.all<MachineRow>("SELECT * FROM machines WHERE org = ? AND pool = ? AND state <> 'destroyed' ORDER BY state, created_at, id", [org, pool]);
}

/** The org's quarantined machines, longest quarantined first. */
export async function listQuarantined(tx: Tx, org: string): Promise<MachineRow[]> {
  return tx.all<MachineRow>("SELECT * FROM machines WHERE org = ? AND state = 'quarantined' ORDER BY state_since, id", [org]);
}
