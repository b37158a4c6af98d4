/**
 * Portable grants: pure decisions. A grant binds borrower, org, pool,
 * machine, resource identity, token hashes, generation, key fingerprint and
 * an expiry fixed at issue:
 *
 *   expiresAt = min(now + requested, now + 30 min, machine hard TTL, authorization expiry)
 *
 * Nothing ever moves it. At `now == expiresAt` the grant is already expired.
 *
 *   pending -> installing -> active -> invalidated(reason) -> revoked -> fenced -> closed
 *
 * and any failure or doubt on the way out quarantines the machine; the grant
 * is closed when the machine is confirmed destroyed.
 */
import { assertNever } from "./errors.js";

export type GrantState = "pending" | "installing" | "active" | "invalidated" | "revoked" | "fenced" | "closed";

export const MAX_GRANT_MS = 30 * 60_000;

export function grantExpiresAt(input: { now: number; requestedMs: number | null; maxMs: number; machineHardExpiresAt: number; authorizationExpiresAt: number | null }): number {
  const cap = Math.min(input.maxMs, MAX_GRANT_MS);
  const requested = input.requestedMs === null ? cap : Math.min(input.requestedMs, cap);
  return Math.min(input.now + requested, input.now + MAX_GRANT_MS, input.machineHardExpiresAt, input.authorizationExpiresAt ?? Number.POSITIVE_INFINITY);
}

export function isExpired(expiresAt: number, now: number): boolean {
  return now >= expiresAt;
}

/** Whether the grant still confers access (the store's view; the agent enforces expiry itself too). */
export function grantUsable(g: { state: GrantState; expiresAt: number }, now: number): boolean {
  return g.state === "active" && !isExpired(g.expiresAt, now);
}

/** Why a grant is being invalidated; decides where its machine goes. */
export type InvalidationReason = "returned" | "ended_by_operator" | "drained" | "expired" | "ack_timeout" | "heartbeat_missed" | "token_revoked" | "revalidation_failed" | "identity_drift" | "machine_lost";

/**
 * Where the machine goes after invalidation: through proven cleanup (remove
 * key, fence, scrub) back to ready, or straight to quarantine. An abandoned
 * borrow (ack timeout, missed heartbeat) or any doubt is never made ready by
 * time passing.
 */
export function afterInvalidation(reason: InvalidationReason): "cleanup" | "quarantine" | "drain" {
  switch (reason) {
    case "returned":
    case "ended_by_operator":
    case "expired":
    case "token_revoked":
      return "cleanup";
    case "drained":
      return "drain";
    case "ack_timeout":
    case "heartbeat_missed":
    case "revalidation_failed":
    case "identity_drift":
    case "machine_lost":
      return "quarantine";
    default:
      return assertNever(reason, "invalidation reason");
  }
}

export type AckDecision =
  | { kind: "install" }
  | { kind: "replay"; state: GrantState }
  | { kind: "refuse"; code: "grant_expired" | "grant_not_pending" | "key_mismatch" | "generation_mismatch" | "forbidden"; why: string };

export interface AckInput {
  grant: { state: GrantState; ackDeadline: number; expiresAt: number; fingerprint: string; generation: number; borrower: string; org: string };
  machine: { state: string; generation: number } | null;
  principal: { tokenId: string; org: string; expiresAt: number | null };
  fingerprint: string;
  now: number;
}

/** The checks of an acknowledgement, in order; the caller has already matched both token hashes. */
export function ackDecision(i: AckInput): AckDecision {
  const g = i.grant;
  if (i.principal.org !== g.org || i.principal.tokenId !== g.borrower) return { kind: "refuse", code: "forbidden", why: "the grant was issued to another borrower" };
  if (i.fingerprint !== g.fingerprint) return { kind: "refuse", code: "key_mismatch", why: "the public key differs from the one the grant was issued for" };
  // A replay is answered with where the grant stands, but never as usable once
  // expired: at now == expiresAt the grant is expired everywhere, even before
  // the reconciler has invalidated it.
  if ((g.state === "installing" || g.state === "active") && isExpired(g.expiresAt, i.now)) return { kind: "refuse", code: "grant_expired", why: "the grant's hard deadline has passed" };
  if (g.state === "installing" || g.state === "active") return { kind: "replay", state: g.state };
  if (g.state !== "pending") return { kind: "refuse", code: "grant_not_pending", why: `the grant is ${g.state}` };
  if (isExpired(g.expiresAt, i.now)) return { kind: "refuse", code: "grant_expired", why: "the grant's hard deadline has passed" };
  if (i.now >= g.ackDeadline) return { kind: "refuse", code: "grant_expired", why: "the acknowledgement deadline has passed" };
  if (i.principal.expiresAt !== null && i.principal.expiresAt < g.expiresAt) {
    return { kind: "refuse", code: "forbidden", why: "the borrower's authorization now ends before the grant's deadline" };
  }
  if (!i.machine || i.machine.state !== "reserved" || i.machine.generation !== g.generation) {
    return { kind: "refuse", code: "generation_mismatch", why: "the machine moved on from the grant's generation" };
  }
  return { kind: "install" };
}
