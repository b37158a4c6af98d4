/**
 * remove_key: a key (by grant, by fingerprint, or both) no longer lets
 * anyone in. Durable first (the key deleted, its removal remembered so a
 * delayed install at this generation is refused); the key authority's
 * listeners (the gateway) cut the sessions admitted with the key as it
 * leaves the index. A removal is never a fence: processes keep running.
 */
import type { RemoveKeyResult } from "../../protocol/operations.js";
import { attachIfNeeded, commit, machineOf, type ArgsOf, type OpCall } from "./context.js";

export async function removeKey(op: OpCall, args: ArgsOf<"remove_key">): Promise<void> {
  const { deps } = op;
  const { keys, sessions, store } = deps;
  attachIfNeeded(deps, op.machineId);
  const m = machineOf(deps, op.machineId);
  const current = keys.generationOf(op.machineId) ?? m.generation;
  if (op.generation > current) keys.advance(op.machineId, op.generation);
  const removed = keys.remove(op.machineId, args.which, op.generation);
  // With no key left, every open session of the machine was admitted with a
  // key that is gone: close them all and count them. With other keys left,
  // the revocation listeners cut only this key's sessions.
  const left = keys.list(op.machineId).length;
  const sessionsClosed = left === 0 ? await sessions.closeMachine(op.machineId, `key removed (operation ${op.opId})`) : 0;
  const result: RemoveKeyResult = {
    removed: removed.map((k) => ({ fingerprint: k.fingerprint, grantId: k.grantId })),
    keysRemaining: left,
    sessionsClosed,
    sessionsRemaining: sessions.count(op.machineId),
  };
  store.transaction(commit(op, machineOf(deps, op.machineId), result));
}
