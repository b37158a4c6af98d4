/**
 * Applying a takeover decision (core/allocation-takeover.ts) to the store:
 * `cas_new_actor` and `tombstone` replace the actor record only if it is
 * still exactly the one the decision was made on, so of two replacement
 * actors deciding on the same record, exactly one wins; the loser re-reads
 * and decides again. The other arms write nothing.
 */
import { assertNever } from "../../core/errors.js";
import type { TakeoverDecision } from "../../core/allocation-takeover.js";
import type { Tx } from "../../store/store.js";
import { casActor } from "../../store/allocation-actors.js";

export type TakeoverOutcome = { kind: "won"; generation: number } | { kind: "lost" } | { kind: "no_write" };

export async function applyTakeover(tx: Tx, allocationId: string, d: TakeoverDecision, me: string, now: number): Promise<TakeoverOutcome> {
  switch (d.kind) {
    case "cas_new_actor":
    case "tombstone": {
      const won = await casActor(tx, d.expected, { allocationId, generation: d.next.generation, actor: me, kind: d.kind === "tombstone" ? "tombstone" : "actor" }, now);
      return won ? { kind: "won", generation: d.next.generation } : { kind: "lost" };
    }
    case "recover":
    case "stale_hold":
    case "retain":
    case "settled":
      return { kind: "no_write" };
    default:
      return assertNever(d, "takeover decision");
  }
}
