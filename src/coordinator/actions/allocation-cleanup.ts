/**
 * Cleaning up a released allocation (`releasing`, or `quarantined` being
 * retried) on its host, then returning its reservation.
 *
 *   1. decide whether the launch actor may still act: `takeoverDecision`
 *      with the desire `retired` over the actor's lease standing and a fresh
 *      hold observation. A running actor with no hold yet, or anything
 *      unreadable, keeps the obligation (retry at the lease end; an
 *      unreadable hold counts as an unproven attempt); an absent
 *      hold with a lapsed actor is settled by compare-and-set of the actor
 *      record to a tombstone (a late renewal of that actor then fails and it
 *      stops); a matching hold is released below like any other, and so is
 *      a stale one (another generation, or after the tombstone: no actor
 *      owns it), so release never waits on a hold forever.
 *   2. `alloc_release` on the agent (operation id fixed per allocation, so a
 *      retry after a crash answers the first result): keys dropped, sessions
 *      cut, every process proven gone, the volume kept or wiped in order, the
 *      hold released for good (a late hold of any generation is refused).
 *   3. one transaction (owner row, then host row): record the proof, the
 *      actor record becomes a tombstone, `releasing` → `released` with the
 *      refund of slot and budget — only now.
 * A refusal (the agent would not clean up: e.g. a sandbox that does not
 * match its record) or an outcome still unknown after several attempts moves
 * the allocation to `quarantined`: slot and budget stay charged, and the
 * cleanup keeps being retried slowly; once it is proven the quarantine is
 * resolved and the reservation returned.
 */
import { allocationMachineId } from "../../core/allocation-access.js";
import { allocationTransition } from "../../core/allocation.js";
import { refund } from "../../core/allocation-budget.js";
import { actorLiveness, fenceFloor, takeoverDecision, type ActorStanding } from "../../core/allocation-takeover.js";
import type { Tx } from "../../store/store.js";
import { lockOwner, setOwnerUsage } from "../../store/allocation-owners.js";
import { casActor, readActor } from "../../store/allocation-actors.js";
import { casAllocationState, getAllocation, type AllocationRecord } from "../../store/allocations.js";
import { getLaunch, noteLaunchError, setReleased, type LaunchRecord } from "../../store/allocation-launches.js";
import { appendLedger } from "../../store/allocation-ledger.js";
import { lockHostAccount, setHostUsage } from "../../store/host-accounts.js";
import { clearDue, setDue } from "../../store/due.js";
import type { AllocReleaseResult } from "../../protocol/operations.js";
import { opBase, type AllocWorkerDeps } from "./allocation-launch.js";
import { moveLocked } from "./allocation-release.js";

/** Attempts with an unknown outcome before the allocation is quarantined (it keeps being retried). */
export const CLEANUP_ATTEMPTS_BEFORE_QUARANTINE = 5;
/** How often a quarantined allocation's cleanup is retried. */
export const QUARANTINE_RETRY_MS = 60_000;

export async function driveCleanup(d: AllocWorkerDeps, id: string): Promise<void> {
  const { ctx, agent } = d;
  const start = await ctx.store.transaction(async (tx) => {
    const a = await getAllocation(tx, id);
    const launch = await getLaunch(tx, id);
    if (!a || !launch || (a.state !== "releasing" && a.state !== "quarantined")) {
      await clearDue(tx, "alloc_cleanup", id);
      return null;
    }
    // Armed before acting: a coordinator that dies from here on leaves it due for another.
    await setDue(tx, "alloc_cleanup", id, ctx.now() + (a.state === "quarantined" ? QUARANTINE_RETRY_MS : ctx.config.allocationActorLeaseMs));
    return { a, launch, prior: await readActor(tx, id) };
  }, { name: "alloc_cleanup_start" });
  if (!start) return;
  const { a, launch, prior } = start;

  // 1. May the launch actor still act?
  const standing: ActorStanding = prior ? { kind: "recorded", record: prior.record, liveness: actorLiveness(prior.recordedAt, ctx.now(), ctx.config.allocationActorLeaseMs) } : { kind: "none" };
  const hold = await agent.observeHold(a.hostId, a.id, fenceFloor(standing));
  const decision = takeoverDecision(a.id, standing, hold, "retired");
  ctx.log.info({ allocation: a.id, hold, prior: prior?.record ?? null, decision: decision.kind }, "allocation cleanup: launch actor decision");
  if (decision.kind === "retain") {
    // Waiting for a live actor is normal; an agent that cannot be read counts towards quarantine.
    if (hold.kind === "unreadable") await noteDoubt(d, a, `release: hold unreadable: ${hold.why}`, false);
    return;
  }
  if (decision.kind === "tombstone") {
    const won = await ctx.store.transaction(async (tx) => casActor(tx, decision.expected, { allocationId: a.id, generation: decision.next.generation, actor: ctx.actor, kind: "tombstone" }, ctx.now()), { name: "alloc_tombstone" });
    if (!won) return; // another coordinator changed the record: decide again at the next visit
  }

  // 2. The agent's cleanup. Generation 0 in the envelope: the agent releases at the highest
  // generation it knows, so every attempt (any coordinator) is the same request under one id.
  // An operator's resolution is another request (its own id per choice): the agent destroys a sandbox that does not match its record.
  const res = launch.resolve
    ? await agent.op(a.hostId, "alloc_release", `${opBase(a.id)}-x${launch.resolve.volume === "keep" ? "k" : "d"}`, allocationMachineId(a.id), 0, { allocationId: a.id, keepVolume: launch.resolve.volume === "keep", resolve: true })
    : await agent.op(a.hostId, "alloc_release", `${opBase(a.id)}-r`, allocationMachineId(a.id), 0, { allocationId: a.id, keepVolume: launch.keepVolume });
  await d.pauseAt("alloc_during_release");

  // 3. Record and refund, or quarantine.
  if (res.kind === "done") {
    await ctx.store.transaction((tx) => finish(tx, d, a, res.result, ctx.now(), launch.resolve), { name: "alloc_cleanup_done" });
    return;
  }
  await noteDoubt(d, a, `release: ${res.error}`, res.kind === "refused");
}

