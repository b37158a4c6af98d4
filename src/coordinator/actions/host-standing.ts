/**
 * Pushing a host's standing to its agent (the half of a standing change
 * after its commit; allocation-owners.ts `changeHostStanding` records it under a
 * new epoch and arms a `host_standing` due row in the same transaction).
 *
 *   1. read the account: nothing to do once the agent acknowledged the
 *      current epoch (the due row is cleared);
 *   2. `POST /v1/agent/standing {epoch, standing}`: the agent stores it
 *      durably and answers once every launch that began before it ended;
 *   3. one transaction: the acknowledgment recorded (never backwards), the
 *      due row cleared if the epoch is still current.
 * An agent that does not answer leaves the due row armed: the reconciler
 * retries (any coordinator), and the host reads `withdrawing` meanwhile
 * (core/host-standing.ts). A crash anywhere leaves the same.
 */
import { reportedStanding, type ReportedStanding } from "../../core/host-standing.js";
import { lockHostAccount } from "../../store/host-accounts.js";
import { ackStanding } from "../../store/host-standing.js";
import { clearDue } from "../../store/due.js";
import type { AllocCtx } from "./allocation-context.js";
import type { AllocationAgent } from "../allocation-agent.js";

/** How soon an unacknowledged standing is pushed again. */
export const STANDING_RETRY_MS = 5_000;

export async function pushStanding(d: { ctx: Pick<AllocCtx, "store" | "now">; agent: AllocationAgent; log?: { warn: (o: object, m: string) => void } }, hostId: string): Promise<ReportedStanding | null> {
  const { ctx } = d;
  const h = await ctx.store.transaction((tx) => lockHostAccount(tx, hostId), { name: "host_standing_read" });
  if (!h) {
    await ctx.store.transaction((tx) => clearDue(tx, "host_standing", hostId), { name: "host_standing_gone" });
    return null;
  }
  if (h.standingAcked >= h.standingEpoch) {
    await ctx.store.transaction((tx) => clearDue(tx, "host_standing", hostId), { name: "host_standing_done" });
    return h.standing;
  }
  let acked: number | null = null;
  try {
    const r = await d.agent.passthrough(hostId, "POST /v1/agent/standing", {}, { epoch: h.standingEpoch, standing: h.standing });
    if (r.epoch >= h.standingEpoch) acked = h.standingEpoch;
  } catch (e) {
    d.log?.warn({ host: hostId, epoch: h.standingEpoch, error: e instanceof Error ? e.message : String(e) }, "host standing not acknowledged by the agent yet; retried");
  }
  if (acked === null) return reportedStanding(h.standing, h.standingEpoch, h.standingAcked);
  return ctx.store.transaction(async (tx) => {
    await ackStanding(tx, hostId, acked);
    const now = await lockHostAccount(tx, hostId);
    if (now && now.standingAcked >= now.standingEpoch) await clearDue(tx, "host_standing", hostId);
    return now ? reportedStanding(now.standing, now.standingEpoch, now.standingAcked) : null;
  }, { name: "host_standing_ack" });
}
