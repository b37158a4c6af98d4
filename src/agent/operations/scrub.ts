/**
 * scrub: the machine's workspace is as new, after a fence. gVisor's scrub may
 * restart the sandbox (a new incarnation): the record takes what the
 * runtime's own record says now, so the next start recognises the machine.
 * A machine with a network has its rules compared with the recorded ones
 * first: rules changed during the lend are the borrower's evidence — the
 * scrub fails with what changed (`network_tampered`; the coordinator
 * quarantines), the machine is retired and nothing is repaired. Otherwise
 * the rules are loaded again and probed from inside before it may be ready.
 */
import type { ReadinessEvidence } from "../../core/network-evidence.js";
import { BerthError } from "../../core/errors.js";
import type { ScrubResult } from "../../protocol/operations.js";
import { commit, machineOf, networkOf, type OpCall } from "./context.js";

export async function scrub(op: OpCall): Promise<void> {
  const { deps } = op;
  const { runtime, store, keys } = deps;
  const m = machineOf(deps, op.machineId);
  if (op.generation > m.generation) keys.advance(op.machineId, op.generation);
  await runtime.scrub(op.machineId);
  const incarnation = await runtime.incarnation(op.machineId);
  const seen = incarnation !== null ? { exists: true, incarnation } : await runtime.inspect(op.machineId);
  if (!seen.exists) throw new Error(`the runtime no longer has machine ${op.machineId} after the scrub`);
  const net = networkOf(deps, op.machineId);
  let evidence: ReadinessEvidence | null = null;
  if (net) {
    try {
      await net.reapply(op.machineId);
    } catch (e) {
      if (e instanceof BerthError && e.code === "network_tampered") {
        const v = await net.verify(op.machineId, { namespace: true });
        if (!v.ok) deps.retire?.(op.machineId, v);
      }
      throw e;
    }
    evidence = await net.probe(op.machineId, runtime, op.generation);
  }
  const result: ScrubResult = { incarnationBefore: m.incarnation, incarnation: seen.incarnation, scrubbed: true, ...(evidence ? { network: evidence } : {}) };
  store.transaction(commit(op, { ...machineOf(deps, op.machineId), incarnation: seen.incarnation }, result));
}
