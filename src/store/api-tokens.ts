/**
 * The `api_tokens` table: API tokens stored only as domain-separated hashes.
 * Creation and revocation are whole store operations (used by the
 * coordinator and by `berth token` on the coordinator's database).
 */
import type { Store } from "./store.js";
import { hashToken, newToken } from "../core/tokens.js";
import { newId } from "../core/ids.js";
import type { Role } from "../core/roles.js";
import type { Tx } from "./store.js";
import { setDue } from "./due.js";
import { countLiveGrantsOfBorrower } from "./grants.js";

export interface ApiTokenRow {
  id: string;
  org: string;
  role: Role;
  expires_at: number | null;
  revoked_at: number | null;
}

/** One committed read (no transaction): a revocation is seen from the request after its commit on. */
export async function readApiToken(store: Store, hash: string): Promise<ApiTokenRow | undefined> {
  return store.readCommitted<ApiTokenRow>("SELECT id, org, role, expires_at, revoked_at FROM api_tokens WHERE hash = ?", [hash]);
}

/** Every token, oldest first: ids, roles and dates only (the table holds no token). */
export async function listApiTokens(store: Store): Promise<Array<ApiTokenRow & { label: string | null; created_at: number }>> {
  return store.transaction((tx) =>
    tx.all<ApiTokenRow & { label: string | null; created_at: number }>("SELECT id, org, role, label, created_at, expires_at, revoked_at FROM api_tokens ORDER BY created_at"),
  );
}

/** The tokens of one organisation, oldest first (ids, roles and dates only). */
export async function listApiTokensOfOrg(store: Store, org: string): Promise<Array<ApiTokenRow & { label: string | null; created_at: number }>> {
  return store.transaction((tx) =>
    tx.all<ApiTokenRow & { label: string | null; created_at: number }>("SELECT id, org, role, label, created_at, expires_at, revoked_at FROM api_tokens WHERE org = ? ORDER BY created_at, id", [org]),
  );
}

export interface CreatedToken {
  id: string;
  token: string;
  org: string;
  role: Role;
  expiresAt: number | null;
}

export async function createToken(
  store: Store,
  input: { org: string; role: Role; expiresAt: number | null; label: string | null },
  now: number,
  randomBytes: (n: number) => Uint8Array,
): Promise<CreatedToken> {
  const id = newId("tok", randomBytes);
  const token = newToken("api", randomBytes);
  const hash = hashToken("api", token);
  await store.transaction((tx) =>
    tx.run("INSERT INTO api_tokens (id, org, role, hash, label, created_at, expires_at, revoked_at) VALUES (?, ?, ?, ?, ?, ?, ?, NULL)", [
      id, input.org, input.role, hash, input.label, now, input.expiresAt,
    ]),
  );
  return { id, token, org: input.org, role: input.role, expiresAt: input.expiresAt };
}

/** Inserts a token row inside the caller's transaction (a reset's one-time enroll token). */
export async function insertToken(tx: Tx, row: { id: string; org: string; role: Role; hash: string; label: string | null }, now: number): Promise<void> {
  await tx.run("INSERT INTO api_tokens (id, org, role, hash, label, created_at, expires_at, revoked_at) VALUES (?, ?, ?, ?, ?, ?, NULL, NULL)", [
    row.id, row.org, row.role, row.hash, row.label, now,
  ]);
}

/**
 * Revokes a token at once (every later request with it is refused) and, in
 * the same transaction, leaves a due row so the coordinator invalidates the
 * token's live portable grants and cleans their machines up.
 */
export async function revokeTokenWithGrants(store: Store, id: string, now: number): Promise<{ revoked: boolean; grants: number }> {
  return store.transaction(async (tx) => {
    const n = await tx.run("UPDATE api_tokens SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL", [now, id]);
    if (n !== 1) return { revoked: false, grants: 0 };
    const grants = await countLiveGrantsOfBorrower(tx, id);
    await setDue(tx, "revoke", id, now);
    return { revoked: true, grants };
  });
}
