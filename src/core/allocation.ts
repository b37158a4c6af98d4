/**
 * The allocation lifecycle as a pure transition function.
 *
 *   placed -> launching -> ready                  (budget and host slot reserved at create; launch takes the hold)
 *   placed -> released                            (released or expired before launch: nothing ran, refund at once)
 *   launching | ready -> releasing -> released    (sessions cut, processes proven gone, volume kept or wiped, then refund)
 *   launching -> releasing                        (launch failed: whatever it left is cleaned up like a release)
 *   releasing -> quarantined -> released          (doubtful cleanup keeps slot and budget charged until resolved)
 *   releasing | quarantined -> released           (host_gone: an operator attests the withdrawn host is gone for good)
 *   ready -> failed -> ready                      (the sandbox died, seen by the watch; `berth alloc restart` starts it again, same hold and volume)
 *   failed -> releasing                           (released or expired while failed: cleaned up like a ready one)
 *
 * The slot and the budget are returned (`refund`) only on the edge into
 * `released`, and only once: `released` is terminal. Nothing is ever
 * double-booked because nothing is returned before cleanup is proven.
 */
import { assertNever } from "./errors.js";
import type { HostStanding } from "./allocation-placement.js";
import { formatDuration } from "./durations.js";

export type AllocationState = "placed" | "launching" | "ready" | "failed" | "releasing" | "quarantined" | "released";
export const ALLOCATION_STATES: readonly AllocationState[] = ["placed", "launching", "ready", "failed", "releasing", "quarantined", "released"];

export type ReleaseCause = "owner" | "operator" | "expiry" | "host_withdrawn" | "launch_failed";

export type AllocationEvent =
  | { kind: "launch_started" }
  | { kind: "launched" }
  | { kind: "launch_failed"; reason: string }
  | { kind: "release"; cause: ReleaseCause; keepVolume: boolean }
  | { kind: "cleanup_done" }
  | { kind: "cleanup_doubtful"; reason: string }
  | { kind: "quarantine_resolved" }
  /** The agent reports the allocation's sandbox not running (killed from outside, e.g. by its memory limit). */
  | { kind: "sandbox_died"; reason: string }
  /** The sandbox of a failed allocation runs again (same hold, same volume). */
  | { kind: "restarted" }
  /** An operator attests the (withdrawn) host is gone for good: nothing can be proven on it, nothing of it can come back. */
  | { kind: "host_gone"; by: string };

export type AllocationEffect =
  | { kind: "launch" }
  | { kind: "cleanup"; keepVolume: boolean }
  /** Return the host slot and the owner's budget (same transaction as the state change). */
  | { kind: "refund" };

export type AllocationTransition =
  | { ok: true; state: AllocationState; effects: AllocationEffect[]; reason: string | null; changed: boolean }
  | { ok: false; refusal: string };

const same = (state: AllocationState): AllocationTransition => ({ ok: true, state, effects: [], reason: null, changed: false });
const to = (state: AllocationState, effects: AllocationEffect[] = [], reason: string | null = null): AllocationTransition => ({ ok: true, state, effects, reason, changed: true });
const refuse = (from: AllocationState, e: AllocationEvent): AllocationTransition => ({ ok: false, refusal: `an allocation that is ${from} cannot take ${e.kind}` });

export function allocationTransition(from: AllocationState, e: AllocationEvent): AllocationTransition {
  switch (e.kind) {
    case "launch_started":
      return from === "placed" ? to("launching", [{ kind: "launch" }]) : from === "launching" ? same(from) : refuse(from, e);
    case "launched":
      return from === "launching" ? to("ready") : from === "ready" ? same(from) : refuse(from, e);
    case "launch_failed":
      return from === "launching" ? to("releasing", [{ kind: "cleanup", keepVolume: false }], `launch failed: ${e.reason}`) : refuse(from, e);
    case "release":
      switch (from) {
        case "placed":
          return to("released", [{ kind: "refund" }], `released before launch (${e.cause})`);
        case "launching":
        case "ready":
        case "failed":
          return to("releasing", [{ kind: "cleanup", keepVolume: e.keepVolume }], `release (${e.cause})`);
        case "releasing":
        case "quarantined":
        case "released":
          // Idempotent: a release already under way (or done) is not started twice.
          return same(from);
        default:
          return assertNever(from, "allocation state");
      }
    case "cleanup_done":
      return from === "releasing" ? to("released", [{ kind: "refund" }]) : from === "released" ? same(from) : refuse(from, e);
    case "cleanup_doubtful":
      return from === "releasing" ? to("quarantined", [], e.reason) : from === "quarantined" ? same(from) : refuse(from, e);
    case "quarantine_resolved":
      return from === "quarantined" ? to("released", [{ kind: "refund" }], "quarantine resolved") : refuse(from, e);
    case "sandbox_died":
      return from === "ready" ? to("failed", [], `sandbox died: ${e.reason}`) : from === "failed" ? same(from) : refuse(from, e);
    case "restarted":
      return from === "failed" ? to("ready") : from === "ready" ? same(from) : refuse(from, e);
    case "host_gone":
      return from === "releasing" || from === "quarantined" ? to("released", [{ kind: "refund" }], `host gone (attested by operator ${e.by}): nothing proven on it`) : refuse(from, e);
    default:
      return assertNever(e, "allocation event");
  }
}

/**
 * The launch-time re-check of the host (the placement may be old): a
 * withdrawn or draining host never launches a new allocation — it is
 * released with its reservation returned; a host that is not ready yet is
 * waited for.
 */
export type LaunchGate = { kind: "launch" } | { kind: "wait"; why: string } | { kind: "release"; cause: ReleaseCause; why: string };

export function launchGate(standing: HostStanding): LaunchGate {
  switch (standing) {
    case "ready":
      return { kind: "launch" };
    case "not_ready":
      return { kind: "wait", why: "host is not ready" };
    case "draining":
      return { kind: "release", cause: "host_withdrawn", why: "host is draining" };
    case "withdrawn":
      return { kind: "release", cause: "host_withdrawn", why: "host is withdrawn" };
    default:
      return assertNever(standing, "host standing");
  }
}

/** Whether an allocation has reached its expiry (at equality it has). */
export function expired(expiresAt: number, now: number): boolean {
  return now >= expiresAt;
}

/** The expiry of a new allocation: the requested duration, or the policy maximum when none is asked; longer is refused by the caller. */
export function expiryFor(now: number, requestedMs: number | null, maxMs: number): { ok: true; expiresAt: number } | { ok: false; message: string } {
  const ms = requestedMs ?? maxMs;
  if (!Number.isInteger(ms) || ms < 1) return { ok: false, message: "invalid_request: an allocation's duration must be positive" };
  if (ms > maxMs) return { ok: false, message: `invalid_request: requested duration ${formatDuration(ms)} is past the policy maximum of ${formatDuration(maxMs)}; ask for at most ${formatDuration(maxMs)}` };
  return { ok: true, expiresAt: now + ms };
}
