/**
 * The provider boundary. The coordinator's core owns authorization, borrow
 * and grant state, deadlines, capacity and durable cleanup intent; a provider
 * only carries out one durable operation at a time, outside any store
 * transaction, idempotently by operation id, and reports what it proved.
 *
 * A provider declares its capabilities. Portable pools need every portable
 * capability; a provider lacking one is refused for them (fail closed).
 */
import type { MachineRow } from "../store/machines.js";
import type { OpRowCall } from "../protocol/operations.js";

export interface ProviderCapabilities {
  /** Creates machines itself to fill claims. */
  provision: boolean;
  /** Installs an exact key for an exact generation. */
  installKey: boolean;
  /** Removes an exact key and reports proof. */
  revokeKey: boolean;
  /** Kills every session of a machine and proves it (new incarnation or every group reaped). */
  fence: boolean;
  /** Wipes what a borrower left. */
  scrub: boolean;
  /** Destroys a machine and confirms it is gone. */
  destroy: boolean;
  /** Reads back a machine's immutable resource identity and incarnation. */
  observeIdentity: boolean;
}

export const PORTABLE_CAPABILITIES: readonly (keyof ProviderCapabilities)[] = ["installKey", "revokeKey", "fence", "destroy", "observeIdentity"];

export function missingPortableCapabilities(c: ProviderCapabilities): string[] {
  return PORTABLE_CAPABILITIES.filter((k) => !c[k]);
}

/**
 * One machine operation for a provider (the allocation kinds go to an agent
 * directly: coordinator/allocation-agent.ts): its kind and the row's
 * arguments typed together (protocol/operations.ts `parseOpRowArgs`).
 */
export type OperationRequest = OpRowCall & {
  opId: string;
  machine: MachineRow;
  generation: number;
  /** provision: placements of the pool whose breaker is open (a self-placed provider launches elsewhere). */
  avoidPlacements?: string[];
};

/**
 * Where a self-placed provider's provision attempt launched (the aws
 * provider: `region/instance type/subnet`), reported with a provision that
 * is not done, so a give-up is counted against that placement's breaker
 * (store/placement-breakers.ts). `alternatives`: how many other configured
 * placements were not backed off; with none, the give-up also counts
 * against the pool's breaker. A done provision names it as
 * `result.placement`, which closes that placement's breaker.
 */
export interface Placement {
  key: string;
  alternatives: number;
}

/**
 * What a done operation proved. The executor reads the named fields; the
 * whole object is kept on the operation row (for the hosts provider, the
 * agent's result as src/protocol/operations.ts types it).
 */
export interface OperationEvidence {
  /** The machine's incarnation after the operation (provision, scrub), when the provider reports it. */
  incarnation?: string | null;
  /** provision: where the new machine's SSH gateway listens, and its host key. */
  sshHost?: string;
  sshPort?: number;
  hostKey?: string;
  [detail: string]: unknown;
}

export type OperationOutcome =
  /** The provider proved the operation done; `result` is its evidence. */
  | { kind: "done"; result: OperationEvidence }
  /** The provider refused or failed, and nothing was changed. */
  | { kind: "failed"; error: string; retryable: boolean; placement?: Placement }
  /** The outcome is unknown (timeout, lost reply): retry with the same op id to learn it. */
  /**
   * `throttled`: the provider's API refused the call for its rate
   * (RequestLimitExceeded, ThrottlingException): the retry is not counted as
   * a failed attempt of the operation, and waits a jittered backoff.
   */
  | { kind: "ambiguous"; error: string; throttled?: boolean; placement?: Placement };

export interface Provider {
  readonly name: string;
  readonly capabilities: ProviderCapabilities;
  /** Creates machines of its own (cloud instances), so provisioning takes no slot on an enrolled host. */
  readonly selfPlaced?: boolean;
  run(op: OperationRequest): Promise<OperationOutcome>;
  /**
   * The lend-time check of a machine with a network policy: its live rules
   * are the ones recorded with its readiness evidence (docs/network.md).
   * Absent: the provider enforces no network policy.
   */
  checkNetwork?(machine: MachineRow): Promise<NetworkCheck>;
  /**
   * Looks at the resources of these machines (ready or lent) as the provider
   * sees them now, and names those gone or impaired (ready-check.ts runs it on
   * an interval). Absent: the provider's machines are not checked this way.
   */
  checkMachines?(machines: MachineRow[]): Promise<MachineLoss[]>;
}

/** A machine whose resource is gone (terminated or stopped outside berth) or whose status checks fail. */
export interface MachineLoss {
  machineId: string;
  verdict: "gone" | "impaired";
  /** What was observed, for the machine's reason, the audit trail and the borrower (names the resource). */
  cause: string;
}

/** `agentMs`: the agent's own time for a passed check (as it reported it), so the request's transport can be told from the work. */
export type NetworkCheck = { ok: true; digest: string; reprobed: boolean; agentMs?: number } | { ok: false; why: string; diff: string[] };

export interface Providers {
  get(name: string): Provider | undefined;
}

/** Machines registered by an outside keeper: berth runs no operation on them. */
export const externalProvider: Provider = {
  name: "external",
  capabilities: { provision: false, installKey: false, revokeKey: false, fence: false, scrub: false, destroy: false, observeIdentity: false },
  async run(op) {
    return { kind: "failed", error: `the external provider runs no operations (asked for ${op.kind})`, retryable: false };
  },
};

export function providerRegistry(list: Provider[]): Providers {
  const map = new Map(list.map((p) => [p.name, p]));
  if (!map.has("external")) map.set("external", externalProvider);
  return { get: (name) => map.get(name) };
}
