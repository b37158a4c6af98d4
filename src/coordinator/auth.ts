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

function bearerHash(header: string | undefined): string {
  if (!header || !header.startsWith("Bearer ")) {
    throw new BerthError("unauthorized", "unauthorized: send an API token as 'Authorization: Bearer <token>' (create one with `berth token create`)");
  }
  return hashToken("api", header.slice(7).trim());
}

export async function authenticate(store: Store, header: string | undefined, now: number, cache?: TokenCache): Promise<Principal> {
  const hash = bearerHash(header);
  // A committed read outside the transaction queue: a revocation is refused
  // from the request after its commit on, without a transaction per request.
  const row = await readApiToken(store, hash);
  const p = principalOf(row, now);
  cache?.set(hash, row!);
  return p;
}

/**
 * Token rows this coordinator has read, by hash, for the routes whose action
 * checks the token again inside its own transaction (the keeper borrow and
 * return: the token's row joined to their first read). Such a route takes the
 * principal from here without a read of its own; the transaction's check is
 * what refuses a token revoked since (from any process: it reads the
 * committed row, in the transaction that would act), so a revocation is still
 * refused from the request after its commit on. A token's id, organisation,
 * role and expiry never change; only `revoked_at` does, and that is what the
 * transaction reads.
 */
export class TokenCache {
  readonly #rows = new Map<string, ApiTokenRow>();
  constructor(readonly limit = 10_000) {}
  get(hash: string): ApiTokenRow | undefined {
    return this.#rows.get(hash);
  }
  set(hash: string, row: ApiTokenRow): void {
    if (this.#rows.size >= this.limit && !this.#rows.has(hash)) this.#rows.clear();
    this.#rows.set(hash, row);
  }
  delete(hash: string): void {
    this.#rows.delete(hash);
  }
}

/** A principal whose token the action re-checks in its transaction (`refuseDeadToken`). */
export interface UncheckedPrincipal {
  principal: Principal;
  /** Null when the token was read committed for this request (already checked). */
  cachedHash: string | null;
}

/** The principal from the cache when this process has read the token before; else as `authenticate`. */
export async function authenticateCached(store: Store, cache: TokenCache, header: string | undefined, now: number): Promise<UncheckedPrincipal> {
  const hash = bearerHash(header);
  const row = cache.get(hash);
  if (row) return { principal: principalOf(row, now), cachedHash: hash };
  return { principal: await authenticate(store, header, now, cache), cachedHash: null };
}

/** Refuses, inside the action's transaction, a token that its transaction read found revoked (or gone). */
export function refuseDeadToken(live: boolean): void {
  if (!live) throw new BerthError("unauthorized", "unauthorized: the API token was revoked");
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
