/**
 * alloc_release: the allocation leaves this host for good. The sandbox goes
 * first (`destroy` as a step: keys dropped, sessions cut, every process
 * proven gone, or no answer); only with nothing left that could use it is
 * the volume released (kept, or wiped in order); then the hold is marked
 * `released` with the result, in one transaction — also when no hold was
 * ever taken, so a launch actor that outlived its lease can never take one
 * after.
 */
import type { AllocReleaseResult } from "../../protocol/operations.js";
import type { ArgsOf, OpCall } from "./context.js";

export async function allocRelease(op: OpCall, a: ArgsOf<"alloc_release">): Promise<void> {
  const { store, volumes } = op.deps;
  const h = store.holds.get(a.allocationId);
  const m = store.machines.get(op.machineId);
  const generation = Math.max(op.generation, h?.generation ?? 0, m?.generation ?? 0);
  const destroyed = await op.step("d", "destroy", generation);
  const volume = volumes.release(a.allocationId, a.keepVolume);
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
