/**
 * API tokens. Created by `berth token create`, stored only as
 * domain-separated hashes, and re-checked on every request: an expired or
 * revoked token is refused at once. Organisations are isolated: every query
 * a principal makes is scoped to its org.
 */
import { BerthError } from "../core/errors.js";
import { hashToken, newToken } from "../core/tokens.js";
import { newId } from "../core/ids.js";
import type { Store } from "../store/store.js";
import { setDue } from "../store/rows.js";

export type Role = "admin" | "operator" | "member" | "agent";
export const ROLES: readonly Role[] = ["admin", "operator", "member", "agent"];

export interface Principal {
  tokenId: string;
  org: string;
  role: Role;
  /** Authorization expiry (caps portable grants); null = no expiry. */
  expiresAt: number | null;
}

const RANK: Record<Role, number> = { agent: 0, member: 1, operator: 2, admin: 3 };

/** Whether `p` may act with `needed`; agent tokens are only for host enrollment. */
export function allows(p: Principal, needed: Role): boolean {
  if (needed === "agent") return p.role === "agent" || p.role === "admin";
  if (p.role === "agent") return false;
  return RANK[p.role] >= RANK[needed];
}

export function requireRole(p: Principal, needed: Role): void {
  if (!allows(p, needed)) throw new BerthError("forbidden", `forbidden: this action needs the ${needed} role; the token has ${p.role}`);
}

interface TokenRow {
  id: string;
  org: string;
  role: Role;
  expires_at: number | null;
  revoked_at: number | null;
}

export async function authenticate(store: Store, header: string | undefined, now: number): Promise<Principal> {
  if (!header || !header.startsWith("Bearer ")) {
    throw new BerthError("unauthorized", "unauthorized: send an API token as 'Authorization: Bearer <token>' (create one with `berth token create`)");
  }
  const raw = header.slice(7).trim();
  const hash = hashToken("api", raw);
  // A committed read outside the transaction queue: a revocation is refused
  // from the request after its commit on, without a transaction per request.
  const row = await store.readCommitted<TokenRow>("SELECT id, org, role, expires_at, revoked_at FROM api_tokens WHERE hash = ?", [hash]);
  if (!row) throw new BerthError("unauthorized", "unauthorized: the API token is not known to this coordinator");
  if (row.revoked_at !== null) throw new BerthError("unauthorized", "unauthorized: the API token was revoked");
  if (row.expires_at !== null && now >= row.expires_at) throw new BerthError("unauthorized", "unauthorized: the API token has expired; create a new one");
  return { tokenId: row.id, org: row.org, role: row.role, expiresAt: row.expires_at };
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

/**
 * Revokes a token at once (every later request with it is refused) and, in
 * the same transaction, leaves a due row so the coordinator invalidates the
 * token's live portable grants and cleans their machines up.
 */
export async function revokeTokenWithGrants(store: Store, id: string, now: number): Promise<{ revoked: boolean; grants: number }> {
  return store.transaction(async (tx) => {
    const n = await tx.run("UPDATE api_tokens SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL", [now, id]);
    if (n !== 1) return { revoked: false, grants: 0 };
    const live = await tx.get<{ n: number }>("SELECT COUNT(*) AS n FROM grants WHERE borrower = ? AND state IN ('pending','installing','active')", [id]);
    await setDue(tx, "revoke", id, now);
    return { revoked: true, grants: Number(live?.n ?? 0) };
  });
}
