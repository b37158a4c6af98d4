/**
 * The lend-time network check of a keeper borrow (docs/network.md): a
 * machine of a pool with a network policy is lent only while its recorded
 * readiness evidence matches the rules as they are (invariant 13).
 *
 * The borrow's own transaction is unchanged (one commit, the hot path's
 * statements); for a machine with a policy the agent is asked after that
 * commit and before the borrower is answered. A machine that fails the check
 * was never lent: in one transaction its borrow is withdrawn (`withdrawn`,
 * the reason kept) and the machine quarantined with what changed in its
 * audit timeline; the coordinator then takes another machine. Pools without
 * a policy pay nothing.
 */
import type { MachineRow } from "../../store/machines.js";
import { lockMachine } from "../../store/machines.js";
import { endBorrow, lockBorrow } from "../../store/borrows.js";
import { clearDue, poolRef, setDue, setDueNoLater } from "../../store/due.js";
import type { Ctx } from "../context.js";
import { applyTransition } from "./transition.js";

/** Whether a machine is checked at lend time: it was made for a network policy other than `none`. */
export function needsLendCheck(m: Pick<MachineRow, "network_fingerprint">): boolean {
  return typeof m.network_fingerprint === "string" && m.network_fingerprint !== "none";
}

/** Asks the machine's provider; resolves to null when it may be lent, else why not. */
export async function lendCheck(ctx: Ctx, m: MachineRow): Promise<string | null> {
  const provider = ctx.providers.get(m.provider);
  if (!provider?.checkNetwork) return `provider ${m.provider} cannot check the network rules of machine ${m.id}`;
  const t0 = performance.now();
  const r = await provider.checkNetwork(m);
  if (r.ok) {
    ctx.metrics.lendCheck.observe({ part: "total" }, (performance.now() - t0) / 1000);
    if (r.agentMs !== undefined) ctx.metrics.lendCheck.observe({ part: "agent" }, r.agentMs / 1000);
    return null;
  }
  return `network rules not as recorded: ${r.why}${r.diff.length > 0 ? `; diff: ${r.diff.join(" | ")}` : ""}`;
}

/** The borrow is withdrawn and its machine quarantined (the reason, with the diff, in its audit timeline). */
export async function withdrawBorrow(ctx: Ctx, borrowId: string, machineId: string, generation: number, why: string): Promise<void> {
  const now = ctx.now();
  const quarantined = await ctx.store.transaction(async (tx) => {
    const b = await lockBorrow(tx, borrowId);
    if (b && b.state === "active") {
      await endBorrow(tx, b.id, "withdrawn", `never lent: ${why}`.slice(0, 4000), now);
      await clearDue(tx, "heartbeat", b.id);
      await setDue(tx, "retention", `b:${b.id}`, now + ctx.config.retentionMs);
    }
    const m = await lockMachine(tx, machineId);
    if (!m || m.generation !== generation || m.state !== "busy") return null;
    await applyTransition(tx, ctx, m, { kind: "quarantine", reason: `lend-time check: ${why}`.slice(0, 4000) }, now, { subject: borrowId, nonce: `lend-${borrowId}` });
    await setDueNoLater(tx, "fill", poolRef(m.org, m.pool), now);
    return { org: m.org, pool: m.pool };
  }, { name: "borrow_withdraw" });
  if (quarantined !== null) {
    ctx.metrics.machineQuarantined(quarantined, "network_lend_check", now);
    ctx.kick();
  }
}
