/**
 * An operator ends someone's borrow (the dashboard's "end borrow",
 * `POST /v1/borrows/{id}/end`), without the borrow token.
 *
 * - A keeper borrow ends at once. Its machine goes the proven way back when
 *   its provider can fence (fence, then scrub, then ready); otherwise it is
 *   drained (destroyed: the only proof that the borrower's sessions are gone).
 * - A portable grant is invalidated as `ended_by_operator`: the key is
 *   removed, sessions fenced and the machine scrubbed, each proven, before it
 *   is ready again, as after a return.
 *
 * A borrow that already ended is answered as it is (a repeated click changes nothing).
 */
import { BerthError } from "../../core/errors.js";
import type { Ctx } from "../context.js";
import type { Principal } from "../auth.js";
import { clearDue, setDue } from "../../store/due.js";
import { endBorrow, lockBorrow } from "../../store/borrows.js";
import { lockGrant } from "../../store/grants.js";
import { lockMachine } from "../../store/machines.js";
import { applyTransition } from "./transition.js";
import { invalidateGrant } from "./grants.js";

export async function endBorrowAsOperator(ctx: Ctx, p: Principal, borrowId: string): Promise<{ borrowId: string; state: string; machineState: string | null }> {
  const now = ctx.now();
  const nonce = Buffer.from(ctx.randomBytes(8)).toString("hex");
  const r = await ctx.store.transaction(async (tx) => {
    if (borrowId.startsWith("g_")) {
      const g = await lockGrant(tx, borrowId);
      if (!g || g.org !== p.org) throw new BerthError("not_found", `not_found: no borrow ${borrowId} in this organisation`);
      const work = await invalidateGrant(tx, ctx, g, "ended_by_operator", now, `${nonce}:${g.id}`);
      const m = await lockMachine(tx, g.machine_id);
      const after = await lockGrant(tx, g.id);
      return { borrowId, state: after?.state ?? g.state, machineState: m?.state ?? null, work };
    }
    const b = await lockBorrow(tx, borrowId);
    if (!b || b.org !== p.org) throw new BerthError("not_found", `not_found: no borrow ${borrowId} in this organisation`);
    const m = await lockMachine(tx, b.machine_id);
    if (b.state !== "active") return { borrowId, state: b.state, machineState: m?.state ?? null, work: false };
    await endBorrow(tx, b.id, "returned", "ended by an operator", now);
    await clearDue(tx, "heartbeat", b.id);
    await setDue(tx, "retention", `b:${b.id}`, now + ctx.config.retentionMs);
    if (!m || m.generation !== b.generation || m.state !== "busy") return { borrowId, state: "returned", machineState: m?.state ?? null, work: false };
    const canFence = Boolean(ctx.providers.get(m.provider)?.capabilities.fence);
    const applied = canFence
      ? await applyTransition(tx, ctx, m, { kind: "return", mode: "keeper", scrub: true }, now, { subject: b.id, nonce })
      : await applyTransition(tx, ctx, m, { kind: "drain", reason: "borrow ended by an operator" }, now, { subject: b.id, nonce });
    return { borrowId, state: "returned", machineState: applied.machine.state, work: applied.opIds.length > 0 };
  }, { name: "end_borrow" });
  if (r.work) ctx.kick();
  return { borrowId: r.borrowId, state: r.state, machineState: r.machineState };
}
