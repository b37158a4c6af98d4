/** The `grants` table: portable borrows and where their cleanup stands. */
import type { Tx } from "./store.js";
import type { GrantState } from "../core/grant.js";

export interface GrantRow {
  id: string;
  org: string;
  pool: string;
  machine_id: string;
  resource_id: string;
  borrower: string;
  token_hash: string;
  grant_token_hash: string;
  generation: number;
  fingerprint: string;
  public_key: string;
  state: GrantState;
  reason: string | null;
  created_at: number;
  ack_deadline: number;
  heartbeat_deadline: number;
  expires_at: number;
  activated_at: number | null;
  ended_at: number | null;
}

export interface NewGrant {
  id: string;
  org: string;
  pool: string;
  machineId: string;
  resourceId: string;
  borrower: string;
  tokenHash: string;
  grantTokenHash: string;
  generation: number;
  fingerprint: string;
  publicKey: string;
  now: number;
  ackDeadline: number;
  heartbeatDeadline: number;
  expiresAt: number;
}

/** A new grant, `pending`. */
/** `taken`: for a client-chosen id or tokens, an existing one fails the transaction with this error instead of a constraint error. */
export async function insertGrant(tx: Tx, g: NewGrant, taken: (() => Error) | null = null): Promise<void> {
  await tx.write(
    `INSERT INTO grants (id, org, pool, machine_id, resource_id, borrower, token_hash, grant_token_hash, generation, fingerprint, public_key, state, reason, created_at, ack_deadline, heartbeat_deadline, expires_at, activated_at, ended_at)
     VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', NULL, ?, ?, ?, ?, NULL, NULL)${taken ? " ON CONFLICT DO NOTHING" : ""}`,
    [g.id, g.org, g.pool, g.machineId, g.resourceId, g.borrower, g.tokenHash, g.grantTokenHash, g.generation, g.fingerprint, g.publicKey, g.now, g.ackDeadline, g.heartbeatDeadline, g.expiresAt],
    taken ? { expect: { rows: 1, error: taken } } : undefined,
  );
}

export async function lockGrant(tx: Tx, id: string): Promise<GrantRow | undefined> {
  return tx.get<GrantRow>(`SELECT * FROM grants WHERE id = ?${tx.forUpdate}`, [id]);
}

/** Reads a grant without locking it (presentation). */
export async function readGrant(tx: Tx, id: string): Promise<GrantRow | undefined> {
  return tx.get<GrantRow>("SELECT * FROM grants WHERE id = ?", [id]);
}

/** The grant of a machine at one generation (a generation is lent at most once). */
export async function lockGrantAt(tx: Tx, machineId: string, generation: number): Promise<GrantRow | undefined> {
  return tx.get<GrantRow>(`SELECT * FROM grants WHERE machine_id = ? AND generation = ?${tx.forUpdate}`, [machineId, generation]);
}

export async function lockLiveGrantsOfBorrower(tx: Tx, tokenId: string): Promise<GrantRow[]> {
  return tx.all<GrantRow>(`SELECT * FROM grants WHERE borrower = ? AND state IN ('pending','installing','active')${tx.forUpdate}`, [tokenId]);
}

export async function countLiveGrantsOfBorrower(tx: Tx, tokenId: string): Promise<number> {
  const r = await tx.get<{ n: number }>("SELECT COUNT(*) AS n FROM grants WHERE borrower = ? AND state IN ('pending','installing','active')", [tokenId]);
  return Number(r?.n ?? 0);
}

export async function lockLiveGrantsOfPool(tx: Tx, org: string, pool: string): Promise<GrantRow[]> {
  return tx.all<GrantRow>(`SELECT * FROM grants WHERE org = ? AND pool = ? AND state IN ('pending','installing','active')${tx.forUpdate}`, [org, pool]);
}

export async function invalidateGrantRow(tx: Tx, id: string, reason: string, now: number): Promise<void> {
  await tx.write("UPDATE grants SET state = 'invalidated', reason = ?, ended_at = ? WHERE id = ?", [reason, now, id]);
}

export async function markGrantInstalling(tx: Tx, id: string): Promise<void> {
  await tx.write("UPDATE grants SET state = 'installing' WHERE id = ?", [id]);
}

export async function activateGrant(tx: Tx, id: string, now: number): Promise<void> {
  await tx.write("UPDATE grants SET state = 'active', activated_at = ? WHERE id = ?", [now, id]);
}

export async function setGrantHeartbeat(tx: Tx, id: string, deadline: number): Promise<void> {
  await tx.write("UPDATE grants SET heartbeat_deadline = ? WHERE id = ?", [deadline, id]);
}

/** Moves a machine's grants at `generation` from one cleanup step to the next; resolves to the ids moved. */
export async function advanceGrantCleanup(tx: Tx, machineId: string, generation: number, from: GrantState, to: GrantState, now: number): Promise<string[]> {
  const ids = await tx.all<{ id: string }>("SELECT id FROM grants WHERE machine_id = ? AND generation = ? AND state = ?", [machineId, generation, from]);
  await tx.write("UPDATE grants SET state = ?, ended_at = COALESCE(ended_at, ?) WHERE machine_id = ? AND generation = ? AND state = ?", [to, now, machineId, generation, from]);
  return ids.map((r) => r.id);
}

/** Closes every unclosed grant of a machine; resolves to the ids closed. */
export async function closeGrantsOfMachineRows(tx: Tx, machineId: string, now: number): Promise<string[]> {
  const ids = await tx.all<{ id: string }>("SELECT id FROM grants WHERE machine_id = ? AND state <> 'closed'", [machineId]);
  await tx.write("UPDATE grants SET state = 'closed', ended_at = COALESCE(ended_at, ?) WHERE machine_id = ? AND state <> 'closed'", [now, machineId]);
  return ids.map((r) => r.id);
}

/** Prunes a closed grant older than `endedBefore`; resolves to the rows deleted. */
export async function deleteClosedGrant(tx: Tx, id: string, endedBefore: number): Promise<number> {
  return tx.run("DELETE FROM grants WHERE id = ? AND state = 'closed' AND ended_at <= ?", [id, endedBefore]);
}

/** The org's grants not yet closed (live, or on their way out), soonest expiry first (the dashboard). */
export async function listOpenGrants(tx: Tx, org: string): Promise<GrantRow[]> {
  return tx.all<GrantRow>("SELECT * FROM grants WHERE org = ? AND state <> 'closed' ORDER BY expires_at, id", [org]);
}

export async function lockLiveGrantsOfMachine(tx: Tx, machineId: string): Promise<GrantRow[]> {
  return tx.all<GrantRow>(`SELECT * FROM grants WHERE machine_id = ? AND state IN ('pending','installing','active')${tx.forUpdate}`, [machineId]);
}
