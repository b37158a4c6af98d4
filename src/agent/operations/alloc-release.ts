/**
 * alloc_release: the allocation leaves this host for good. The sandbox goes
 * first (`destroy` as a step: keys dropped, sessions cut, every process
 * proven gone, or no answer); only with nothing left that could use it is
 * the volume released (kept, or wiped in order); then the hold is marked
 * `released` with the result, in one transaction — also when no hold was
 * ever taken, so a launch actor that outlived its lease can never take one
 * after.
 *
 * With `resolve` (an operator ending the allocation's quarantine: `berth
 * alloc resolve`) a sandbox that does not match its record — e.g. one whose
 * runsc sandbox died, found not running at the agent's start — is marked
 * resolved by the operator first (durably, the earlier reason kept), so the
 * destroy step acts on it: the runtime removes only what is provably this
 * machine's (its container ids, or processes carrying its marker) and the
 * step still answers only once nothing of it is left.
 */
import type { AllocReleaseResult } from "../../protocol/operations.js";
import type { ArgsOf, OpCall } from "./context.js";
import { OPERATOR_RESOLVED } from "./preconditions.js";

export async function allocRelease(op: OpCall, a: ArgsOf<"alloc_release">): Promise<void> {
  const { store, volumes } = op.deps;
  const h = store.holds.get(a.allocationId);
  const m = store.machines.get(op.machineId);
  const generation = Math.max(op.generation, h?.generation ?? 0, m?.generation ?? 0);
  if (a.resolve === true && m?.state === "mismatch" && !m.mismatch?.startsWith(OPERATOR_RESOLVED)) {
    const why = `${OPERATOR_RESOLVED}operation ${op.opId} (was: ${m.mismatch ?? "unknown"})`.slice(0, 4000);
    store.machines.put({ ...m, mismatch: why, updatedAt: op.deps.now() });
    op.deps.log.warn({ machineId: op.machineId, opId: op.opId, was: m.mismatch }, "an operator resolved a machine that does not match its record: it is destroyed");
  }
  const destroyed = await op.step("d", "destroy", generation);
  // The first release to end decides the volume: one that arrives after the hold was released (a cleanup's
  // call delayed in flight past an operator's resolve, under another operation id) leaves it as that one
  // did — the coordinator may already have reported it kept (model/allocation.pml MUTANT_LATE_WIPE).
  const volume = volumes.release(a.allocationId, a.keepVolume || h?.state === "released");
  const result: AllocReleaseResult = { allocationId: a.allocationId, sessionsClosed: destroyed.sessionsClosed, processesRemaining: 0, volume, holdReleased: true };
  store.transaction(() => {
    const now = op.deps.now();
    store.holds.put({
      allocationId: a.allocationId, machineId: op.machineId, generation, state: "released",
      vcpu: h?.vcpu ?? 0, memoryMib: h?.memoryMib ?? 0, takenAt: h?.takenAt ?? now, releasedAt: now,
    });
    op.finish(result);
  });
}
