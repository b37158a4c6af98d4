/**
 * Capacity accounting shared by ensure, the reconciler and registration: one
 * grouped count over the pool's machines and claims, read inside the
 * caller's transaction after the pool row is locked, so concurrent callers
 * (several coordinators included) never issue claims past maxReady.
 */
import type { Tx } from "../../store/store.js";
import type { CapacityCounts } from "../../core/pool.js";
import { createHmac } from "node:crypto";
import { hashToken } from "../../core/tokens.js";
import { setDue } from "../../store/due.js";
import { countOpenClaims, insertClaim } from "../../store/claims.js";
import { countHoldingMachines } from "../../store/machines.js";

export async function countCapacity(tx: Tx, org: string, pool: string, now: number): Promise<CapacityCounts> {
  const rows = await countHoldingMachines(tx, org, pool);
  const c: CapacityCounts = { ready: 0, lent: 0, cleanup: 0, openClaims: 0 };
  for (const r of rows) {
    const n = r.n;
    if (r.state === "ready") c.ready += n;
    else if (r.state === "reserved" || r.state === "installing" || r.state === "busy") c.lent += n;
    else c.cleanup += n;
  }
  c.openClaims = await countOpenClaims(tx, org, pool, now);
  return c;
}

/**
 * Claim tokens are derived from a seed drawn before the transaction, so a
 * retried transaction issues the same tokens (randomness stays outside).
 */
export function claimToken(seed: Uint8Array, i: number): string {
  return "bct_" + createHmac("sha256", seed).update(`token:${i}`).digest("base64url");
}

export function claimId(seed: Uint8Array, i: number): string {
  return "clm_" + createHmac("sha256", seed).update(`id:${i}`).digest("hex").slice(0, 24);
}

export interface IssuedClaim {
  id: string;
  token: string;
  expiresAt: number;
}

export async function insertClaims(
  tx: Tx,
  input: { org: string; pool: string; count: number; seed: Uint8Array; now: number; ttlMs: number },
): Promise<IssuedClaim[]> {
  const out: IssuedClaim[] = [];
  for (let i = 0; i < input.count; i++) {
    const id = claimId(input.seed, i);
    const token = claimToken(input.seed, i);
    const expiresAt = input.now + input.ttlMs;
    await insertClaim(tx, { id, org: input.org, pool: input.pool, tokenHash: hashToken("claim", token), now: input.now, expiresAt });
    await setDue(tx, "claim", id, expiresAt);
    out.push({ id, token, expiresAt });
  }
  return out;
}
