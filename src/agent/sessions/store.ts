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
 * back it with its own store (the table `agent_sessions`,
 * src/agent/store/sessions.ts); the one here lives in memory (tests, a
 * gateway without a state directory).
 */
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
