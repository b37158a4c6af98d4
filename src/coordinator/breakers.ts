/**
 * Counting a given-up provision of a self-placed provider's pool against
 * its breakers (failing capacity stops itself, docs/aws.md):
 *
 *   - the placement's breaker (store/placement-breakers.ts), when the
 *     provider named where the attempt launched: after N give-ups in a row
 *     there, the pool's next launches go to its other placements;
 *   - the pool's breaker (store/provision-breaker.ts), when no placement
 *     was named or no other placement was left: after N give-ups in a row
 *     the pool launches nothing for a while.
 *
 * Each opening is counted in a metric and written to the audit trail of the
 * machine whose failure opened it.
 */
import type { Ctx } from "./context.js";
import type { Tx } from "../store/store.js";
import type { MachineRow } from "../store/machines.js";
import type { Placement } from "../providers/provider.js";
import { audit } from "../store/audit.js";
import { provisionGaveUp } from "../store/provision-breaker.js";
import { placementGaveUp } from "../store/placement-breakers.js";

export async function countProvisionGiveUp(tx: Tx, ctx: Ctx, opId: string, m: MachineRow, error: string, placement: Placement | undefined, now: number): Promise<void> {
  const c = ctx.config;
  const s = { threshold: c.provisionBreakerThreshold, backoffMs: c.provisionBreakerBackoffMs, maxBackoffMs: c.provisionBreakerMaxMs };
  const entry = { at: now, machineId: m.id, subject: opId, from: null, generation: m.generation, actor: ctx.actor };
  if (placement) {
    const p = await placementGaveUp(tx, m.org, m.pool, placement.key, error, now, s);
    if (p) {
      tx.afterCommit(() => ctx.metrics.placementBreakerTrips.inc({ pool: m.pool, placement: placement.key }));
      const next = placement.alternatives > 0 ? "the pool launches on its other placements" : "no other placement is left";
      await audit(tx, { ...entry, event: "placement_breaker_open", to: "paused", detail: `pool ${m.pool} launches nothing on ${placement.key} until ${new Date(p.openUntil!).toISOString()} (${next}): ${error}`.slice(0, 1000) });
    }
    // Another placement is still open to launches: the pool itself keeps filling there.
    if (placement.alternatives > 0) return;
  }
  const opened = await provisionGaveUp(tx, m.org, m.pool, error, now, s);
  if (opened) {
    tx.afterCommit(() => {
      ctx.metrics.provisionBreakerTrips.inc({ pool: m.pool });
      ctx.metrics.history.provision(m.org, m.pool, now, "breaker_open");
    });
    await audit(tx, { ...entry, event: "provision_breaker_open", to: "paused", detail: `pool ${m.pool} stops launching until ${new Date(opened.openUntil!).toISOString()}: ${error}`.slice(0, 1000) });
  }
}
