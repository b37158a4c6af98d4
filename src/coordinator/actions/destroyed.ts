/**
 * An outside keeper confirms that it destroyed a machine berth cannot destroy
 * itself (external provider). Only then may the record age out: pruning
 * never drops the only record of a resource that may still exist.
 */
import { BerthError } from "../../core/errors.js";
import type { Ctx } from "../context.js";
import type { Principal } from "../auth.js";
import { audit } from "../../store/audit.js";
import { poolRef, setDue, setDueNoLater } from "../../store/due.js";
import { lockMachine, markDestroyedByKeeper } from "../../store/machines.js";

export async function confirmDestroyed(ctx: Ctx, p: Principal, machineId: string): Promise<{ machineId: string; state: string }> {
  const now = ctx.now();
  return ctx.store.transaction(async (tx) => {
    const m = await lockMachine(tx, machineId);
    if (!m || m.org !== p.org) throw new BerthError("not_found", `not_found: no machine ${machineId} in this organisation`);
    if (m.state === "destroyed") return { machineId, state: "destroyed" };
    const provider = ctx.providers.get(m.provider);
    if (provider?.capabilities.destroy) {
      throw new BerthError("conflict", `conflict: machine ${machineId} is destroyed by its provider (${m.provider}), not confirmed by hand`);
    }
    if (m.state !== "quarantined" && m.state !== "draining") {
      throw new BerthError("conflict", `conflict: machine ${machineId} is ${m.state}; only a quarantined or draining machine can be confirmed destroyed`);
    }
    await markDestroyedByKeeper(tx, machineId, m.generation, now);
    await audit(tx, { at: now, machineId, subject: p.tokenId, event: "destroyed_confirmed", from: m.state, to: "destroyed", generation: m.generation, actor: ctx.actor });
    await setDue(tx, "retention", `m:${machineId}`, now + ctx.config.retentionMs);
    await setDueNoLater(tx, "fill", poolRef(m.org, m.pool), now);
    return { machineId, state: "destroyed" };
  });
}