/** Counts an unproven attempt; a refusal, or too many unknown outcomes, quarantines (slot and budget stay charged). */
async function noteDoubt(d: AllocWorkerDeps, a: AllocationRecord, error: string, refused: boolean): Promise<void> {
  await d.ctx.store.transaction(async (tx) => {
    const now = d.ctx.now();
    const attempts = await noteLaunchError(tx, a.id, error, now);
    if (refused || attempts >= CLEANUP_ATTEMPTS_BEFORE_QUARANTINE) await quarantine(tx, a, `cleanup not proven: ${error}`, now);
  }, { name: "alloc_cleanup_doubt" });
}

async function finish(tx: Tx, d: AllocWorkerDeps, a0: AllocationRecord, result: AllocReleaseResult, now: number, resolve: LaunchRecord["resolve"]): Promise<void> {
  const { ctx } = d;
  const owner = await lockOwner(tx, a0.org, a0.owner);
  const a = await getAllocation(tx, a0.id, true);
  if (!a) return;
  const t = allocationTransition(a.state, a.state === "quarantined" ? { kind: "quarantine_resolved" } : { kind: "cleanup_done" });
  if (!t.ok || !t.changed) return;
  await setReleased(tx, a.id, result, now);
  const rec = await readActor(tx, a.id);
  if (rec && rec.record.kind === "actor") await casActor(tx, rec.record, { ...rec.record, generation: rec.record.generation + 1, actor: ctx.actor, kind: "tombstone" }, now);
  if (t.effects.some((e) => e.kind === "refund")) {
    if (!owner) throw new Error(`allocation ${a.id} has no owner row for ${a.owner}`);
    const host = await lockHostAccount(tx, a.hostId);
    if (!host) throw new Error(`allocation ${a.id} has no host account ${a.hostId}`);
    await setOwnerUsage(tx, a.org, a.owner, refund(owner.used, { name: a.size, vcpu: a.vcpu, memoryMib: a.memoryMib, diskMib: a.diskMib }), now);
    await setHostUsage(tx, a.hostId, { vcpu: host.used.vcpu - a.vcpu, memoryMib: host.used.memoryMib - a.memoryMib, diskMib: (host.used.diskMib ?? 0) - a.diskMib, slots: host.used.slots - 1 });
    await appendLedger(tx, { at: now, event: "refund", org: a.org, allocation_id: a.id, owner: a.owner, host_id: a.hostId, vcpu: a.vcpu, memory_mib: a.memoryMib, disk_mib: a.diskMib, detail: `cleanup proven: ${result.processesRemaining} processes, volume ${result.volume}${resolve ? `; quarantine resolved by operator ${resolve.by}` : ""}`, actor: ctx.actor });
  }
  const reason = resolve && a.state === "quarantined" ? `quarantine resolved by an operator (${resolve.by}); volume ${result.volume}` : (t.reason ?? `cleanup proven; volume ${result.volume}`);
  await moveLocked(tx, a.id, a.state, t.state, now, reason);
  await clearDue(tx, "alloc_cleanup", a.id);
}

async function quarantine(tx: Tx, a0: AllocationRecord, why: string, now: number): Promise<void> {
  await lockOwner(tx, a0.org, a0.owner);
  const a = await getAllocation(tx, a0.id, true);
  if (!a) return;
  const t = allocationTransition(a.state, { kind: "cleanup_doubtful", reason: why });
  if (!t.ok || !t.changed) return;
  // Slot and budget stay charged: nothing is returned while the cleanup is in doubt.
  await casAllocationState(tx, a.id, a.state, t.state, now, t.reason);
  await setDue(tx, "alloc_cleanup", a.id, now + QUARANTINE_RETRY_MS);
}
