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
import { lockPool } from "./fill.js";
import { applyTransition } from "./transition.js";
import { clearDue, setDue, type BorrowRow, type MachineRow } from "../../store/rows.js";
import { invalidateGrant, type GrantRow } from "./grants.js";

export async function drainPool(ctx: Ctx, p: Principal, name: string, force: boolean): Promise<{ drained: number; remaining: number }> {
  const now = ctx.now();
  const nonce = Buffer.from(ctx.randomBytes(8)).toString("hex");
  const r = await ctx.store.transaction(async (tx) => {
    const pool = await lockPool(tx, p.org, name);
    if (!pool) throw new BerthError("not_found", `not_found: no pool named ${name} in this organisation`);
    await tx.run("UPDATE pools SET min_ready = 0, max_ready = 0, updated_at = ? WHERE org = ? AND name = ?", [now, p.org, name]);
    let drained = 0;
    const ready = await tx.all<MachineRow>(`SELECT * FROM machines WHERE org = ? AND pool = ? AND state = 'ready'${tx.forUpdate}`, [p.org, name]);
    for (const m of ready) {
      await applyTransition(tx, ctx, m, { kind: "drain", reason: "pool drained" }, now, { nonce: `${nonce}:${m.id}` });
      drained++;
    }
    if (force) {
      const keeperBorrows = await tx.all<BorrowRow>(`SELECT * FROM borrows WHERE org = ? AND pool = ? AND state = 'active'${tx.forUpdate}`, [p.org, name]);
      for (const b of keeperBorrows) {
        await tx.run("UPDATE borrows SET state = 'returned', ended_at = ?, reason = 'pool drained' WHERE id = ?", [now, b.id]);
        await clearDue(tx, "heartbeat", b.id);
        await setDue(tx, "retention", `b:${b.id}`, now + ctx.config.retentionMs);
        const m = await tx.get<MachineRow>(`SELECT * FROM machines WHERE id = ?${tx.forUpdate}`, [b.machine_id]);
        if (m && m.state === "busy" && m.generation === b.generation) {
          await applyTransition(tx, ctx, m, { kind: "drain", reason: "pool drained" }, now, { subject: b.id, nonce: `${nonce}:${m.id}` });
          drained++;
        }
      }
      const grants = await tx.all<GrantRow>(`SELECT * FROM grants WHERE org = ? AND pool = ? AND state IN ('pending','installing','active')${tx.forUpdate}`, [p.org, name]);
      for (const g of grants) {
        await invalidateGrant(tx, ctx, g, "drained", now, `${nonce}:${g.id}`);
        drained++;
      }
    }
    const left = await tx.get<{ n: number }>("SELECT COUNT(*) AS n FROM machines WHERE org = ? AND pool = ? AND state <> 'destroyed'", [p.org, name]);
    return { drained, remaining: Number(left?.n ?? 0) };
  });
  ctx.kick();
  return r;
}
