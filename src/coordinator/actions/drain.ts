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
import { endBorrow, lockActiveBorrowsOfPool } from "../../store/borrows.js";
import { lockLiveGrantsOfPool } from "../../store/grants.js";
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
