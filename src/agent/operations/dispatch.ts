/**
 * The agent's operations, one file each beside this one (the contract,
 * shared with the coordinator, is src/protocol/operations.ts): machine kinds
 * provision, install_key, remove_key, fence, scrub, destroy; allocation kinds
 * alloc_hold, alloc_launch, alloc_release. This dispatcher owns what they
 * share: idempotency, preconditions, records and replies.
 *
 * Protocol, per request `{opId, kind, machineId, generation, args}` (the
 * envelope already checked by the protocol's schema):
 *   1. The arguments are validated and hashed; an allocation operation's
 *      machine must be its allocation's sandbox.
 *   2. A known opId with a different kind, machine, generation or arguments
 *      is refused (`conflict`). A known opId that is `done` returns its first
 *      result, byte for byte, and acts on nothing.
 *   3. Preconditions (preconditions.ts) are checked; a refusal changes
 *      nothing and is not recorded, so a retry is refused the same way.
 *   4. The operation row is written `started` BEFORE anything acts (for
 *      provision, together with the machine's `creating` record), so a crash
 *      leaves a durable trace that recovery reads as "mid-operation". An
 *      operation that is one local transaction (install_key, alloc_hold)
 *      writes its row in that transaction instead: a crash before the commit
 *      leaves nothing done and nothing recorded. One durable write, not two.
 *   5. The operation acts (runtime calls outside any transaction) and commits
 *      its change and its result in ONE transaction (`OpCall.finish`); only
 *      then is the reply sent, read back from the record: a lost reply is
 *      answered again by the coordinator's retry, never by acting twice.
 *   A failure marks the row `failed`; a retry with the same opId runs it
 *   again (every runtime method is idempotent on the machine id), since no
 *   result was ever given out.
 *
 * Operations on one machine run one at a time, and so do the operations of
 * one allocation (their steps, a provision, install_key or destroy of the
 * sandbox under a derived id, then take the machine's turn).
 *
 * Generations: the agent keeps each machine's current generation. An
 * operation below it is refused; one above it advances it, removing every
 * grant key of an older generation (keeper keys, the keeper pool's long-lived
 * access, stay until removed). For allocation kinds the generation is the
 * launch actor's, fenced by the hold (alloc-hold.ts).
 */
import { allocationMachineId } from "../../core/allocation-access.js";
import { BerthError, assertNever } from "../../core/errors.js";
import { parseId } from "../../core/ids.js";
import {
  hashNormalizedArgs,
  normalizeArgs,
  parseOperationResult,
  type NormalizedArgs,
  type OperationKind,
  type OperationRequest,
  type OperationResponse,
  type OperationResult,
  type OperationResults,
} from "../../protocol/operations.js";
import { KeyedLock } from "../keyed-lock.js";
import { errorMessage } from "../log.js";
import type { OpIntent, OpRecord } from "../store/operations.js";
import { allocHold } from "./alloc-hold.js";
import { allocLaunch } from "./alloc-launch.js";
import { allocRelease } from "./alloc-release.js";
import type { OpCall, OperationDeps } from "./context.js";
import { destroy } from "./destroy.js";
import { fence } from "./fence.js";
import { installKey } from "./install-key.js";
import { checkPreconditions } from "./preconditions.js";
import { creatingRecord, provision } from "./provision.js";
import { removeKey } from "./remove-key.js";
import { scrub } from "./scrub.js";

export type { OperationDeps } from "./context.js";

/** The operations whose row is written in the transaction of their result (they are one local transaction). */
const RECORDED_WITH_RESULT: ReadonlySet<OperationKind> = new Set(["install_key", "alloc_hold"]);

export class AgentOperations {
  /** One operation at a time per machine, and per allocation. */
  readonly #lock = new KeyedLock();
  /** Launches under way (also those waiting for their allocation's turn): a withdrawal waits for them (standing.ts). */
  readonly #launches = new Set<Promise<unknown>>();

  constructor(private readonly deps: OperationDeps) {}

