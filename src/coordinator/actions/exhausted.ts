/**
 * Why a pool has no machine to lend right now, in words a borrower can act
 * on (`pool_exhausted`): at its maximum with every machine lent; hosts full
 * (and which pools hold their slots); machines being made; a provisioning
 * error; or ready machines too short-lived for the borrow asked. Read in the
 * borrow's own transaction; the message is all a waiting client prints.
 */
import type { Tx } from "../../store/store.js";
import type { CapacityCounts, PoolRecord } from "../../core/pool.js";
import { formatDuration } from "../../core/durations.js";
import { countCapacity } from "./capacity.js";
import { lastProvisionError } from "../../store/images.js";
import { hostSlotTotals } from "../../store/hosts.js";
import { hostMachinesByPool } from "../../store/machines.js";

async function slotHolders(tx: Tx, org: string): Promise<{ free: number; slots: number; byPool: string }> {
  const { free, slots } = await hostSlotTotals(tx, org);
  const rows = await hostMachinesByPool(tx, org);
  return { free, slots, byPool: rows.map((r) => `${r.pool} ${r.n}`).join(", ") };
}

/** The tail of a `pool_exhausted` message: why nothing is ready, and what ends the wait. */
export async function whyExhausted(tx: Tx, pool: PoolRecord, now: number, o: { provisions: boolean; retired: { lifeMs: number } | null }): Promise<string> {
  const c = await countCapacity(tx, pool.org, pool.name, now);
  const name = `pool ${pool.name}`;
  if (o.retired) {
    return `${name} has no ready machine with ${formatDuration(o.retired.lifeMs)} of life left for this borrow; the shortest-lived one was retired and a fresh one is being made; try again shortly (or ask a shorter --duration)`;
  }
  if (c.ready > 0) return `${name}'s ready machines are all near the end of their hard TTL (${formatDuration(pool.hardTtlMs)}) and are being replaced; try again shortly`;
  return whyShort(tx, pool, c, o.provisions);
}

/** Why a pool has fewer ready machines than wanted (no ready machine, or fewer than minReady): what holds it, and what ends the wait. */
export async function whyShort(tx: Tx, pool: PoolRecord, c: CapacityCounts, provisions: boolean): Promise<string> {
  const name = `pool ${pool.name}`;
  const held = c.lent + c.cleanup + c.openClaims;
  if (held >= pool.maxReady && c.openClaims === 0) {
    const ends = c.lent === 0 ? "a cleanup ends" : c.cleanup === 0 ? "a borrow ends" : "a borrow or a cleanup ends";
    return `${name} is at its maximum of ${pool.maxReady} machine(s) and none is ready: ${c.lent} lent, ${c.cleanup} being cleaned after a return; one is ready again when ${ends} (or raise the pool's --max-ready)`;
  }
  if (c.openClaims > 0) return `${name} has no ready machine: ${c.openClaims} being made; try again shortly`;
  if (pool.minReady === 0) return `${name} keeps no machine ready (min-ready 0); raise its --min-ready`;
  if (!provisions) return `${name} has no ready machine; its keeper registers machines (none is on its way)`;
  const err = await lastProvisionError(tx, pool.org, pool.name);
  if (err) return `${name} has no ready machine: making one fails (${err.error.slice(0, 300)})`;
  const s = await slotHolders(tx, pool.org);
  if (s.slots === 0) return `${name} has no ready machine: no host is enrolled (start \`berth agent\` on one)`;
  if (s.free === 0) return `${name} has no ready machine: every host slot (${s.slots}) is taken${s.byPool ? ` (machines by pool: ${s.byPool})` : ""}; free slots by draining or shrinking another pool, or enrol a host with more --slots`;
  return `${name} has no ready machine right now; one is being made; try again shortly`;
}
