/**
 * API tokens. Created by `berth token create`, stored only as
 * domain-separated hashes, and re-checked on every request: an expired or
 * revoked token is refused at once. Organisations are isolated: every query
 * a principal makes is scoped to its org.
 */
import { BerthError } from "../core/errors.js";
import { hashToken } from "../core/tokens.js";
import { ROLES, type Role } from "../core/roles.js";
import type { Store } from "../store/store.js";
import { readApiToken, type ApiTokenRow } from "../store/api-tokens.js";

export { ROLES, type Role };

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

export async function authenticate(store: Store, header: string | undefined, now: number): Promise<Principal> {
  if (!header || !header.startsWith("Bearer ")) {
    throw new BerthError("unauthorized", "unauthorized: send an API token as 'Authorization: Bearer <token>' (create one with `berth token create`)");
  }
  const raw = header.slice(7).trim();
  const hash = hashToken("api", raw);
  // A committed read outside the transaction queue: a revocation is refused
  // from the request after its commit on, without a transaction per request.
  return principalOf(await readApiToken(store, hash), now);
}

/**
 * The principal of a stored token row, re-checked now: the one check of
 * revocation and expiry, for the API's bearer tokens and the dashboard's
 * sessions (which name the token they were opened with).
 */
export function principalOf(row: ApiTokenRow | undefined, now: number): Principal {
  if (!row) throw new BerthError("unauthorized", "unauthorized: the API token is not known to this coordinator");
  if (row.revoked_at !== null) throw new BerthError("unauthorized", "unauthorized: the API token was revoked");
  if (row.expires_at !== null && now >= row.expires_at) throw new BerthError("unauthorized", "unauthorized: the API token has expired; create a new one");
  return { tokenId: row.id, org: row.org, role: row.role, expiresAt: row.expires_at };
}

export { createToken, revokeTokenWithGrants, type CreatedToken } from "../store/api-tokens.js";
