/**
 * alloc_launch: the allocation's sandbox runs on its workspace volume and
 * lets the allocation's key in until its expiry. It needs the hold of
 * exactly its generation (a precondition). The workspace volume is made
 * (intent, then identity: volumes.ts) and linked as the sandbox's workspace;
 * the sandbox is started (`provision`) and the key installed as a grant key
 * (`install_key`), each a step under a derived operation id, so a retry
 * after a crash or a lost reply resumes instead of acting twice.
 */
import type { AllocLaunchResult } from "../../protocol/operations.js";
import type { ArgsOf, OpCall } from "./context.js";

export async function allocLaunch(op: OpCall, a: ArgsOf<"alloc_launch">): Promise<void> {
  const { deps } = op;
  const vol = deps.volumes.ensure(a.allocationId);
  deps.volumes.link(deps.workspacePath(op.machineId), vol);
  const prov = await op.step("p", "provision", op.generation);
  await op.step("k", "install_key", op.generation, { publicKey: a.publicKey, mode: "grant", grantId: a.allocationId, expiresAt: a.expiresAt });
  const hold = deps.store.holds.get(a.allocationId);
  if (hold === null) throw new Error(`allocation ${a.allocationId} lost its hold during its launch`);
  const result: AllocLaunchResult = {
    allocationId: a.allocationId,
    machineId: op.machineId,
    incarnation: prov.incarnation,
    runtime: prov.runtime,
    fingerprint: a.fingerprint,
    volume: { path: vol.path, dev: vol.dev ?? "", ino: vol.ino ?? "" },
    enforcement: deps.enforcement(hold.vcpu, hold.memoryMib),
  };
  deps.store.transaction(() => op.finish(result));
}
