/**
 * What every agent operation is given (the dispatcher, dispatch.ts, builds
 * it): the agent's capabilities as one typed object, the operation's
 * envelope, how to record its result, and how to run a step of it as an
 * operation of its own. Beside them, the small helpers several operations
 * share.
 */
import { BerthError } from "../../core/errors.js";
import type { NormalizedArgs, OperationKind, OperationResult, OperationResults } from "../../protocol/operations.js";
import type { SessionRegistry } from "../contracts.js";
import type { AgentKeys } from "../keys.js";
import { errorMessage, type AgentLog } from "../log.js";
import type { MachineNetworks } from "../network/manager.js";
import type { RulesVerdict } from "../network/live-rules.js";
import type { LendCheck } from "../network/guard.js";
import type { Runtime } from "../runtime/types.js";
import type { MachineRecord } from "../store/machines.js";
import type { AgentStore } from "../store/store.js";
import type { Volumes } from "../volumes.js";
import type { ImageCache } from "../images/cache.js";

export interface OperationDeps {
  /** The durable records: machines, keys, operations, holds, volumes. */
  store: AgentStore;
  /** The key authority the SSH gateway consults. */
  keys: AgentKeys;
  /** The sandbox runtime that creates, fences, scrubs and destroys machines. */
  runtime: Runtime;
  /** The gateway's sessions: cut them, count them. */
  sessions: SessionRegistry;
  /** Machine networks (network policy `egress`), or why this host cannot enforce one. */
  network: MachineNetworks | { unavailable: string };
  /** The lend-time check of a machine's network (network/guard.ts); absent: no machine networks here. */
  lendCheck?: (machineId: string) => Promise<LendCheck>;
  /** Retires a machine whose network rules are not the recorded ones (network/guard.ts). */
  retire?: (machineId: string, v: Extract<RulesVerdict, { ok: false }>) => void;
  /** Allocation workspace volumes (intent, identity, release). */
  volumes: Volumes;
  /** The image cache that pulls and unpacks the images machines boot (images/cache.ts); null: this runtime boots none. */
  images: ImageCache | null;
  /** Where a machine's workspace path is (the runtime's machine directory layout). */
  workspacePath: (machineId: string) => string;
  /** What the runtime enforces of an allocation's size, for the launch result. */
  enforcement: (vcpu: number, memoryMib: number) => string;
  /** The clock (epoch ms). */
  now: () => number;
  log: AgentLog;
}

/** An operation's arguments as it acts on them (validated, ids checked, keys parsed). */
export type ArgsOf<K extends OperationKind> = Extract<NormalizedArgs, { kind: K }>;

/** One operation under way. */
export interface OpCall {
  readonly deps: OperationDeps;
  readonly opId: string;
  readonly machineId: string;
  readonly generation: number;
  /**
   * Records the result. Called inside the transaction that makes the
   * operation's change: the change and the result commit together, and the
   * reply is read back from the record (a retry gets the same bytes).
   */
  finish(result: OperationResult): void;
  /**
   * Runs a step of this operation as an operation of its own, under the id
   * `<opId>-<suffix>`: a retry after a crash or a lost reply resumes the
   * step from its record instead of acting twice.
   */
  step<K extends OperationKind>(suffix: string, kind: K, generation: number, args?: unknown): Promise<OperationResults[K]>;
}

/** The machine's record, which the preconditions proved exists. */
export function machineOf(deps: OperationDeps, id: string): MachineRecord {
  const m = deps.store.machines.get(id);
  if (m === null) throw new Error(`machine ${id} has no record`);
  return m;
}

/** A transaction body: `m` (its generation advanced to the operation's) and the result, together. */
export function commit(op: OpCall, m: MachineRecord, result: OperationResult): () => void {
  return () => {
    op.deps.store.machines.put({ ...m, generation: Math.max(m.generation, op.generation), updatedAt: op.deps.now() });
    op.finish(result);
  };
}

/** The machine networks, or a refusal naming why this host cannot enforce a policy. */
export function networks(deps: OperationDeps): MachineNetworks {
  const n = deps.network;
  if ("unavailable" in n) throw new BerthError("provider_unavailable", `provider_unavailable: this host cannot enforce a network policy: ${n.unavailable}`);
  return n;
}

/** The machine's network, when it has one (a record exists). */
export function networkOf(deps: OperationDeps, machineId: string): MachineNetworks | null {
  const n = deps.network;
  if ("unavailable" in n) return null;
  return n.get(machineId) ? n : null;
}

/** Machines left unattached by recovery (mid-operation) become usable once an operation on them completes. */
export function attachIfNeeded(deps: OperationDeps, machineId: string): void {
  if (deps.keys.generationOf(machineId) !== undefined) return;
  const m = machineOf(deps, machineId);
  if (m.state === "running") deps.keys.attach(machineId, m.generation);
}

/** After a fence or destroy every process of the machine is gone: retained session records can be cleaned (in the background; a failure only leaves them for the next sweep). */
export function sweepSessions(deps: OperationDeps): void {
  const sweep = deps.sessions.sweep;
  if (!sweep) return;
  sweep.call(deps.sessions).catch((e: unknown) => deps.log.warn({ error: errorMessage(e) }, "session record sweep failed; retried after the next fence"));
}
