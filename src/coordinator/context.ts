/**
 * What every coordinator action receives: the store, the clock, the source
 * of randomness, metrics, the log, and the provider registry. Time and
 * randomness come from here (never Date.now() deep in the code) so tests set
 * them exactly.
 */
import type { Store } from "../store/store.js";
import type { Metrics } from "./metrics.js";
import type { Logger } from "pino";
import type { Providers } from "../providers/provider.js";
import { DEFAULT_SIZES, type Size } from "../core/allocation-sizes.js";

export interface CoordinatorConfig {
  /** Grace added to every heartbeat interval before a borrow counts as abandoned. */
  claimTtlMs: number;
  /** How long destroyed machines and ended borrows are kept before pruning. */
  retentionMs: number;
  /** Portable access is enabled on this coordinator (opt-in, off by default). */
  portable: boolean;
  /** Acknowledgement deadline for a pending portable grant. */
  ackTimeoutMs: number;
  /** Maximum (and default) portable borrow duration. */
  maxBorrowMs: number;
  /** The allocation size catalog (operator-defined; default small and large). */
  allocationSizes: readonly Size[];
  /** Maximum (and default) allocation lifetime, fixed at create. */
  maxAllocationMs: number;
  /** An allocation launch actor's lease: renewed before each agent call; past it a replacement may take over. */
  allocationActorLeaseMs: number;
  /** How often a ready allocation's sandbox is asked after on its agent (a dead one becomes `failed`). */
  allocationWatchMs: number;
  /** Lifetime of a host credential issued against a signed challenge (the agent renews it before). */
  hostCredentialTtlMs: number;
  /** Provisions given up in a row after which a pool stops launching (its circuit breaker opens). */
  provisionBreakerThreshold: number;
  /** The first pause of an opened breaker; it doubles with each trip in a row, up to provisionBreakerMaxMs. */
  provisionBreakerBackoffMs: number;
  provisionBreakerMaxMs: number;
  /** Milliseconds per unit of an operation's retry backoff (2^attempt units, jittered, capped at 60 s). */
  opRetryUnitMs: number;
  /** How often ready and lent machines of providers that can (`checkMachines`) are checked for a resource gone or impaired; 0: never. */
  readyCheckMs: number;
}

export const DEFAULT_CONFIG: CoordinatorConfig = {
  claimTtlMs: 5 * 60_000,
  retentionMs: 24 * 3_600_000,
  portable: false,
  ackTimeoutMs: 60_000,
  maxBorrowMs: 30 * 60_000,
  allocationSizes: DEFAULT_SIZES,
  maxAllocationMs: 24 * 3_600_000,
  allocationActorLeaseMs: 15_000,
  allocationWatchMs: 15_000,
  hostCredentialTtlMs: 15 * 60_000,
  provisionBreakerThreshold: 3,
  provisionBreakerBackoffMs: 5 * 60_000,
  provisionBreakerMaxMs: 3_600_000,
  opRetryUnitMs: 100,
  readyCheckMs: 60_000,
};

export interface Ctx {
  store: Store;
  now: () => number;
  randomBytes: (n: number) => Uint8Array;
  metrics: Metrics;
  log: Logger;
  /** This coordinator instance, for the audit trail. */
  actor: string;
  config: CoordinatorConfig;
  providers: Providers;
  /** Wake the operation executor and reconciler now (after a commit that created work). */
  kick: () => void;
}
