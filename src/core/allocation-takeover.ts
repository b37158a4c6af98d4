/**
 * Takeover of an allocation's launch actor.
 *
 * A launch is a durable operation with an actor record: (allocation,
 * generation, actor id), written before the actor asks the agent for the
 * slot hold. If the actor dies (coordinator SIGKILL) after writing the
 * record and before the hold, nothing on the agent names the allocation,
 * and without a way out the owner would be wedged: the slot and budget stay
 * charged forever. A replacement actor (another coordinator, or the same one
 * after a restart) decides with this pure function, over
 *   - the prior actor's standing (is the recorded actor still running, done,
 *     or unknowable?) and
 *   - a fresh observation of the hold on the agent (a hold matching the
 *     recorded generation, none, one for something else, or unreadable),
 *   - and what the allocation wants now (launched, or retired because it was
 *     released or expired meanwhile).
 *
 * The arms:
 *   hold or actor unreadable              -> retain (keep the obligation, retry later)
 *   hold matching the recorded generation -> recover (publish that hold; never take a second)
 *   hold of this allocation at another
 *   generation, or after a tombstone      -> stale_hold (no actor owns it: the allocation is
 *                                            released and the cleanup releases the hold)
 *   hold belonging to something else      -> retain (an operator must look; never adopt it)
 *   no hold, actor still running          -> retain (it may yet take the hold)
 *   no hold, actor terminal or none:
 *       wanted                            -> cas_new_actor (from the exact old record)
 *       retired                           -> tombstone     (from the exact old record)
 *
 * `cas_new_actor` and `tombstone` carry the exact record they replace: the
 * store writes the new one only if the stored record is still that one, so
 * two replacements racing on one generation admit exactly one.
 *
 * Fencing does not depend on arrival order: the observation that can decide
 * `cas_new_actor` or `tombstone` (prior actor terminal, or none) is made with
 * `fenceFloor` — the agent raises the allocation's generation floor to the
 * generation about to be taken, durably, before it answers "absent"; a late
 * hold of the lapsed actor's generation is refused afterwards, whichever
 * arrives first (src/agent/store/holds.ts `observe`). A hold that landed
 * before the observation is seen and recovered instead.
 */
import { assertNever } from "./errors.js";

export interface ActorRecord {
  allocationId: string;
  generation: number;
  actor: string;
  kind: "actor" | "tombstone";
}

/**
 * An actor's standing from its lease: the acting coordinator renews the
 * record's time (compare-and-set on the exact record) before every agent
 * call and never starts one after `recordedAt + leaseMs`; past that instant
 * (at equality) it is terminal. A late call of an actor that outlived its
 * lease is fenced on the agent: a hold below the floor a replacement's
 * observation raised, below the highest generation held, or after release,
 * is refused there — in whichever order the calls arrive.
 */
export function actorLiveness(recordedAt: number, now: number, leaseMs: number): "running" | "terminal" {
  return now < recordedAt + leaseMs ? "running" : "terminal";
}

export type ActorStanding =
  | { kind: "none" }
  | { kind: "recorded"; record: ActorRecord; liveness: "running" | "terminal" | "unreadable" };

export type HoldObservation =
  | { kind: "absent" }
  | { kind: "present"; allocationId: string; generation: number }
  | { kind: "unreadable"; why: string };

export type Desire = "wanted" | "retired";

export type TakeoverDecision =
  | { kind: "recover"; generation: number }
  | { kind: "cas_new_actor"; expected: ActorRecord | null; next: { generation: number } }
  | { kind: "tombstone"; expected: ActorRecord | null; next: { generation: number } }
  | { kind: "retain"; why: string }
  /** A hold of this allocation that no actor owns (another generation, or after the tombstone): fence and clean it. */
  | { kind: "stale_hold"; generation: number; why: string }
  /** The record is already a tombstone: the launch was cancelled for good; nothing to do. */
  | { kind: "settled" };

/**
 * The generation floor the observation must raise on the agent before it
 * answers: the one a `cas_new_actor` or `tombstone` would take, when the
 * prior actor is terminal or absent; null (a plain read) while the prior
 * actor may still act, or the record is a tombstone.
 */
export function fenceFloor(prior: ActorStanding): number | null {
  if (prior.kind === "none") return 1;
  if (prior.record.kind === "tombstone" || prior.liveness !== "terminal") return null;
  return prior.record.generation + 1;
}

export function takeoverDecision(allocationId: string, prior: ActorStanding, hold: HoldObservation, desire: Desire): TakeoverDecision {
  if (hold.kind === "unreadable") return { kind: "retain", why: `hold unreadable: ${hold.why}` };
  if (prior.kind === "recorded" && prior.liveness === "unreadable") return { kind: "retain", why: "prior actor's standing unreadable" };
  const recorded = prior.kind === "recorded" ? prior.record : null;
  if (recorded?.kind === "tombstone") {
    // A tombstone is final; a hold seen after it would be a defect to surface, not adopt.
    if (hold.kind === "absent") return { kind: "settled" };
    if (hold.allocationId !== allocationId) return { kind: "retain", why: `a hold for ${hold.allocationId} generation ${hold.generation} occupies the slot` };
    return { kind: "stale_hold", generation: hold.generation, why: `hold of generation ${hold.generation} present after the launch was tombstoned` };
  }
  switch (hold.kind) {
    case "present":
      if (hold.allocationId !== allocationId) return { kind: "retain", why: `a hold for ${hold.allocationId} generation ${hold.generation} occupies the slot` };
      if (recorded && hold.generation === recorded.generation) return { kind: "recover", generation: recorded.generation };
      return { kind: "stale_hold", generation: hold.generation, why: `hold of generation ${hold.generation} while the actor record is ${recorded ? `generation ${recorded.generation}` : "absent"}` };
    case "absent": {
      if (prior.kind === "recorded" && prior.liveness === "running") return { kind: "retain", why: "prior actor still running" };
      const next = { generation: (recorded?.generation ?? 0) + 1 };
      switch (desire) {
        case "wanted":
          return { kind: "cas_new_actor", expected: recorded, next };
        case "retired":
          return { kind: "tombstone", expected: recorded, next };
        default:
          return assertNever(desire, "desire");
      }
    }
    default:
      return assertNever(hold, "hold observation");
  }
}
