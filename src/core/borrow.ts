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
