/**
 * destroy: the machine is gone for good. Access goes first, durably (no key
 * authenticates from then on, the record says `destroying`), then sessions,
 * then the runtime's machine, proven absent with no process left, then its
 * network, in order. A machine never created here (or already gone) is
 * recorded `destroyed` too, so a delayed provision of its id can never bring
 * it back.
 */
import type { DestroyResult } from "../../protocol/operations.js";
import type { MachineRecord } from "../store/machines.js";
import { commit, machineOf, networkOf, sweepSessions, type OpCall } from "./context.js";

export async function destroy(op: OpCall): Promise<void> {
  const { deps } = op;
  const { runtime, sessions, store, keys } = deps;
  const now = deps.now();
  const m = store.machines.get(op.machineId);
  if (m === null || m.state === "destroyed") {
    await networkOf(deps, op.machineId)?.tearDown(op.machineId);
    const result: DestroyResult = { existed: false, incarnationBefore: m?.incarnation ?? null, sessionsClosed: 0, keysRemoved: 0, processesRemaining: 0 };
    const rec: MachineRecord = m ?? {
      id: op.machineId, generation: op.generation, state: "destroyed", incarnation: null, workspace: null,
      identity: null, mismatch: null, createdAt: now, updatedAt: now,
    };
    store.transaction(commit(op, { ...rec, state: "destroyed" }, result));
    return;
  }
  const dropped = keys.drop(op.machineId, () => {
    store.machines.put({ ...m, state: "destroying", generation: Math.max(m.generation, op.generation), updatedAt: now });
  });
  const sessionsClosed = await sessions.closeMachine(op.machineId, `destroy (operation ${op.opId})`);
  await runtime.destroy(op.machineId);
  const seen = await runtime.inspect(op.machineId);
  if (seen.exists || seen.liveProcesses > 0) {
    throw new Error(`machine ${op.machineId} still exists after destroy (${seen.liveProcesses} processes)`);
  }
  await networkOf(deps, op.machineId)?.tearDown(op.machineId);
  // A retry after a crash finds the keys already dropped; report the total once known.
  const result: DestroyResult = { existed: true, incarnationBefore: m.incarnation, sessionsClosed, keysRemoved: dropped.length, processesRemaining: 0 };
  store.transaction(commit(op, { ...machineOf(deps, op.machineId), state: "destroyed" }, result));
  sweepSessions(deps);
}
