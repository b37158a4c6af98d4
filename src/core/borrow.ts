/**
 * Keeper borrows: decisions over a borrow record and the clock. A heartbeat
 * proves liveness only; it never moves `expiresAt`. At `now == deadline` the
 * deadline has passed (every comparison here is `now >= deadline`).
 */
export interface BorrowCore {
  /** `withdrawn`: ended by the coordinator before it was answered (its machine failed the lend-time check). */
  state: "active" | "returned" | "abandoned" | "expired" | "withdrawn";
  heartbeatDeadline: number;
  expiresAt: number;
}

export type LiveDecision =
  | { kind: "live" }
  | { kind: "ended"; state: BorrowCore["state"] }
  | { kind: "heartbeat_missed"; at: number }
  | { kind: "expired"; at: number };

/** Whether a borrow still stands at `now`; the caller refuses anything but `live`. */
export function liveDecision(b: BorrowCore, now: number): LiveDecision {
  if (b.state !== "active") return { kind: "ended", state: b.state };
  if (now >= b.expiresAt) return { kind: "expired", at: b.expiresAt };
  if (now >= b.heartbeatDeadline) return { kind: "heartbeat_missed", at: b.heartbeatDeadline };
  return { kind: "live" };
}

/** The next heartbeat deadline; never past the hard expiry. */
export function nextHeartbeatDeadline(now: number, heartbeatMs: number, expiresAt: number): number {
  return Math.min(now + heartbeatMs, expiresAt);
}

/** A keeper borrow that asks for no `--duration` lasts this long, or half its pool's hard TTL when that is shorter. */
export const DEFAULT_KEEPER_BORROW_MS = 30 * 60_000;

/**
 * How long a keeper borrow lasts: what it asks (`durationMs`), else the
 * default. The pool caps it: a machine lives `hardTtlMs` and is rotated out
 * `marginMs` before that, so no machine could carry a longer borrow; asking
 * more is `too_long` (refused, never silently shortened).
 */
export function keeperBorrowMs(requestedMs: number | null, pool: { hardTtlMs: number }, marginMs: number): { kind: "ok"; ms: number } | { kind: "too_long"; maxMs: number } {
  const maxMs = pool.hardTtlMs - marginMs;
  if (requestedMs === null) return { kind: "ok", ms: Math.min(DEFAULT_KEEPER_BORROW_MS, Math.floor(pool.hardTtlMs / 2)) };
  if (requestedMs > maxMs) return { kind: "too_long", maxMs };
  return { kind: "ok", ms: requestedMs };
}
