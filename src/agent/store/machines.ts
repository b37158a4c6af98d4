/**
 * The agent's machine records (table `machines`, migration 1): one row per
 * machine this host ever held, its generation, state and the runtime's
 * identity of it. A `destroyed` row is kept, so a delayed provision of the
 * same id can never bring the machine back.
 */
import type { Statements } from "../../store/sqlite/statements.js";

export type MachineState = "creating" | "running" | "destroying" | "destroyed" | "mismatch";

export interface MachineRecord {
  id: string;
  generation: number;
  state: MachineState;
  incarnation: string | null;
  workspace: string | null;
  identity: Record<string, string | number> | null;
  mismatch: string | null;
  createdAt: number;
  updatedAt: number;
}

interface Row {
  id: string;
  generation: number;
  state: MachineState;
  incarnation: string | null;
  workspace: string | null;
  identity: string | null;
  mismatch: string | null;
  created_at: number;
  updated_at: number;
}

function fromRow(r: Row): MachineRecord {
  return {
    id: r.id,
    generation: r.generation,
    state: r.state,
    incarnation: r.incarnation,
    workspace: r.workspace,
    identity: r.identity === null ? null : (JSON.parse(r.identity) as Record<string, string | number>),
    mismatch: r.mismatch,
    createdAt: r.created_at,
    updatedAt: r.updated_at,
  };
}

export class MachineTable {
  constructor(private readonly q: Statements) {}

  get(id: string): MachineRecord | null {
    const row = this.q("SELECT * FROM machines WHERE id = ?").get(id) as Row | undefined;
    return row ? fromRow(row) : null;
  }

  /** Every machine record, destroyed ones included when `all`. */
  list(all = false): MachineRecord[] {
    const sql = all ? "SELECT * FROM machines ORDER BY id" : "SELECT * FROM machines WHERE state <> 'destroyed' ORDER BY id";
    return (this.q(sql).all() as Row[]).map(fromRow);
  }

  put(m: MachineRecord): void {
    this.q(
      `INSERT INTO machines (id, generation, state, incarnation, workspace, identity, mismatch, created_at, updated_at)
       VALUES (@id, @generation, @state, @incarnation, @workspace, @identity, @mismatch, @createdAt, @updatedAt)
       ON CONFLICT(id) DO UPDATE SET generation = excluded.generation, state = excluded.state,
         incarnation = excluded.incarnation, workspace = excluded.workspace, identity = excluded.identity,
         mismatch = excluded.mismatch, updated_at = excluded.updated_at`,
    ).run({ ...m, identity: m.identity === null ? null : JSON.stringify(m.identity) });
  }
}
