/**
 * fence: no session and no process of the machine's earlier incarnation
 * remains. Sessions are closed, the runtime restarts the machine's processes
 * (a new incarnation) and proves none of the old ones is left, or the fence
 * fails. Only a fence does this; a key removal never does.
 */
import type { FenceResult } from "../../protocol/operations.js";
import type { MachineRecord } from "../store/machines.js";
import { attachIfNeeded, commit, machineOf, sweepSessions, type OpCall } from "./context.js";

export async function fence(op: OpCall): Promise<void> {
  const { deps } = op;
  const { runtime, sessions, store, keys } = deps;
  const m = machineOf(deps, op.machineId);
  if (op.generation > m.generation) keys.advance(op.machineId, op.generation);
  const sessionsClosed = await sessions.closeMachine(op.machineId, `fence (operation ${op.opId})`);
  // The fence proves absence itself or throws (FenceProof.remaining); what is
  // left to check is that the machine is there, at the incarnation it reports.
  const proof = await runtime.fence(op.machineId);
  if ((await runtime.incarnation(op.machineId)) !== proof.incarnation) {
    throw new Error(`the runtime no longer has machine ${op.machineId} at incarnation ${proof.incarnation} after the fence`);
  }
  if (m.incarnation !== null && proof.incarnation === m.incarnation) {
    throw new Error(`the fence of machine ${op.machineId} did not change its incarnation (${proof.incarnation})`);
  }
  const result: FenceResult = {
    incarnationBefore: m.incarnation,
    incarnationAfter: proof.incarnation,
    sessionsClosed,
    processesRemaining: proof.remaining,
    evidence: proof.evidence,
  };
  const after: MachineRecord = { ...machineOf(deps, op.machineId), incarnation: proof.incarnation, mismatch: null };
  store.transaction(commit(op, after, result));
  attachIfNeeded(deps, op.machineId);
  sweepSessions(deps);
}
