/** What allocation actions need from the coordinator's Ctx (its own module, so the allocation actions import it without importing each other). */
import type { Store } from "../../store/store.js";
import type { CoordinatorConfig } from "../context.js";

export interface AllocCtx {
  store: Store;
  now: () => number;
  /** This coordinator instance, for the ledger. */
  actor: string;
  config: Pick<CoordinatorConfig, "allocationSizes" | "maxAllocationMs">;
  /** Counts a refusal by reason (metrics); optional so store tests need no metrics. */
  onRefusal?: (reason: string) => void;
  /** Wakes the reconciler after a commit that made work (launch, cleanup); optional for store tests. */
  kick?: () => void;
}

