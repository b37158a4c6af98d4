/**
 * The `operations` table: durable intent of provider work. A row is written
 * `pending` with an `op` due row in the transaction that decides the work;
 * whoever carries it out first leases it (`running`, due at the lease end),
 * so a coordinator that dies mid-call leaves a row another one picks up.
 */
import type { Tx } from "./store.js";
import type { AllocOperationKind, OperationKind as ProtocolKind } from "../protocol/operations.js";

/** Machine operations (allocation operations are not kept in this table). */
type OperationKind = Exclude<ProtocolKind, AllocOperationKind>;
import { clearDue, setDue } from "./due.js";

/** How long a lease keeps other coordinators off a running operation. */
export const OP_LEASE_MS = 30_000;

export interface OpRow {
  id: string;
  kind: OperationKind;
  machine_id: string;
  host_id: string | null;
  generation: number;
  state: "pending" | "running" | "done" | "failed";
  attempts: number;
  args: string;
  result: string | null;
  error: string | null;
  created_at: number;
  updated_at: number;
}

/** A new `pending` operation, due now. A retried transaction writing the same id changes nothing. */
export async function insertOp(
  tx: Tx,
  o: { id: string; kind: OperationKind; machineId: string; hostId: string | null; generation: number; args: Record<string, unknown>; now: number },
): Promise<void> {
  await tx.write(
    "INSERT INTO operations (id, kind, machine_id, host_id, generation, state, attempts, args, result, error, created_at, updated_at) VALUES (?, ?, ?, ?, ?, 'pending', 0, ?, NULL, NULL, ?, ?) ON CONFLICT (id) DO NOTHING",
    [o.id, o.kind, o.machineId, o.hostId, o.generation, JSON.stringify(o.args), o.now, o.now],
  );
  await setDue(tx, "op", o.id, o.now);
}

export async function lockOp(tx: Tx, id: string): Promise<OpRow | undefined> {
  return tx.get<OpRow>(`SELECT * FROM operations WHERE id = ?${tx.forUpdate}`, [id]);
}

/** Whether a `running` operation's lease still holds at `now`. */
export function leaseHeld(op: Pick<OpRow, "state" | "updated_at">, now: number): boolean {
  return op.state === "running" && now < op.updated_at + OP_LEASE_MS;
}

/**
 * Leases an operation to the caller: `running`, one more attempt, its due row
 * at the lease end (where another coordinator picks it up if this one dies).
 * Resolves to the leased row.
 */
export async function leaseOp(tx: Tx, id: string, now: number): Promise<OpRow> {
  const op = await tx.get<OpRow>("UPDATE operations SET state = 'running', attempts = attempts + 1, updated_at = ? WHERE id = ? RETURNING *", [now, id]);
  if (!op) throw new Error(`operation ${id} is not recorded`);
  await setDue(tx, "op", id, now + OP_LEASE_MS);
  return op;
}

/** Back to `pending`, to be retried at `at`. */
export async function retryOpAt(tx: Tx, id: string, error: string, now: number, at: number, o: { uncount?: boolean } = {}): Promise<void> {
  // `uncount`: this attempt does not count toward the operation's limit (the provider's API throttled it).
  await tx.write(`UPDATE operations SET state = 'pending', error = ?, updated_at = ?${o.uncount ? ", attempts = attempts - 1" : ""} WHERE id = ?`, [error, now, id]);
  await setDue(tx, "op", id, at);
}

/** Gives up on an operation. */
export async function failOp(tx: Tx, id: string, error: string, now: number): Promise<void> {
  await tx.write("UPDATE operations SET state = 'failed', error = ?, updated_at = ? WHERE id = ?", [error, now, id]);
  await clearDue(tx, "op", id);
}

/** Records a proven outcome. */
export async function finishOp(tx: Tx, id: string, result: unknown, now: number): Promise<void> {
  await tx.write("UPDATE operations SET state = 'done', result = ?, error = NULL, updated_at = ? WHERE id = ?", [JSON.stringify(result), now, id]);
  await clearDue(tx, "op", id);
}

/** The first key removal queued for a machine at a generation. */
export async function firstRemovalAt(tx: Tx, machineId: string, generation: number): Promise<Pick<OpRow, "attempts" | "state"> | undefined> {
  return tx.get<{ attempts: number; state: OpRow["state"] }>(
    "SELECT attempts, state FROM operations WHERE machine_id = ? AND generation = ? AND kind = 'remove_key' ORDER BY created_at LIMIT 1",
    [machineId, generation],
  );
}

/** Operations of a machine not yet done or failed. */
export async function countOpenOps(tx: Tx, machineId: string): Promise<number> {
  const r = await tx.get<{ n: number }>("SELECT COUNT(*) AS n FROM operations WHERE machine_id = ? AND state IN ('pending','running')", [machineId]);
  return Number(r?.n ?? 0);
}

export async function deleteOpsOfMachine(tx: Tx, machineId: string): Promise<void> {
  await tx.write("DELETE FROM operations WHERE machine_id = ?", [machineId]);
}
