/**
 * Draining a pool: its desired capacity drops to zero and every ready
 * machine is retired (destroyed by its provider, or left draining for an
 * outside keeper to confirm). Lent machines are retired when they come back
 * — or at once with `force`, which ends their borrows first (keeper borrows
 * end; portable grants are invalidated), so their borrowers lose access.
 */
import { BerthError } from "../../core/errors.js";
import type { Ctx } from "../context.js";
import type { Principal } from "../auth.js";
import { applyTransition } from "./transition.js";
import { clearDue, setDue } from "../../store/due.js";
import { endBorrow, lockActiveBorrowsOfPool, lockBorrow } from "../../store/borrows.js";
import { lockGrantAt, lockLiveGrantsOfPool } from "../../store/grants.js";
import { countLiveMachines, lockMachine, lockReadyMachines } from "../../store/machines.js";
import { lockPool, zeroPoolCapacity } from "../../store/pools.js";
import { invalidateGrant } from "./grants.js";

export async function drainPool(ctx: Ctx, p: Principal, name: string, force: boolean): Promise<{ drained: number; remaining: number }> {
  const now = ctx.now();
  const nonce = Buffer.from(ctx.randomBytes(8)).toString("hex");
  const r = await ctx.store.transaction(async (tx) => {
    const pool = await lockPool(tx, p.org, name);
    if (!pool) throw new BerthError("not_found", `not_found: no pool named ${name} in this organisation`);
    await zeroPoolCapacity(tx, p.org, name, now);
    let drained = 0;
    const ready = await lockReadyMachines(tx, p.org, name, null);
    for (const m of ready) {
      await applyTransition(tx, ctx, m, { kind: "drain", reason: "pool drained" }, now, { nonce: `${nonce}:${m.id}` });
      drained++;
    }
    if (force) {
      const keeperBorrows = await lockActiveBorrowsOfPool(tx, p.org, name);
      for (const b of keeperBorrows) {
        await endBorrow(tx, b.id, "returned", "pool drained", now);
        await clearDue(tx, "heartbeat", b.id);
        await setDue(tx, "retention", `b:${b.id}`, now + ctx.config.retentionMs);
        const m = await lockMachine(tx, b.machine_id);
        if (m && m.state === "busy" && m.generation === b.generation) {
          await applyTransition(tx, ctx, m, { kind: "drain", reason: "pool drained" }, now, { subject: b.id, nonce: `${nonce}:${m.id}` });
          drained++;
        }
      }
      const grants = await lockLiveGrantsOfPool(tx, p.org, name);
      for (const g of grants) {
        await invalidateGrant(tx, ctx, g, "drained", now, `${nonce}:${g.id}`);
        drained++;
      }
    }
    return { drained, remaining: await countLiveMachines(tx, p.org, name) };
  });
  ctx.kick();
  return r;
}

/**
 * Draining one machine (the dashboard's "drain", `POST /v1/machines/{id}/drain`):
 * a ready, provisioning or quarantined machine is retired at once. A lent one
 * loses its borrower first, as a forced pool drain does: a keeper borrow ends
 * and the machine is destroyed (destruction proves the sessions gone); a
 * portable grant is invalidated as `drained`. A machine already on its way
 * out is answered as it is; one in the middle of cleanup is refused (drain it
 * once its cleanup has finished).
 */
export async function drainMachine(ctx: Ctx, p: Principal, machineId: string): Promise<{ machineId: string; state: string }> {
  const now = ctx.now();
  const nonce = Buffer.from(ctx.randomBytes(8)).toString("hex");
  const r = await ctx.store.transaction(async (tx) => {
    const m = await lockMachine(tx, machineId);
    if (!m || m.org !== p.org) throw new BerthError("not_found", `not_found: no machine ${machineId} in this organisation`);
    if (m.state === "draining" || m.state === "destroying" || m.state === "destroyed") return { machineId: m.id, state: m.state };
    if (m.access === "portable" && ["reserved", "installing", "busy"].includes(m.state)) {
      const g = await lockGrantAt(tx, m.id, m.generation);
      if (g && g.org === m.org) {
        await invalidateGrant(tx, ctx, g, "drained", now, `${nonce}:${g.id}`);
        return { machineId: m.id, state: (await lockMachine(tx, m.id))?.state ?? "destroyed" };
      }
    }
    if (m.access === "keeper" && m.state === "busy" && m.lent_to !== null) {
      const b = await lockBorrow(tx, m.lent_to);
      if (b && b.state === "active" && b.generation === m.generation) {
        await endBorrow(tx, b.id, "returned", "machine drained", now);
        await clearDue(tx, "heartbeat", b.id);
        await setDue(tx, "retention", `b:${b.id}`, now + ctx.config.retentionMs);
      }
    }
    // The trail's subject: the borrow that lost its machine, else the operator's token (by id).
    const applied = await applyTransition(tx, ctx, m, { kind: "drain", reason: "drained by an operator" }, now, { subject: m.lent_to ?? p.tokenId, nonce: `${nonce}:${m.id}` });
    return { machineId: m.id, state: applied.machine.state };
  }, { name: "drain_machine" });
  ctx.kick();
  return r;
}
