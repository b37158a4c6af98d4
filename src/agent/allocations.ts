/**
 * Allocation operations on the agent: alloc_hold, alloc_launch, alloc_release
 * (contract: src/protocol/operations.ts). The envelope's `machineId` names
 * the allocation's sandbox (core/allocation-access.ts) and `generation` the
 * coordinator's launch actor.
 *
 *   alloc_hold    takes the allocation's slot hold for exactly that actor
 *                 generation, in ONE transaction with the operation's result:
 *                 the same generation again answers the same hold (idempotent);
 *                 another generation while one is held, a generation below the
 *                 highest seen, or any hold after release is refused. So two
 *                 actors that both believe they act can never hold twice.
 *   alloc_launch  needs the hold of exactly its generation: makes the workspace
 *                 volume (intent → identity, volumes.ts), links it as the
 *                 sandbox's workspace, starts the sandbox (`provision`) and
 *                 installs the allocation's public key as a grant key until
 *                 the allocation's expiry (`install_key`), each through
 *                 AgentOps under a derived operation id, so a retry after a
 *                 crash or lost reply resumes instead of acting twice.
 *   alloc_release destroys the sandbox (`destroy`: keys dropped first, sessions
 *                 cut, every process proven gone), then releases the volume
 *                 (kept, or wiped in order), then marks the hold `released`
 *                 for good — also when no hold was ever taken, so a launch
 *                 actor that outlived its lease can never take one after.
 *
 * Operation records follow ops.ts: a known opId with other arguments is
 * refused, a done one answers its first result, the row is `started` before
 * anything acts. Operations of one allocation run one at a time.
 */
import { BerthError, assertNever } from "../core/errors.js";
import { parseId, type Id } from "../core/ids.js";
import { allocationMachineId } from "../core/allocation-access.js";
import { hashNormalizedArgs, normalizeArgs, type AllocHoldResult, type AllocLaunchResult, type AllocOperationKind, type AllocReleaseResult, type DestroyResult, type NormalizedArgs, type OperationResult, type ProvisionResult } from "../protocol/operations.js";
import type { AllocStore, HoldRecord } from "./alloc-store.js";
import { KeyedLock } from "./keyed-lock.js";
import { errorMessage, type AgentLog } from "./log.js";
import type { AgentOps, AllocOpsRunner, OpRequest, OpResponse } from "./ops.js";
import type { CreateOptions, Runtime } from "./runtime/types.js";
import type { AgentStore, OpRecord } from "./store.js";
import type { Volumes } from "./volumes.js";

export interface AllocationOpsDeps {
  /** Operation records and machine records. */
  store: AgentStore;
  /** Holds and volume records. */
  allocs: AllocStore;
  volumes: Volumes;
  /** provision, install_key and destroy of the allocation's sandbox. */
  ops: AgentOps;
  /** Where the sandbox's workspace path is (the runtime's machine directory layout). */
  workspacePath: (machineId: string) => string;
  runtime: Runtime;
  /** What the runtime enforces of a size, for the launch result. */
  enforcement: (vcpu: number, memoryMib: number) => string;
  now: () => number;
  log: AgentLog;
}

type AllocArgs = Extract<NormalizedArgs, { kind: AllocOperationKind }>;

export class AllocationOps implements AllocOpsRunner {
  readonly #lock = new KeyedLock();
  constructor(private readonly d: AllocationOpsDeps) {}

  /** An allocation's sandbox is started with its hold's size (enforced where the runtime can: runtime/limits.ts). */
  createOptions(machineId: string): CreateOptions | undefined {
    const h = this.d.allocs.getHoldByMachine(machineId);
    return h ? { resources: { vcpu: h.vcpu, memoryMib: h.memoryMib } } : undefined;
  }

  async run(req: OpRequest & { kind: AllocOperationKind }): Promise<OpResponse> {
    const opId = parseId(req.opId, "opId");
    const machineId = parseId(req.machineId, "machineId");
    const args = normalizeArgs(req.kind, req.args) as AllocArgs;
    if (allocationMachineId(args.allocationId) !== machineId) {
      throw new BerthError("invalid_request", `invalid_request: machineId ${machineId} is not the sandbox of allocation ${args.allocationId} (${allocationMachineId(args.allocationId)})`);
    }
    const argsHash = hashNormalizedArgs(args);
    return this.#lock.run(args.allocationId, () => this.#execute(opId, machineId, req.generation, args, argsHash));
  }

