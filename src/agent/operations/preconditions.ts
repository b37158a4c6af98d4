/**
 * Whether an operation may act now, decided before anything is written: a
 * refusal changes nothing and is not recorded, so a retry is refused the
 * same way (generations only grow).
 *
 *   machine kinds   the machine's record (state, generation): an operation
 *                   below the machine's generation is refused
 *                   (`generation_mismatch`); a machine being created admits
 *                   only its provision or a destroy, one being destroyed or
 *                   destroyed only destroy, one that does not match its
 *                   record nothing (but destroy of one that is missing).
 *   alloc_hold      the allocation's hold: none, a floor at or below this
 *                   generation, or held by this very generation
 *                   (alloc-hold.ts `holdRefusal`).
 *   alloc_launch    the hold of exactly this generation, and a standing epoch
 *                   the host's withdrawal has not passed (standing.ts).
 *   alloc_release   always (it fences every later hold).
 */
import { BerthError, assertNever } from "../../core/errors.js";
import type { NormalizedArgs, OperationKind } from "../../protocol/operations.js";
import type { MachineRecord } from "../store/machines.js";
import type { AgentStore } from "../store/store.js";
import { holdRefusal } from "./alloc-hold.js";
import { launchRefusal, readStanding } from "../standing.js";

/** The prefix of a mismatch an operator resolved: only `destroy` is accepted for it (alloc-release.ts). */
export const OPERATOR_RESOLVED = "operator resolved: ";

export interface Envelope {
  opId: string;
  machineId: string;
  generation: number;
}

/** Throws the refusal when `args` may not act on this host now. */
export function checkPreconditions(store: AgentStore, env: Envelope, args: NormalizedArgs): void {
  switch (args.kind) {
    case "alloc_hold": {
      const refusal = holdRefusal(args.allocationId, store.holds.get(args.allocationId), env.generation);
      if (refusal) throw refusal;
      return;
    }
    case "alloc_launch": {
      const h = store.holds.get(args.allocationId);
      if (!h || h.state !== "held") throw new BerthError("conflict", `conflict: allocation ${args.allocationId} holds no slot on this host${h ? ` (${h.state})` : ""}; take the hold first`);
      if (h.generation !== env.generation) throw new BerthError("generation_mismatch", `generation_mismatch: allocation ${args.allocationId}'s hold is generation ${h.generation}, not ${env.generation}; nothing was changed`);
      const withdrawn = launchRefusal(readStanding(store.meta), args.allocationId, args.standingEpoch ?? 0);
      if (withdrawn) throw withdrawn;
      return;
    }
    case "alloc_release":
      return;
    case "provision":
    case "install_key":
    case "remove_key":
    case "fence":
    case "scrub":
    case "destroy":
      return machinePrecondition(env, args.kind, store.machines.get(env.machineId));
    default:
      return assertNever(args, "operation");
  }
}

function machinePrecondition(env: Envelope, kind: OperationKind, m: MachineRecord | null): void {
  const { opId, machineId, generation } = env;
  if (m === null) {
    if (kind === "provision" || kind === "destroy") return;
    throw new BerthError("not_found", `not_found: machine ${machineId} is not on this host; provision it first`);
  }
  if (generation < m.generation) {
    throw new BerthError(
      "generation_mismatch",
      `generation_mismatch: operation ${opId} (${kind}) carries generation ${generation} of machine ${machineId}, which is at generation ${m.generation}; nothing was changed`,
    );
  }
  switch (m.state) {
    case "running":
      return;
    case "creating":
      if (kind === "provision" || kind === "destroy") return;
      throw new BerthError("conflict", `conflict: machine ${machineId} is still being created; finish its provision operation first`);
    case "destroying":
      if (kind === "destroy") return;
      throw new BerthError("conflict", `conflict: machine ${machineId} is being destroyed; only destroy can finish it`);
    case "destroyed":
      if (kind === "destroy") return;
      throw new BerthError("conflict", `conflict: machine ${machineId} was destroyed; use a new machine id`);
    case "mismatch":
      // Nothing left to signal, a machine retired because its network rules changed (its processes are its own),
      // or one an operator resolved (alloc_release with resolve): destroy may end it.
      if (kind === "destroy" && (m.mismatch?.startsWith("missing") || m.mismatch?.startsWith("network:") || m.mismatch?.startsWith(OPERATOR_RESOLVED))) return;
      throw new BerthError(
        "conflict",
        `conflict: machine ${machineId} does not match its record (${m.mismatch ?? "unknown"}); the agent will not touch it; an operator must inspect it`,
      );
    default:
      assertNever(m.state, "machine state");
  }
}