  /** Runs (or answers again) one operation. Refusals and failures throw BerthError. */
  async run(req: OperationRequest): Promise<OperationResponse> {
    const args = normalizeArgs(req.kind, req.args);
    const intent: OpIntent = { opId: req.opId, kind: args.kind, machineId: req.machineId, generation: req.generation, argsHash: hashNormalizedArgs(args) };
    if ("allocationId" in args) {
      const sandbox = allocationMachineId(args.allocationId);
      if (sandbox !== req.machineId) {
        throw new BerthError("invalid_request", `invalid_request: machineId ${req.machineId} is not the sandbox of allocation ${args.allocationId} (${sandbox})`);
      }
      const p = this.#lock.run(`allocation:${args.allocationId}`, () => this.#execute(intent, args));
      if (args.kind === "alloc_launch") {
        this.#launches.add(p);
        void p.catch(() => undefined).finally(() => this.#launches.delete(p));
      }
      return p;
    }
    return this.#lock.run(`machine:${req.machineId}`, () => this.#execute(intent, args));
  }

  /** Resolves once every launch under way now (and any that starts meanwhile) has ended. */
  async launchesSettled(): Promise<void> {
    while (this.#launches.size > 0) await Promise.allSettled([...this.#launches]);
  }

  /** A step of an operation, as an operation of its own (derived id, the machine's turn). */
  async #step<K extends OperationKind>(parent: string, suffix: string, kind: K, machineId: string, generation: number, raw: unknown): Promise<OperationResults[K]> {
    const opId = parseId(`${parent}-${suffix}`, "step operation id");
    const args = normalizeArgs(kind, raw);
    const intent: OpIntent = { opId, kind, machineId, generation, argsHash: hashNormalizedArgs(args) };
    const done = await this.#lock.run(`machine:${machineId}`, () => this.#execute(intent, args));
    const result = parseOperationResult(kind, done.result);
    if (result === null) throw new Error(`the result of step ${opId} (${kind}) does not match the operation contract`);
    return result;
  }

  async #execute(intent: OpIntent, args: NormalizedArgs): Promise<OperationResponse> {
    const { store } = this.deps;
    const { opId, kind, machineId, generation } = intent;
    const existing = store.operations.get(opId);
    if (existing !== null) {
      if (existing.kind !== kind || existing.machineId !== machineId || existing.generation !== generation || existing.argsHash !== intent.argsHash) {
        throw new BerthError(
          "conflict",
          `conflict: operation ${opId} was already used for ${existing.kind} of machine ${existing.machineId} at generation ${existing.generation} with other arguments; use a new operation id`,
        );
      }
      if (existing.status === "done") return reply(existing);
    }
    checkPreconditions(store, intent, args);
    const withResult = existing === null && RECORDED_WITH_RESULT.has(kind);
    try {
      if (existing !== null) store.operations.markStarted(opId);
      else if (!withResult) this.#begin(intent);
      await act(this.#call(intent, withResult), args);
      const done = store.operations.get(opId);
      if (done === null || done.status !== "done") throw new Error(`operation ${opId} finished without its result recorded`);
      this.deps.log.info({ opId, kind, machineId, generation }, "operation done");
      return reply(done);
    } catch (e) {
      throw this.#failed(intent, args, e);
    }
  }

  /** The row, `started`, before anything acts; a provision's machine record `creating` with it. */
  #begin(intent: OpIntent): void {
    const { store, now } = this.deps;
    store.transaction(() => {
      store.operations.insert({ ...intent, now: now() });
      if (intent.kind === "provision" && store.machines.get(intent.machineId) === null) {
        store.machines.put(creatingRecord(intent.machineId, intent.generation, now()));
      }
    });
  }

  #call(intent: OpIntent, withResult: boolean): OpCall {
    const { store, now } = this.deps;
    return {
      deps: this.deps,
      opId: intent.opId,
      machineId: intent.machineId,
      generation: intent.generation,
      finish: (result: OperationResult) => {
        const at = now();
        if (withResult) store.operations.insert({ ...intent, now: at });
        store.operations.finish(intent.opId, result, at);
      },
      step: (suffix, kind, generation, args) => this.#step(intent.opId, suffix, kind, intent.machineId, generation, args),
    };
  }

  /** Records a failure (the row, if any, `failed`) and says what a caller reads. */
  #failed(intent: OpIntent, args: NormalizedArgs, e: unknown): BerthError {
    const { opId, kind, machineId, generation } = intent;
    if (isPrimaryKeyConflict(e)) return new BerthError("conflict", `conflict: operation ${opId} is already in use; use a new operation id`);
    const msg = errorMessage(e);
    try {
      this.deps.store.operations.fail(opId, msg, this.deps.now());
    } catch (e2) {
      this.deps.log.error({ opId, error: errorMessage(e2) }, "could not record an operation failure");
    }
    this.deps.log.warn({ opId, kind, machineId, generation, error: msg }, "operation failed");
    if (e instanceof BerthError) return e;
    const subject = "allocationId" in args ? `allocation ${args.allocationId}` : `machine ${machineId}`;
    return new BerthError("operation_failed", `operation_failed: ${kind} of ${subject} (operation ${opId}) failed: ${msg}; retry with the same operation id`);
  }
}

function act(op: OpCall, args: NormalizedArgs): Promise<void> {
  switch (args.kind) {
    case "provision":
      return provision(op, args);
    case "install_key":
      return installKey(op, args);
    case "remove_key":
      return removeKey(op, args);
    case "fence":
      return fence(op);
    case "scrub":
      return scrub(op);
    case "destroy":
      return destroy(op);
    case "alloc_hold":
      return allocHold(op, args);
    case "alloc_launch":
      return allocLaunch(op, args);
    case "alloc_release":
      return allocRelease(op, args);
    default:
      return assertNever(args, "operation");
  }
}

/** The reply to a done operation, read from its record through the contract. */
function reply(op: OpRecord): OperationResponse {
  const result = parseOperationResult(op.kind, op.result);
  if (result === null) throw new Error(`the recorded result of operation ${op.opId} (${op.kind}) does not match the operation contract`);
  return { opId: op.opId, kind: op.kind, machineId: op.machineId, generation: op.generation, status: "done", result };
}

function isPrimaryKeyConflict(e: unknown): boolean {
  return typeof e === "object" && e !== null && "code" in e && e.code === "SQLITE_CONSTRAINT_PRIMARYKEY";
}
