/**
 * alloc_launch: the allocation's sandbox runs on its workspace volume and
 * lets the allocation's key in until its expiry. It needs the hold of
 * exactly its generation (a precondition). The workspace volume is made
 * (intent, then identity: volumes.ts) — or, with `volume` (a kept volume
 * attached: `alloc create --volume`), that volume's record moves to this
 * allocation, refused when the record is absent, not kept, still held by
 * its allocation or damaged (volumes.ts `attach`) — and linked as the
 * sandbox's workspace; the sandbox is started (`provision`) and the key
 * installed as a grant key (`install_key`), each a step under a derived
 * operation id, so a retry after a crash or a lost reply resumes instead of
 * acting twice. A launch decided under a standing epoch older than the
 * host's withdrawal is refused before anything is made
 * (src/agent/standing.ts); a withdrawal waits for every launch under way
 * before it is acknowledged.
 */
import { launchRefusal, raiseStanding, readStanding } from "../standing.js";
import type { AllocLaunchResult } from "../../protocol/operations.js";
import type { ArgsOf, OpCall } from "./context.js";
import { diskView } from "../volumes.js";

export async function allocLaunch(op: OpCall, a: ArgsOf<"alloc_launch">): Promise<void> {
  const { deps } = op;
  // Checked again where nothing can come between it and the start (the preconditions checked before);
  // a launch decided under a newer epoch moves this host to it (the coordinator decided it under a ready standing).
  deps.store.transaction(() => {
    const refusal = launchRefusal(readStanding(deps.store.meta), a.allocationId, a.standingEpoch ?? 0);
    if (refusal) throw refusal;
    raiseStanding(deps.store.meta, { epoch: a.standingEpoch ?? 0, standing: "ready" });
  });
  const vol = a.volume
    ? deps.volumes.attach(a.allocationId, a.volume, (id) => deps.store.holds.get(id)?.state === "held", (fn) => deps.store.transaction(fn), a.diskMib ?? null)
    : deps.volumes.ensure(a.allocationId, a.diskMib ?? null);
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
    volume: { path: vol.path, dev: vol.dev ?? "", ino: vol.ino ?? "", ...(diskView(vol) ? { disk: diskView(vol)! } : {}) },
    enforcement: deps.enforcement(hold.vcpu, hold.memoryMib),
  };
  deps.store.transaction(() => op.finish(result));
}