  async #execute(opId: Id, machineId: Id, generation: number, args: AllocArgs, argsHash: string): Promise<OpResponse> {
    const { store } = this.d;
    const existing = store.getOp(opId);
    if (existing) {
      if (existing.kind !== args.kind || existing.machineId !== machineId || existing.generation !== generation || existing.argsHash !== argsHash) {
        throw new BerthError("conflict", `conflict: operation ${opId} was already used for ${existing.kind} of ${existing.machineId} at generation ${existing.generation} with other arguments; use a new operation id`);
      }
      if (existing.status === "done") return respond(existing);
    }
    if (args.kind === "alloc_hold") return this.#hold(opId, machineId, generation, args, existing !== null, argsHash);
    this.#checkLaunchable(args, generation);
    if (existing === null) store.insertOp({ opId, kind: args.kind, machineId, generation, argsHash, now: this.d.now() });
    else store.markOpStarted(opId);
    try {
      const result = args.kind === "alloc_launch" ? await this.#launch(opId, machineId, generation, args) : await this.#release(opId, machineId, generation, args);
      this.d.log.info({ opId, kind: args.kind, allocationId: args.allocationId, generation }, "allocation operation done");
      store.finishOp(opId, result, this.d.now());
      return respond(store.getOp(opId)!);
    } catch (e) {
      const msg = errorMessage(e);
      store.failOp(opId, msg, this.d.now());
      this.d.log.warn({ opId, kind: args.kind, allocationId: args.allocationId, error: msg }, "allocation operation failed");
      if (e instanceof BerthError) throw e;
      throw new BerthError("operation_failed", `operation_failed: ${args.kind} of allocation ${args.allocationId} (operation ${opId}) failed: ${msg}; retry with the same operation id`);
    }
  }

  /** The hold decision and its record, in one transaction: nothing acts outside it. */
  #hold(opId: Id, machineId: Id, generation: number, a: Extract<AllocArgs, { kind: "alloc_hold" }>, known: boolean, argsHash: string): OpResponse {
    const { store, allocs } = this.d;
    store.transaction(() => {
      const h = allocs.getHold(a.allocationId);
      const refusal = holdRefusal(a.allocationId, h, generation);
      if (refusal) throw refusal;
      const now = this.d.now();
      const existed = h?.state === "held";
      if (!existed) allocs.putHold({ allocationId: a.allocationId, machineId, generation, state: "held", vcpu: a.vcpu, memoryMib: a.memoryMib, takenAt: now, releasedAt: null });
      if (!known) store.insertOp({ opId, kind: a.kind, machineId, generation, argsHash, now });
      const result: AllocHoldResult = { allocationId: a.allocationId, generation, existed };
      store.finishOp(opId, result, now);
    });
    return respond(store.getOp(opId)!);
  }

  #checkLaunchable(a: AllocArgs, generation: number): void {
    if (a.kind !== "alloc_launch") return;
    const h = this.d.allocs.getHold(a.allocationId);
    if (!h || h.state !== "held") throw new BerthError("conflict", `conflict: allocation ${a.allocationId} holds no slot on this host${h ? " (released)" : ""}; take the hold first`);
    if (h.generation !== generation) throw new BerthError("generation_mismatch", `generation_mismatch: allocation ${a.allocationId}'s hold is generation ${h.generation}, not ${generation}; nothing was changed`);
  }

  async #launch(opId: Id, machineId: Id, generation: number, a: Extract<AllocArgs, { kind: "alloc_launch" }>): Promise<AllocLaunchResult> {
    const { volumes, ops, allocs } = this.d;
    const vol = volumes.ensure(a.allocationId);
    volumes.link(this.d.workspacePath(machineId), vol);
    const p = await ops.run({ opId: `${opId}-p`, kind: "provision", machineId, generation });
    const prov = p.result as ProvisionResult;
    await ops.run({ opId: `${opId}-k`, kind: "install_key", machineId, generation, args: { publicKey: a.publicKey, mode: "grant", grantId: a.allocationId, expiresAt: a.expiresAt } });
    const h = allocs.getHold(a.allocationId)!;
    return {
      allocationId: a.allocationId,
      machineId,
      incarnation: prov.incarnation,
      runtime: prov.runtime,
      fingerprint: a.fingerprint,
      volume: { path: vol.path, dev: vol.dev ?? "", ino: vol.ino ?? "" },
      enforcement: this.d.enforcement(h.vcpu, h.memoryMib),
    };
  }

  async #release(opId: Id, machineId: Id, generation: number, a: Extract<AllocArgs, { kind: "alloc_release" }>): Promise<AllocReleaseResult> {
    const { store, allocs, volumes, ops } = this.d;
    const h = allocs.getHold(a.allocationId);
    const m = store.getMachine(machineId);
    const g = Math.max(generation, h?.generation ?? 0, m?.generation ?? 0);
    // The sandbox first: keys, sessions, every process proven gone (destroy refuses to answer otherwise).
    const d = await ops.run({ opId: `${opId}-d`, kind: "destroy", machineId, generation: g });
    const destroyed = d.result as DestroyResult;
    // Only with nothing left that could use the volume is it released.
    const volume = volumes.release(a.allocationId, a.keepVolume);
    const now = this.d.now();
    allocs.putHold({ allocationId: a.allocationId, machineId, generation: g, state: "released", vcpu: h?.vcpu ?? 0, memoryMib: h?.memoryMib ?? 0, takenAt: h?.takenAt ?? now, releasedAt: now });
    return { allocationId: a.allocationId, sessionsClosed: destroyed.sessionsClosed, processesRemaining: 0, volume, holdReleased: true };
  }
}

/** Why a hold of `generation` may not be taken now (null: it may, or it already is). */
export function holdRefusal(allocationId: string, h: HoldRecord | null, generation: number): BerthError | null {
  if (h === null) return null;
  switch (h.state) {
    case "released":
      return new BerthError("conflict", `conflict: allocation ${allocationId} was released on this host; its slot is never held again`);
    case "held":
      if (h.generation === generation) return null;
      if (generation < h.generation) return new BerthError("generation_mismatch", `generation_mismatch: allocation ${allocationId}'s slot is held by generation ${h.generation}; generation ${generation} is stale; nothing was changed`);
      return new BerthError("conflict", `conflict: allocation ${allocationId}'s slot is already held by generation ${h.generation}; a second hold is never taken`);
    default:
      return assertNever(h.state, "hold state");
  }
}

function respond(op: OpRecord): OpResponse {
  return { opId: op.opId as Id, kind: op.kind as OpResponse["kind"], machineId: op.machineId as Id, generation: op.generation, status: "done", result: op.result as OperationResult };
}
