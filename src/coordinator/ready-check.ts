/**
 * The ready check: every `readyCheckMs`, each provider that can look at its
 * machines' resources (`Provider.checkMachines`, e.g. the aws provider's
 * DescribeInstanceStatus) is asked about its ready and lent machines. A
 * machine whose resource is gone (terminated or stopped outside berth) or
 * impaired is retired with the observed cause, one transaction each:
 *
 *   ready                  drained (reason names the cause), so it is
 *                          destroyed and the pool fills a replacement;
 *   portable, lent         its grant is invalidated as `machine_lost` (the
 *                          borrower's heartbeat answers borrow_not_active
 *                          with that reason) and the machine quarantined,
 *                          then destroyed;
 *   keeper, lent           the borrow ends `withdrawn` with the cause, and
 *                          the machine is drained.
 *
 * Each loss is audited (`machine_lost`, the cause as detail) and counted
 * (`berth_machines_lost_total{pool,verdict}`). A machine that moved on between
 * the provider's answer and the transaction (returned, cleaned, destroyed) is
 * left for the next round. Every coordinator runs the check; the per-machine
 * transaction makes a second retirement of the same machine a no-op.
 */
import type { Ctx } from "./context.js";
import type { Tx } from "../store/store.js";
import type { MachineLoss } from "../providers/provider.js";
import { audit } from "../store/audit.js";
import { clearDue, poolRef, setDue, setDueNoLater } from "../store/due.js";
import { endBorrow, lockBorrow } from "../store/borrows.js";
import { lockGrantAt } from "../store/grants.js";
import { lockMachine, machinesOfProviderIn, type MachineRow } from "../store/machines.js";
import { applyTransition } from "./actions/transition.js";
import { invalidateGrant } from "./actions/grants.js";

const CHECKED_STATES = ["ready", "reserved", "installing", "busy"];

/** One round over every provider in `providerNames`; returns the losses it retired. */
export async function checkReadyMachines(ctx: Ctx, providerNames: string[]): Promise<MachineLoss[]> {
  const retired: MachineLoss[] = [];
  for (const name of providerNames) {
    const provider = ctx.providers.get(name);
    if (!provider?.checkMachines) continue;
    const machines = await ctx.store.transaction(
      (tx) => machinesOfProviderIn(tx, name, CHECKED_STATES),
      { name: "ready_check_read" },
    );
    if (machines.length === 0) continue;
    const checked = new Map(machines.map((m) => [m.id, m]));
    for (const loss of await provider.checkMachines(machines)) {
      const before = checked.get(loss.machineId);
      if (!before) continue;
      const nonce = Buffer.from(ctx.randomBytes(8)).toString("hex");
      const done = await ctx.store.transaction((tx) => retireLost(tx, ctx, before, loss, ctx.now(), nonce), { name: "retire_lost" });
      if (done) {
        ctx.metrics.machinesLost.inc({ pool: before.pool, verdict: loss.verdict });
        ctx.log.warn({ machine: loss.machineId, pool: before.pool, verdict: loss.verdict, cause: loss.cause }, "machine retired: its resource is gone or impaired");
        retired.push(loss);
      }
    }
  }
  if (retired.length > 0) ctx.kick();
  return retired;
}

async function retireLost(tx: Tx, ctx: Ctx, before: MachineRow, loss: MachineLoss, now: number, nonce: string): Promise<boolean> {
  const m = await lockMachine(tx, loss.machineId);
  if (!m || m.state !== before.state || m.generation !== before.generation) return false;
  const reason = `machine lost (${loss.verdict}): ${loss.cause}`.slice(0, 1000);
  await audit(tx, { at: now, machineId: m.id, subject: m.lent_to, event: "machine_lost", from: m.state, to: m.state, generation: m.generation, actor: ctx.actor, detail: reason });
  if (m.access === "portable" && m.state !== "ready") {
    const g = await lockGrantAt(tx, m.id, m.generation);
    if (g) await invalidateGrant(tx, ctx, g, "machine_lost", now, nonce);
    // No live grant moved it (none at this generation): the machine is quarantined itself.
    const after = await lockMachine(tx, m.id);
    if (after && after.state === m.state && after.generation === m.generation) {
      await applyTransition(tx, ctx, after, { kind: "quarantine", reason }, now, { nonce });
      tx.afterCommit(() => ctx.metrics.history.quarantined(m.org, m.pool, now, "machine_lost"));
    }
  } else {
    if (m.state === "busy" && m.lent_to !== null) {
      const b = await lockBorrow(tx, m.lent_to);
      if (b && b.state === "active" && b.generation === m.generation) {
        await endBorrow(tx, b.id, "withdrawn", reason, now);
        await clearDue(tx, "heartbeat", b.id);
        await setDue(tx, "retention", `b:${b.id}`, now + ctx.config.retentionMs);
      }
    }
    await applyTransition(tx, ctx, m, { kind: "drain", reason }, now, { subject: m.lent_to, nonce });
  }
  await setDueNoLater(tx, "fill", poolRef(m.org, m.pool), now);
  return true;
}

/** Runs the check every `everyMs` until stopped; a failed round is logged and the next one tries again. */
export function startReadyCheck(ctx: Ctx, providerNames: string[], everyMs: number): { stop(): Promise<void> } {
  let stopped = false;
  let running: Promise<void> = Promise.resolve();
  const round = () => {
    running = checkReadyMachines(ctx, providerNames).then(
      () => undefined,
      (e: unknown) => ctx.log.warn({ err: e instanceof Error ? e.message : String(e) }, "ready check failed; retrying next round"),
    );
  };
  const timer = setInterval(() => {
    if (!stopped) round();
  }, everyMs);
  timer.unref();
  return {
    async stop() {
      stopped = true;
      clearInterval(timer);
      await running;
    },
  };
}
