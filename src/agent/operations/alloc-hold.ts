/**
 * alloc_hold: the allocation's slot on this host is held for exactly the
 * launch actor of this generation. The hold and the operation's result (its
 * row too: the dispatcher writes it with the result) commit in ONE
 * transaction: nothing acts outside it. The same generation again answers
 * the same hold (`existed`); another generation while one is held, one below
 * the highest seen or below the floor a replacement's observation raised
 * (`fenced`), and any hold after release are refused by the preconditions
 * (`holdRefusal`, checked again in the transaction that writes the hold), so
 * two actors that both believe they act can never hold twice, whatever order
 * their calls arrive in.
 */
import { BerthError, assertNever } from "../../core/errors.js";
import type { AllocHoldResult } from "../../protocol/operations.js";
import type { HoldRecord } from "../store/holds.js";
import type { ArgsOf, OpCall } from "./context.js";

export async function allocHold(op: OpCall, a: ArgsOf<"alloc_hold">): Promise<void> {
  const { store } = op.deps;
  store.transaction(() => {
    const h = store.holds.get(a.allocationId);
    // Checked again where it is written (the dispatcher checked before): a floor raised meanwhile refuses it.
    const refusal = holdRefusal(a.allocationId, h, op.generation);
    if (refusal) throw refusal;
    const existed = h?.state === "held";
    const now = op.deps.now();
    if (!existed) {
      store.holds.put({ allocationId: a.allocationId, machineId: op.machineId, generation: op.generation, state: "held", vcpu: a.vcpu, memoryMib: a.memoryMib, takenAt: now, releasedAt: null });
    }
    const result: AllocHoldResult = { allocationId: a.allocationId, generation: op.generation, existed };
    op.finish(result);
  });
}

/** Why a hold of `generation` may not be taken now (null: it may, or it already is). */
export function holdRefusal(allocationId: string, h: HoldRecord | null, generation: number): BerthError | null {
  if (h === null) return null;
  switch (h.state) {
    case "released":
      return new BerthError("conflict", `conflict: allocation ${allocationId} was released on this host; its slot is never held again`);
    case "fenced":
      if (generation >= h.generation) return null;
      return new BerthError(
        "generation_mismatch",
        `generation_mismatch: allocation ${allocationId}'s launch was taken over at generation ${h.generation}; a hold of generation ${generation} is stale and is never taken; nothing was changed`,
      );
    case "held":
      if (h.generation === generation) return null;
      if (generation < h.generation) return new BerthError("generation_mismatch", `generation_mismatch: allocation ${allocationId}'s slot is held by generation ${h.generation}; generation ${generation} is stale; nothing was changed`);
      return new BerthError("conflict", `conflict: allocation ${allocationId}'s slot is already held by generation ${h.generation}; a second hold is never taken`);
    default:
      return assertNever(h.state, "hold state");
  }
}
