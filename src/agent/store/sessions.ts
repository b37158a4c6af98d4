/**
 * Session records (table `agent_sessions`, migration 4): the durable trace of
 * every session terminal (src/agent/sessions/store.ts has the states and the
 * contract), so that a restarted agent knows what the previous process may
 * have left running. `transition` is one immediate transaction: an atomic
 * compare-and-set on the state.
 */
import type Database from "better-sqlite3";
import type { ProcessIdentity } from "../runtime/types.js";
import type { SessionRecord, SessionState, SessionStore } from "../sessions/store.js";
import type { Statements } from "../../store/sqlite/statements.js";

interface Row {
  session_id: string;
  machine_id: string;
  grant_id: string;
  fingerprint: string;
  pty: number;
  incarnation: string | null;
  state: SessionState;
  client: string | null;
  leader: string | null;
  note: string | null;
  created_at: number;
  updated_at: number;
}

function fromRow(r: Row): SessionRecord {
  return {
    sessionId: r.session_id,
    machineId: r.machine_id,
    grantId: r.grant_id,
    fingerprint: r.fingerprint,
    pty: r.pty === 1,
    incarnation: r.incarnation,
    state: r.state,
    client: r.client ? (JSON.parse(r.client) as ProcessIdentity) : null,
    leader: r.leader ? (JSON.parse(r.leader) as ProcessIdentity) : null,
    note: r.note,
    createdAt: r.created_at,
    updatedAt: r.updated_at,
  };
}

function toRow(r: SessionRecord): Row {
  return {
    session_id: r.sessionId,
    machine_id: r.machineId,
    grant_id: r.grantId,
    fingerprint: r.fingerprint,
    pty: r.pty ? 1 : 0,
    incarnation: r.incarnation,
    state: r.state,
    client: r.client ? JSON.stringify(r.client) : null,
    leader: r.leader ? JSON.stringify(r.leader) : null,
    note: r.note,
    created_at: r.createdAt,
    updated_at: r.updatedAt,
  };
}

/** Clean rows are kept for `cleanRetentionMs` and pruned lazily on later writes, so the table stays small. */
export class SessionTable implements SessionStore {
  readonly #retention: number;
  readonly #transition: Database.Transaction<(id: string, from: readonly SessionState[], patch: Partial<SessionRecord> & { state: SessionState }) => SessionRecord | null>;

  constructor(private readonly q: Statements, db: Database.Database, opts: { cleanRetentionMs?: number } = {}) {
    this.#retention = opts.cleanRetentionMs ?? 24 * 3600_000;
    this.#transition = db.transaction((id, from, patch) => {
      const row = this.q("SELECT * FROM agent_sessions WHERE session_id = ?").get(id) as Row | undefined;
      if (!row) return null;
      const cur = fromRow(row);
      if (!from.includes(cur.state)) return null;
      const next: SessionRecord = { ...cur, ...patch, sessionId: cur.sessionId };
      this.q(
        `UPDATE agent_sessions SET state=@state, client=@client, leader=@leader, note=@note,
           incarnation=@incarnation, updated_at=@updated_at WHERE session_id=@session_id`,
      ).run(toRow(next));
      if (next.state === "clean") this.q("DELETE FROM agent_sessions WHERE state = 'clean' AND updated_at < ?").run(next.updatedAt - this.#retention);
      return next;
    });
  }

  create(rec: SessionRecord): void {
    this.q(
      `INSERT INTO agent_sessions
         (session_id, machine_id, grant_id, fingerprint, pty, incarnation, state, client, leader, note, created_at, updated_at)
       VALUES (@session_id, @machine_id, @grant_id, @fingerprint, @pty, @incarnation, @state, @client, @leader, @note, @created_at, @updated_at)`,
    ).run(toRow(rec));
  }

  transition(id: string, from: readonly SessionState[], patch: Partial<SessionRecord> & { state: SessionState }): SessionRecord | null {
    return this.#transition.immediate(id, from, patch);
  }

  unfinished(): SessionRecord[] {
    return (this.q("SELECT * FROM agent_sessions WHERE state <> 'clean' ORDER BY created_at").all() as Row[]).map(fromRow);
  }
}
