/**
 * The agent's operation records (table `operations`, migration 1): one row
 * per operation id, `started` before anything acts (or written with its
 * result, for an operation that is one local transaction), `done` with the
 * result the coordinator is answered with (every retry gets the same), or
 * `failed` with the last error (a retry runs it again). The protocol is
 * src/agent/operations/dispatch.ts.
 */
import { parseId, type Id } from "../../core/ids.js";
import { OPERATION_KINDS, type OperationKind } from "../../protocol/operations.js";
import type { Statements } from "../../store/sqlite/statements.js";

export type OpStatus = "started" | "done" | "failed";

export interface OpRecord {
  opId: Id;
  kind: OperationKind;
  machineId: Id;
  generation: number;
  argsHash: string;
  status: OpStatus;
  /** The result as recorded (JSON); read through the operation contract (dispatch.ts `reply`). */
  result: unknown;
  error: string | null;
  createdAt: number;
  finishedAt: number | null;
}

/** What an operation's row says before its result: who it is, and the hash of its arguments. */
export interface OpIntent {
  opId: string;
  kind: OperationKind;
  machineId: string;
  generation: number;
  argsHash: string;
}

interface Row {
  op_id: string;
  kind: string;
  machine_id: string;
  generation: number;
  args_hash: string;
  status: OpStatus;
  result: string | null;
  error: string | null;
  created_at: number;
  finished_at: number | null;
}

function kindOf(r: Row): OperationKind {
  const kind = OPERATION_KINDS.find((k) => k === r.kind);
  if (kind === undefined) throw new Error(`agent store: operation ${r.op_id} has the unknown kind ${JSON.stringify(r.kind)}; it was written by another berth build`);
  return kind;
}

function fromRow(r: Row): OpRecord {
  return {
    opId: parseId(r.op_id, "recorded operation id"),
    kind: kindOf(r),
    machineId: parseId(r.machine_id, "recorded machine id"),
    generation: r.generation,
    argsHash: r.args_hash,
    status: r.status,
    result: r.result === null ? null : (JSON.parse(r.result) as unknown),
    error: r.error,
    createdAt: r.created_at,
    finishedAt: r.finished_at,
  };
}

export class OperationTable {
  constructor(private readonly q: Statements) {}

  get(opId: string): OpRecord | null {
    const row = this.q("SELECT * FROM operations WHERE op_id = ?").get(opId) as Row | undefined;
    return row ? fromRow(row) : null;
  }

  /** Operations begun and never finished (by a process that crashed, or in flight now). */
  unfinished(machineId: string): OpRecord[] {
    return (this.q("SELECT * FROM operations WHERE machine_id = ? AND status <> 'done' ORDER BY created_at").all(machineId) as Row[]).map(fromRow);
  }

  insert(op: OpIntent & { now: number }): void {
    this.q(
      `INSERT INTO operations (op_id, kind, machine_id, generation, args_hash, status, created_at)
       VALUES (@opId, @kind, @machineId, @generation, @argsHash, 'started', @now)`,
    ).run(op);
  }

  markStarted(opId: string): void {
    this.q("UPDATE operations SET status = 'started', error = NULL WHERE op_id = ?").run(opId);
  }

  finish(opId: string, result: unknown, now: number): void {
    this.q("UPDATE operations SET status = 'done', result = ?, error = NULL, finished_at = ? WHERE op_id = ?").run(JSON.stringify(result), now, opId);
  }

  fail(opId: string, error: string, now: number): void {
    this.q("UPDATE operations SET status = 'failed', error = ?, finished_at = ? WHERE op_id = ? AND status <> 'done'").run(error, now, opId);
  }
}
