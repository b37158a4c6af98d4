/**
 * provision: the machine exists and runs, at the operation's generation.
 *
 * The dispatcher writes the machine's `creating` record with the operation's
 * row, before anything acts (`creatingRecord`): after a crash, "no record"
 * means "never ours". Then the image, if the pool names one (pulled,
 * verified and unpacked once per digest by the image cache; a bad or
 * unreachable image fails the provision before anything of the machine
 * exists; the process runtime refuses every image). Then the network, if the policy asks for one (intent,
 * then exact identity, so no process of the machine ever runs outside its
 * namespace), the runtime's machine (idempotent on the id; an allocation's
 * sandbox is started with its hold's size), the readiness probe, and the
 * record `running` with the result in one transaction, the key authority
 * attached or advanced to the generation.
 */
import type { ReadinessEvidence } from "../../core/network-evidence.js";
import type { ProvisionResult } from "../../protocol/operations.js";
import type { MachineNetworks } from "../network/manager.js";
import type { CreateOptions } from "../runtime/types.js";
import { BerthError } from "../../core/errors.js";
import { processRefusesImages } from "../runtime/process.js";
import type { MachineRecord } from "../store/machines.js";
import { commit, machineOf, networks, type ArgsOf, type OpCall } from "./context.js";

/** The intent record of a machine not yet created. */
export function creatingRecord(machineId: string, generation: number, now: number): MachineRecord {
  return { id: machineId, generation, state: "creating", incarnation: null, workspace: null, identity: null, mismatch: null, createdAt: now, updatedAt: now };
}

export async function provision(op: OpCall, args: ArgsOf<"provision">): Promise<void> {
  const { deps } = op;
  const { runtime, store, keys } = deps;
  const before = machineOf(deps, op.machineId);
  const existed = before.state === "running";
  const hold = store.holds.heldByMachine(op.machineId);
  let createOpts: CreateOptions = hold ? { resources: { vcpu: hold.vcpu, memoryMib: hold.memoryMib } } : {};
  if (args.forwarding === "off") createOpts = { ...createOpts, forwarding: "off" };
  if (args.files === "workspace") createOpts = { ...createOpts, files: "workspace" };
  if (args.image !== undefined) {
    if (runtime.kind === "process") throw processRefusesImages(args.image);
    if (!deps.images) throw new BerthError("provider_unavailable", `provider_unavailable: this agent has no image cache; it cannot boot ${args.image}`);
    createOpts = { ...createOpts, image: await deps.images.ensure(args.image) };
  }
  let net: MachineNetworks | null = null;
  if (args.network !== undefined && args.network.mode === "egress") {
    net = networks(deps);
    const rec = await net.setUp(op.machineId, args.network);
    if (rec.netnsInode === null || rec.slot === null) throw new BerthError("internal", `internal: the network of machine ${op.machineId} was set up without its namespace inode or address slot`);
    createOpts = { ...createOpts, network: { netns: rec.netns, inode: rec.netnsInode, uid: net.machineUid(rec.slot), ...net.files(rec.netns) } };
  }
  const rm = await runtime.create(op.machineId, createOpts);
  const evidence: ReadinessEvidence | null = net ? await net.probe(op.machineId, runtime, op.generation) : null;
  const img = createOpts.image;
  const result: ProvisionResult = {
    incarnation: rm.incarnation, runtime: runtime.kind, existed,
    ...(evidence ? { network: evidence } : {}),
    ...(img ? { image: { ref: img.ref, id: img.id, digest: img.digest } } : {}),
  };
  const m: MachineRecord = { ...before, state: "running", incarnation: rm.incarnation, workspace: rm.workspace, identity: rm.identity, mismatch: null };
  const generation = Math.max(before.generation, op.generation);
  if (keys.generationOf(op.machineId) === undefined) {
    store.transaction(commit(op, m, result));
    keys.attach(op.machineId, generation);
  } else {
    keys.advance(op.machineId, generation, commit(op, m, result));
  }
}
