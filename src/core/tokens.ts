/**
 * Bearer secrets (API tokens, borrow tokens, grant tokens, fill-claim tokens,
 * agent tokens). The raw value is shown once to its caller; everything stored
 * is a domain-separated SHA-256 hash, so a hash of one kind can never be
 * replayed as another kind (invariant 8).
 */
import { createHmac, hash, timingSafeEqual } from "node:crypto";

export type TokenDomain = "api" | "borrow" | "grant" | "claim" | "agent" | "enroll" | "host-call" | "host-credential" | "session" | "csrf";

const PREFIX: Record<TokenDomain, string> = {
  api: "bat",
  borrow: "bbt",
  grant: "bgt",
  claim: "bct",
  agent: "bag",
  enroll: "ben",
  "host-call": "bhc",
  // The dashboard's session cookie, and the CSRF token derived from it (never issued raw).
  session: "bss",
  csrf: "bcs",
  "host-credential": "bhk",
};

/** A raw token: recognisable prefix + 32 random bytes, base64url. */
export function newToken(domain: TokenDomain, randomBytes: (n: number) => Uint8Array): string {
  return `${PREFIX[domain]}_${Buffer.from(randomBytes(32)).toString("base64url")}`;
}

export function hashToken(domain: TokenDomain, raw: string): string {
  // One-shot: the same bytes as createHash().update(prefix).update(raw), at a third of the cost (no Hash object).
  return hash("sha256", `berth.${domain}.v1\0${raw}`, "hex");
}

/** Constant-time comparison of two hex hashes. */
export function sameHash(a: string, b: string): boolean {
  if (a.length !== b.length) return false;
  return timingSafeEqual(Buffer.from(a), Buffer.from(b));
}

/**
 * The token the coordinator presents to one enrolled host: an HMAC of the host
 * id under the coordinator's secret, so the database holds no credential (the
 * agent stores only its hash). Once the host's identity is recorded
 * (docs/host-identity.md) the token is bound to its identity key's
 * fingerprint too: the legacy token stops working, and only an agent that
 * proved the key was ever given the new one.
 */
export function hostCallToken(secret: Uint8Array, hostId: string, identityFingerprint: string | null = null): string {
  const subject = identityFingerprint === null ? `host-call:${hostId}` : `host-call:${hostId}:${identityFingerprint}`;
  return `${PREFIX["host-call"]}_` + createHmac("sha256", secret).update(subject).digest("base64url");
}
