/**
 * What a host's standing is reported as. A change of standing is recorded
 * with a new epoch and pushed to the host's agent; a withdrawal (draining,
 * withdrawn) counts only once the agent acknowledged it — until then the
 * host is `withdrawing` (placement already skips it; a launch decided under
 * the older epoch may still be under way on the agent). `ready` and
 * `not_ready` need no acknowledgment to be true: neither lets a launch
 * through that the agent would refuse.
 */
import type { HostStanding } from "./allocation-placement.js";

export type ReportedStanding = HostStanding | "withdrawing";

export function reportedStanding(standing: HostStanding, epoch: number, acked: number): ReportedStanding {
  if (acked >= epoch) return standing;
  return standing === "draining" || standing === "withdrawn" ? "withdrawing" : standing;
}
