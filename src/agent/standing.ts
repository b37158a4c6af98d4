/**
 * The host's standing as the agent knows it: the last (epoch, standing) the
 * coordinator pushed (`POST /v1/agent/standing`), kept in the store's `meta`
 * table. Epochs only grow. A withdrawal (draining, withdrawn) is stored
 * durably before it is acknowledged, and acknowledged only once every launch
 * that began before it has ended; from then on a launch decided under an
 * older epoch is refused (`host_withdrawn`), so no launch completes on this
 * host after its withdrawal was acknowledged. A launch decided under a newer
 * epoch (the host was made ready again and the push is still on its way)
 * moves the agent to that epoch: the coordinator decided it under a ready
 * standing.
 */
import { BerthError } from "../core/errors.js";
import type { MetaTable } from "./store/meta.js";

export const AGENT_STANDINGS = ["ready", "draining", "withdrawn", "not_ready"] as const;
export type AgentStanding = (typeof AGENT_STANDINGS)[number];

export interface StandingRecord {
  epoch: number;
  standing: AgentStanding;
}

const KEY = "standing";

export function readStanding(meta: MetaTable): StandingRecord {
  const raw = meta.get(KEY);
  if (raw === null) return { epoch: 0, standing: "ready" };
  const v = JSON.parse(raw) as StandingRecord;
  return { epoch: v.epoch, standing: v.standing };
}

/** Stores `next` if it is newer; returns what is stored after. Call inside a transaction. */
export function raiseStanding(meta: MetaTable, next: StandingRecord): StandingRecord {
  const cur = readStanding(meta);
  if (next.epoch <= cur.epoch) return cur;
  meta.set(KEY, JSON.stringify({ epoch: next.epoch, standing: next.standing }));
  return next;
}

/** Why a launch decided under standing epoch `epoch` may not run on this host now (null: it may). */
export function launchRefusal(cur: StandingRecord, allocationId: string, epoch: number): BerthError | null {
  const withdrawn = cur.standing === "withdrawn" || cur.standing === "draining";
  if (epoch < cur.epoch || (epoch === cur.epoch && withdrawn)) {
    return new BerthError(
      "host_withdrawn",
      `host_withdrawn: this host is ${cur.standing} (standing epoch ${cur.epoch}); the launch of allocation ${allocationId} was decided under epoch ${epoch} and is refused; nothing was started`,
    );
  }
  return null;
}
