/**
 * Draining a pool: its desired capacity drops to zero and every ready
 * machine is retired (destroyed by its provider, or left draining for an
 * outside keeper to confirm). Lent machines are retired when they come back.
 */
import { BerthError } from "../../core/errors.js";
import type { Ctx } from "../context.js";
import type { Principal } from "../auth.js";
import { lockPool } from "./fill.js";
import { applyTransition } from "./transition.js";
import type { MachineRow } from "../../store/rows.js";

export async function drainPool(ctx: Ctx, p: Principal, name: string): Promise<{ drained: number; remaining: number }> {
  const now = ctx.now();
  const nonce = Buffer.from(ctx.randomBytes(8)).toString("hex");
  const r = await ctx.store.transaction(async (tx) => {
    const pool = await lockPool(tx, p.org, name);
    if (!pool) throw new BerthError("not_found", `not_found: no pool named ${name} in this organisation`);
    await tx.run("UPDATE pools SET min_ready = 0, max_ready = 0, updated_at = ? WHERE org = ? AND name = ?", [now, p.org, name]);
    const ready = await tx.all<MachineRow>(`SELECT * FROM machines WHERE org = ? AND pool = ? AND state = 'ready'${tx.forUpdate}`, [p.org, name]);
    for (const m of ready) await applyTransition(tx, ctx, m, { kind: "drain", reason: "pool drained" }, now, { nonce: `${nonce}:${m.id}` });
    const left = await tx.get<{ n: number }>("SELECT COUNT(*) AS n FROM machines WHERE org = ? AND pool = ? AND state <> 'destroyed'", [p.org, name]);
    return { drained: ready.length, remaining: Number(left?.n ?? 0) };
  });
  ctx.kick();
  return r;
}
