/**
 * The dashboard's sessions (`ui_sessions`, coordinator migration 6). A
 * session is opened by signing in with an API token once; the browser then
 * holds only a random session id in an httpOnly cookie, and this table holds
 * only its domain-separated hash, the token it was opened with (by id), and a
 * short, fixed expiry. Every request re-reads the session with its token, so
 * a revoked or expired token ends its sessions at once; signing out deletes
 * the row, so the old cookie is refused from the next request on.
 */
import type { Migration } from "./migrate.js";
import type { Store } from "./store.js";
import type { ApiTokenRow } from "./api-tokens.js";

export const UI_SESSIONS_MIGRATION: Migration = {
  version: 6,
  name: "dashboard sessions",
  sql: `
CREATE TABLE ui_sessions (
  hash TEXT PRIMARY KEY,
  token_id TEXT NOT NULL,
  created_at BIGINT NOT NULL,
  expires_at BIGINT NOT NULL
);
CREATE INDEX ui_sessions_expiry ON ui_sessions (expires_at);
`,
};

export interface SessionRow {
  hash: string;
  tokenId: string;
  createdAt: number;
  expiresAt: number;
  /** The token the session was opened with, as stored now (undefined once deleted). */
  token: ApiTokenRow | undefined;
  /** That token's label. */
  label: string | null;
}

/** Records a new session; expired sessions are pruned in the same transaction. */
export async function insertSession(store: Store, s: { hash: string; tokenId: string; now: number; expiresAt: number }): Promise<void> {
  await store.transaction(async (tx) => {
    await tx.run("DELETE FROM ui_sessions WHERE expires_at <= ?", [s.now]);
    await tx.run("INSERT INTO ui_sessions (hash, token_id, created_at, expires_at) VALUES (?, ?, ?, ?)", [s.hash, s.tokenId, s.now, s.expiresAt]);
  }, { name: "ui_session_open" });
}

/** One committed read of a session and its token (no transaction): a sign-out or revocation is seen by the next request. */
export async function readSession(store: Store, hash: string): Promise<SessionRow | undefined> {
  const r = await store.readCommitted<{ hash: string; token_id: string; created_at: number; expires_at: number; id: string | null; org: string; role: ApiTokenRow["role"]; t_expires_at: number | null; revoked_at: number | null; label: string | null }>(
    `SELECT s.hash, s.token_id, s.created_at, s.expires_at, t.id, t.org, t.role, t.expires_at AS t_expires_at, t.revoked_at, t.label
     FROM ui_sessions s LEFT JOIN api_tokens t ON t.id = s.token_id WHERE s.hash = ?`,
    [hash],
  );
  if (!r) return undefined;
  return {
    hash: r.hash,
    tokenId: r.token_id,
    createdAt: Number(r.created_at),
    expiresAt: Number(r.expires_at),
    token: r.id === null ? undefined : { id: r.id, org: r.org, role: r.role, expires_at: r.t_expires_at === null ? null : Number(r.t_expires_at), revoked_at: r.revoked_at === null ? null : Number(r.revoked_at) },
    label: r.label ?? null,
  };
}

/** Ends a session; resolves to whether it existed. */
export async function deleteSession(store: Store, hash: string): Promise<boolean> {
  return (await store.transaction((tx) => tx.run("DELETE FROM ui_sessions WHERE hash = ?", [hash]), { name: "ui_session_close" })) === 1;
}
