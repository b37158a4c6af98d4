/**
 * Session records: the durable trace of every session terminal, so that a
 * restarted agent knows what the previous process may have left running.
 *
 *   intent ──▶ running ──▶ release_intent ──▶ clean
 *      └──────────────────────▲ (exec failed / channel lost before running)
 *
 * - `intent` is written before the runtime is asked to exec anything.
 * - `running` is written in one transaction together with the exact
 *   identities (exec client, group leader, process group); terminal events
 *   are admitted only after it committed.
 * - `release_intent` keeps every identity; it is written before the first
 *   signal of a release, so a crash mid-release resumes from it.
 * - `clean` is written only once the group, the exec client and the PTY are
 *   all verified gone.
 *
 * The interface is deliberately tiny (three calls) so that the agent daemon can
 * back it with its own store; two implementations live here: in memory (tests,
 * an agent without a state directory) and a table in a better-sqlite3 database.
 */
import type Database from "better-sqlite3";
import type { ProcessIdentity } from "../runtime/types.js";

export type SessionState = "intent" | "running" | "release_intent" | "clean";

export interface SessionRecord {
  sessionId: string;
  machineId: string;
  /** The grant (or keeper borrow) of the key that opened the session. */
  grantId: string;
  /** SHA256 fingerprint of that key. */
  fingerprint: string;
  /** Whether the session has a PTY (interactive). */
  pty: boolean;
  /** The machine's incarnation when the session started (null if unknown). */
  incarnation: string | null;
  state: SessionState;
  /** Host identity of the exec client (the child itself, or `runsc exec`); null before `running`. */
  client: ProcessIdentity | null;
  /** The command's group leader as the runtime sees it; null before `running`. */
  leader: ProcessIdentity | null;
  /** Why the session is being (or was) released, and any retained mismatch; for operators. */
  note: string | null;
  createdAt: number;
  updatedAt: number;
}

/**
 * What sessions need from storage. Each call is one transaction.
 * Implementations must make `transition` an atomic compare-and-set.
 */
export interface SessionStore {
  /** Record a new session in state `intent` (no identities yet). */
  create(rec: SessionRecord): void;
  /**
   * Move `sessionId` to `patch.state` (merging the other fields of `patch`)
   * only if its current state is one of `from`. Returns the new record, or
   * null when the record is absent or in another state (nothing written).
   */
  transition(sessionId: string, from: readonly SessionState[], patch: Partial<SessionRecord> & { state: SessionState }): SessionRecord | null;
  /** Every record not yet `clean` (what recovery must look at). */
  unfinished(): SessionRecord[];
}

/** In-memory store: clean records are dropped at once (nothing reads them). */
export function memorySessionStore(): SessionStore & { all(): SessionRecord[] } {
  const rows = new Map<string, SessionRecord>();
  return {
    create(rec) {
      if (rows.has(rec.sessionId)) throw new Error(`session ${rec.sessionId} already recorded`);
      rows.set(rec.sessionId, { ...rec });
    },
    transition(id, from, patch) {
      const cur = rows.get(id);
      if (!cur || !from.includes(cur.state)) return null;
      const next = { ...cur, ...patch, sessionId: cur.sessionId };
      if (next.state === "clean") rows.delete(id);
      else rows.set(id, next);
      return { ...next };
    },
    unfinished() {
      return [...rows.values()].filter((r) => r.state !== "clean").map((r) => ({ ...r }));
    },
    all() {
      return [...rows.values()].map((r) => ({ ...r }));
    },
  };
}

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

/**
 * A table `agent_sessions` in a better-sqlite3 database the caller opened (and
 * holds the lock for). Clean rows are kept for `cleanRetentionMs` and pruned
 * lazily on later writes, so the table stays small.
 */
export function sqliteSessionStore(db: Database.Database, opts: { cleanRetentionMs?: number } = {}): SessionStore {
  const retention = opts.cleanRetentionMs ?? 24 * 3600_000;
  db.exec(`CREATE TABLE IF NOT EXISTS agent_sessions (
    session_id TEXT PRIMARY KEY,
    machine_id TEXT NOT NULL,
    grant_id TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    pty INTEGER NOT NULL,
    incarnation TEXT,
    state TEXT NOT NULL CHECK (state IN ('intent','running','release_intent','clean')),
    client TEXT,
    leader TEXT,
    note TEXT,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
  );
  CREATE INDEX IF NOT EXISTS agent_sessions_unfinished ON agent_sessions(state) WHERE state <> 'clean';
  CREATE INDEX IF NOT EXISTS agent_sessions_clean ON agent_sessions(updated_at) WHERE state = 'clean';`);
  const insert = db.prepare(`INSERT INTO agent_sessions
    (session_id, machine_id, grant_id, fingerprint, pty, incarnation, state, client, leader, note, created_at, updated_at)
    VALUES (@session_id, @machine_id, @grant_id, @fingerprint, @pty, @incarnation, @state, @client, @leader, @note, @created_at, @updated_at)`);
  const get = db.prepare(`SELECT * FROM agent_sessions WHERE session_id = ?`);
  const update = db.prepare(`UPDATE agent_sessions SET state=@state, client=@client, leader=@leader, note=@note,
    incarnation=@incarnation, updated_at=@updated_at WHERE session_id=@session_id`);
  const unfinished = db.prepare(`SELECT * FROM agent_sessions WHERE state <> 'clean' ORDER BY created_at`);
  const prune = db.prepare(`DELETE FROM agent_sessions WHERE state = 'clean' AND updated_at < ?`);

  const toRow = (r: SessionRecord): Row => ({
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
  });

  const transition = db.transaction(
    (id: string, from: readonly SessionState[], patch: Partial<SessionRecord> & { state: SessionState }): SessionRecord | null => {
      const row = get.get(id) as Row | undefined;
      if (!row) return null;
      const cur = fromRow(row);
      if (!from.includes(cur.state)) return null;
      const next: SessionRecord = { ...cur, ...patch, sessionId: cur.sessionId };
      update.run(toRow(next));
      if (next.state === "clean") prune.run(next.updatedAt - retention);
      return next;
    },
  );

  return {
    create(rec) {
      insert.run(toRow(rec));
    },
    transition(id, from, patch) {
      return transition.immediate(id, from, patch);
    },
    unfinished() {
      return (unfinished.all() as Row[]).map(fromRow);
    },
  };
}
