/** The `borrows` table: keeper borrows (portable ones live in `grants`). */
import type { Tx } from "./store.js";

export interface BorrowRow {
  id: string;
  org: string;
  pool: string;
  machine_id: string;
  principal: string;
  token_hash: string;
  state: "active" | "returned" | "abandoned" | "expired" | "withdrawn";
  generation: number;
  created_at: number;
  heartbeat_deadline: number;
  expires_at: number;
  ended_at: number | null;
  reason: string | null;
}

export async function insertBorrow(
  tx: Tx,
  b: { id: string; org: string; pool: string; machineId: string; principal: string; tokenHash: string; generation: number; now: number; heartbeatDeadline: number; expiresAt: number },
  /** For a client-chosen id or token: an existing one fails the transaction with this error instead of a constraint error. */
  taken: (() => Error) | null = null,
): Promise<void> {
  await tx.write(
    `INSERT INTO borrows (id, org, pool, machine_id, principal, token_hash, state, generation, created_at, heartbeat_deadline, expires_at, ended_at, reason) VALUES (?, ?, ?, ?, ?, ?, 'active', ?, ?, ?, ?, NULL, NULL)${taken ? " ON CONFLICT DO NOTHING" : ""}`,
    [b.id, b.org, b.pool, b.machineId, b.principal, b.tokenHash, b.generation, b.now, b.heartbeatDeadline, b.expiresAt],
    taken ? { expect: { rows: 1, error: taken } } : undefined,
  );
}

/** The organisation and borrow-token hash of a keeper borrow or a portable grant (what a report must match). */
export async function readBorrowTokenHash(tx: Tx, id: string): Promise<{ org: string; token_hash: string } | undefined> {
  return tx.get<{ org: string; token_hash: string }>(`SELECT org, token_hash FROM ${id.startsWith("g_") ? "grants" : "borrows"} WHERE id = ?`, [id]);
}

export async function lockBorrow(tx: Tx, id: string): Promise<BorrowRow | undefined> {
  return tx.get<BorrowRow>(`SELECT * FROM borrows WHERE id = ?${tx.forUpdate}`, [id]);
}

/**
 * `lockBorrow`, and in the same statement whether the API token acting (by
 * id) is still live (known and not revoked), read in the caller's transaction
 * (coordinator/auth.ts, `TokenCache`).
 */
export async function lockBorrowAsToken(tx: Tx, id: string, tokenId: string): Promise<(BorrowRow & { token_live: boolean }) | undefined> {
  const row = await tx.get<BorrowRow & { token_live: number | boolean }>(
    `SELECT b.*, EXISTS (SELECT 1 FROM api_tokens t WHERE t.id = ? AND t.revoked_at IS NULL) AS token_live FROM borrows b WHERE b.id = ?${tx.forUpdate}`,
    [tokenId, id],
  );
  if (row) row.token_live = Boolean(row.token_live);
  return row as (BorrowRow & { token_live: boolean }) | undefined;
}

/** A borrow with its machine's current state (null once the machine is pruned). */
export async function readBorrowWithMachineState(tx: Tx, id: string): Promise<(BorrowRow & { machine_state: string | null }) | undefined> {
  return tx.get<BorrowRow & { machine_state: string | null }>("SELECT b.*, m.state AS machine_state FROM borrows b LEFT JOIN machines m ON m.id = b.machine_id WHERE b.id = ?", [id]);
}

export async function lockActiveBorrowsOfPool(tx: Tx, org: string, pool: string): Promise<BorrowRow[]> {
  return tx.all<BorrowRow>(`SELECT * FROM borrows WHERE org = ? AND pool = ? AND state = 'active'${tx.forUpdate}`, [org, pool]);
}

export async function setBorrowHeartbeat(tx: Tx, id: string, deadline: number): Promise<void> {
  await tx.write("UPDATE borrows SET heartbeat_deadline = ? WHERE id = ? AND state = 'active'", [deadline, id]);
}

export async function endBorrow(tx: Tx, id: string, state: Exclude<BorrowRow["state"], "active">, reason: string, now: number): Promise<void> {
  await tx.write("UPDATE borrows SET state = ?, ended_at = ?, reason = ? WHERE id = ?", [state, now, reason, id]);
}

/** Prunes an ended borrow older than `endedBefore`; resolves to the rows deleted. */
export async function deleteEndedBorrow(tx: Tx, id: string, endedBefore: number): Promise<number> {
  return tx.run("DELETE FROM borrows WHERE id = ? AND state <> 'active' AND ended_at <= ?", [id, endedBefore]);
}

/** The org's active keeper borrows, soonest hard deadline first (the dashboard). */
export async function listActiveBorrows(tx: Tx, org: string): Promise<BorrowRow[]> {
  return tx.all<BorrowRow>("SELECT * FROM borrows WHERE org = ? AND state = 'active' ORDER BY expires_at, id", [org]);
}

export async function lockActiveBorrowsOfMachine(tx: Tx, machineId: string): Promise<BorrowRow[]> {
  return tx.all<BorrowRow>(`SELECT * FROM borrows WHERE machine_id = ? AND state = 'active'${tx.forUpdate}`, [machineId]);
}
