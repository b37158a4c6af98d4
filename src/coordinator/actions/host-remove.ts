/**
 * `berth host rm NAME [--force]` (docs/host-identity.md, "Recovery by an
 * operator"): ends every state a host can be in (legacy, switching,
 * stranded, awaiting, active). Refused `host_busy` while the host lends a
 * machine or holds a live allocation, unless forced. Otherwise, in one
 * transaction, the host is marked removing (`removing_since`: it takes no
 * new machine, allocation, enrollment, switch or reset; audit
 * `host_removing`). Then each of its machines is drained as `berth machine
 * drain` does (a lent one's borrow ends or its grant is invalidated, then
 * the machine is destroyed by its agent) and each live allocation is
 * released through the normal path (cause `operator`). The host's row (its
 * credentials and capacity account with it) goes once nothing of it is
 * live (audit `host_removed`); until then the answer is `removing`, and
 * calling again drains what is left and removes it once done. Idempotent.
 */
import { BerthError, isBerthError } from "../../core/errors.js";
import { audit } from "../../store/audit.js";
import { liveMachinesOfHost } from "../../store/host-identity.js";
import { deleteHostRow, liveOnHost, markRemoving } from "../../store/host-removal.js";
import { lockHostByName } from "../../store/hosts.js";
import type { MachineRow } from "../../store/machines.js";
import { unreleasedAllocationsOnHost } from "../../store/allocations.js";
import type { Principal } from "../auth.js";
import { requireRole } from "../auth.js";
import type { Ctx } from "../context.js";
import { releaseAllocation } from "./allocation-release.js";
import { drainMachine } from "./drain.js";

const LENT = new Set(["reserved", "installing", "busy"]);

export interface RemoveAnswer {
  host: string;
  hostId: string;
  state: "removing" | "removed";
  /** What of the host still lives (machines not destroyed, allocations not released). */
  machines: number;
  allocations: number;
}

export async function removeHost(ctx: Ctx, p: Principal, name: string, force: boolean): Promise<RemoveAnswer> {
  requireRole(p, "admin");
  const now = ctx.now();
  const first = await ctx.store.transaction(async (tx) => {
    const h = await lockHostByName(tx, p.org, name);
    if (!h) throw new BerthError("not_found", `not_found: no host named ${name} in this organisation (see \`berth host ls\`)`);
    const machines = await liveMachinesOfHost<MachineRow>(tx, h.id);
    const allocations = await unreleasedAllocationsOnHost(tx, h.id);
    const lent = machines.filter((m) => LENT.has(m.state));
    if (!force && (lent.length > 0 || allocations.length > 0)) {
      const what = [...lent.map((m) => `machine ${m.id} (${m.state}, pool ${m.pool})`), ...allocations.map((a) => `allocation ${a.id} (${a.state})`)];
      throw new BerthError("host_busy", `host_busy: host ${name} holds ${what.join(", ")}; end those first, or use --force to end those borrows and release those allocations`);
    }
    if (h.removing_since === null) {
      await markRemoving(tx, h.id, now);
      await audit(tx, { at: now, machineId: h.id, subject: p.tokenId, event: "host_removing", from: h.identity_state, to: "removing", generation: 0, actor: ctx.actor });
    }
    return { hostId: h.id, machines: machines.map((m) => m.id), allocations: allocations.filter((a) => a.state !== "releasing").map((a) => a.id) };
  }, { name: "host_remove" });
  for (const id of first.machines) {
    try {
      await drainMachine(ctx, p, id);
    } catch (e) {
      // A machine in the middle of its cleanup is drained by the next call; one already gone needs nothing.
      if (!(isBerthError(e) && (e.code === "conflict" || e.code === "not_found"))) throw e;
    }
  }
  for (const id of first.allocations) {
    try {
      await releaseAllocation(ctx, { org: p.org, principal: p.tokenId, operator: true }, id, false);
    } catch (e) {
      if (!(isBerthError(e) && (e.code === "conflict" || e.code === "not_found"))) throw e;
    }
  }
  const r = await ctx.store.transaction(async (tx): Promise<RemoveAnswer> => {
    const h = await lockHostByName(tx, p.org, name);
    if (!h || h.id !== first.hostId) return { host: name, hostId: first.hostId, state: "removed", machines: 0, allocations: 0 };
    const live = await liveOnHost(tx, h.id);
    if (live.machines === 0 && live.allocations === 0) {
      await deleteHostRow(tx, h.id);
      await audit(tx, { at: ctx.now(), machineId: h.id, subject: p.tokenId, event: "host_removed", from: "removing", to: "removed", generation: 0, actor: ctx.actor });
      tx.afterCommit(() => ctx.log.info({ host: name, hostId: h.id, by: p.tokenId }, "host removed by an operator"));
      return { host: name, hostId: h.id, state: "removed", machines: 0, allocations: 0 };
    }
    return { host: name, hostId: h.id, state: "removing", ...live };
  }, { name: "host_remove_finish" });
  ctx.kick();
  return r;
}
