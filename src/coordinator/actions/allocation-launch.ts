/**
 * Launching an allocation on its host: a durable operation with a
 * takeover-safe actor.
 *
 * Steps, and what is durable before what:
 *   1. decide (one transaction, owner row locked): re-check the host's
 *      standing (`launchGate`: a host withdrawn or draining since placement
 *      never launches — the allocation is released, reservation returned);
 *      write the actor record (allocation, generation 1, this coordinator)
 *      and move `placed` → `launching`. The `alloc_launch` due row stays
 *      armed, so if this coordinator dies any other one comes back to it.
 *   2. renew the actor's lease (compare-and-set on the exact record), then
 *      ask the agent for the slot hold at the actor's generation
 *      (`alloc_hold`, operation id derived from allocation + generation: a
 *      retry answers the first result).
 *   3. re-check the host's standing (a withdrawal between placement and
 *      launch stops here, before anything runs), renew the lease, then
 *      `alloc_launch`: volume, sandbox, the allocation's key. The launch
 *      carries the standing epoch it was decided under; a withdrawal that
 *      commits after this check reaches the agent before it counts
 *      (actions/host-standing.ts), and the agent refuses a launch of an
 *      older epoch (src/agent/standing.ts): released, cause host_withdrawn.
 *   4. record the result and `launching` → `ready` (one transaction), only
 *      while the actor record is still this actor's.
 *
 * A crash at any point leaves an actor record and a due row. The next visit
 * (another coordinator, or this one restarted with a new actor id) finds an
 * actor that is not itself and decides by `takeoverDecision` over the prior
 * actor's lease standing and a fresh observation of the hold on the agent:
 * a matching hold is recovered (its generation continues: launch is
 * idempotent), an absent hold with a lapsed actor is replaced by
 * compare-and-set from the exact old record (one of several racing
 * coordinators wins), anything unreadable keeps the obligation and retries.
 * The observation that can decide a compare-and-set raises the agent's
 * generation floor first (`fenceFloor`), and the agent refuses a hold below
 * its floor, below the highest generation it saw, or after release, so a
 * late actor can never take a second hold, whatever order its calls arrive in.
 */
import { createHash } from "node:crypto";
import { allocationMachineId } from "../../core/allocation-access.js";
import { launchGate } from "../../core/allocation.js";
import { actorLiveness, fenceFloor, takeoverDecision, type ActorRecord, type ActorStanding } from "../../core/allocation-takeover.js";
import type { Tx } from "../../store/store.js";
import { lockOwner } from "../../store/allocation-owners.js";
import { casActor, readActor, renewActor } from "../../store/allocation-actors.js";
import { casAllocationState, getAllocation, type AllocationRecord } from "../../store/allocations.js";
import { getLaunch, noteLaunchError, setLaunched, type LaunchRecord } from "../../store/allocation-launches.js";
import { lockHostAccount } from "../../store/host-accounts.js";
import { clearDue, setDue } from "../../store/due.js";
import { applyTakeover } from "./allocation-takeover.js";
import { moveLocked, releaseIn } from "./allocation-release.js";
import type { Ctx } from "../context.js";
import type { AllocationAgent } from "../allocation-agent.js";

/** What launches and cleanups need (wired in server.ts; run by allocation-worker.ts). */
export interface AllocWorkerDeps {
  ctx: Ctx;
  /** Calls to the allocation's host agent (holds, launch, release). */
  agent: AllocationAgent;
  /** A test hook: stops at a named point (allocation-worker.ts pauseForTestAt); a no-op in production. */
  pauseAt: (point: string) => Promise<void>;
}

type Plan =
  | { kind: "none" }
  | { kind: "act"; a: AllocationRecord; launch: LaunchRecord; actor: ActorRecord }
  | { kind: "takeover"; a: AllocationRecord; launch: LaunchRecord; prior: { record: ActorRecord; recordedAt: number } | null };

export async function driveLaunch(d: AllocWorkerDeps, id: string): Promise<void> {
  const { ctx } = d;
  const now = ctx.now();
  let plan = await ctx.store.transaction((tx) => decide(tx, d, id, now), { name: "alloc_launch_decide" });
  if (plan.kind === "takeover") {
    await d.pauseAt("alloc_before_takeover");
    plan = await takeOver(d, plan);
  }
  if (plan.kind === "act") await act(d, plan.a, plan.launch, plan.actor);
}

async function decide(tx: Tx, d: AllocWorkerDeps, id: string, now: number): Promise<Plan> {
  const { ctx } = d;
  const a0 = await getAllocation(tx, id);
  const launch = await getLaunch(tx, id);
  if (!a0 || !launch || (a0.state !== "placed" && a0.state !== "launching")) {
    await clearDue(tx, "alloc_launch", id);
    return { kind: "none" };
  }
  await lockOwner(tx, a0.org, a0.owner);
  const a = (await getAllocation(tx, id, true))!;
  // Keep the obligation armed: if this coordinator dies from here on, the row comes due for another.
  await setDue(tx, "alloc_launch", id, now + ctx.config.allocationActorLeaseMs);
  if (a.state === "placed") {
    const gate = await gateOf(tx, a);
    if (gate.kind === "release") {
      await releaseIn(tx, ctx, a, gate.cause, false, now);
      await clearDue(tx, "alloc_launch", id);
      ctx.log.info({ allocation: id, why: gate.why }, "allocation not launched: its host left the ready standing after placement");
      return { kind: "none" };
    }
    if (gate.kind === "wait") return { kind: "none" };
    const first: ActorRecord = { allocationId: id, generation: 1, actor: ctx.actor, kind: "actor" };
    const prior = await readActor(tx, id);
    if (prior) return { kind: "takeover", a, launch, prior };
    if (!(await casActor(tx, null, first, now))) return { kind: "none" };
    await moveLocked(tx, id, "placed", "launching", now, null);
    return { kind: "act", a: { ...a, state: "launching" }, launch, actor: first };
  }
  const prior = await readActor(tx, id);
  // Our own record (an earlier step of this process gave up on an ambiguous answer): carry on at its generation.
  if (prior && prior.record.actor === ctx.actor && prior.record.kind === "actor") return { kind: "act", a, launch, actor: prior.record };
  return { kind: "takeover", a, launch, prior };
}

/** Observe the hold (outside any transaction), decide, and apply the decision by compare-and-set. */
async function takeOver(d: AllocWorkerDeps, p: Extract<Plan, { kind: "takeover" }>): Promise<Plan> {
  const { ctx } = d;
  const standing: ActorStanding = p.prior ? { kind: "recorded", record: p.prior.record, liveness: actorLiveness(p.prior.recordedAt, ctx.now(), ctx.config.allocationActorLeaseMs) } : { kind: "none" };
  const hold = await d.agent.observeHold(p.a.hostId, p.a.id, fenceFloor(standing));
  const now = ctx.now();
  const decision = takeoverDecision(p.a.id, standing, hold, "wanted");
  ctx.log.info({ allocation: p.a.id, prior: p.prior?.record ?? null, hold, decision: decision.kind, actor: ctx.actor }, "allocation launch takeover decided");
  return ctx.store.transaction(async (tx): Promise<Plan> => {
    await lockOwner(tx, p.a.org, p.a.owner);
    const a = await getAllocation(tx, p.a.id, true);
    if (!a || (a.state !== "placed" && a.state !== "launching")) return { kind: "none" };
    switch (decision.kind) {
      case "recover": {
        // A live prior actor publishes its own hold; a lapsed one's hold is continued here, at its generation (launch is idempotent).
        if (standing.kind === "recorded" && standing.liveness === "running") return { kind: "none" };
        const mine: ActorRecord = { ...p.prior!.record, actor: ctx.actor };
        if (!(await casActor(tx, p.prior!.record, mine, now))) return { kind: "none" };
        if (a.state === "placed" && !(await casAllocationState(tx, a.id, "placed", "launching", now, null))) return { kind: "none" };
        return { kind: "act", a: { ...a, state: "launching" }, launch: p.launch, actor: mine };
      }
      case "cas_new_actor": {
        const won = await applyTakeover(tx, a.id, decision, ctx.actor, now);
        if (won.kind !== "won") return { kind: "none" };
        if (a.state === "placed" && !(await casAllocationState(tx, a.id, "placed", "launching", now, null))) return { kind: "none" };
        return { kind: "act", a: { ...a, state: "launching" }, launch: p.launch, actor: { allocationId: a.id, generation: won.generation, actor: ctx.actor, kind: "actor" } };
      }
      case "stale_hold":
        // A hold no actor owns (an agent that did not fence the observation): never adopted; the
        // allocation is released and the cleanup releases the hold on the agent, which fences every later one.
        if (a.state === "launching") {
          await noteLaunchError(tx, a.id, `launch abandoned: ${decision.why}`, now);
          await releaseIn(tx, ctx, a, "launch_failed", false, now);
        }
        return { kind: "none" };
      case "tombstone":
      case "settled":
      case "retain":
        // Retained: the due row (armed at the lease end) brings it back.
        return { kind: "none" };
      default:
        return decision satisfies never;
    }
  }, { name: "alloc_launch_takeover" });
}

async function gateOf(tx: Tx, a: AllocationRecord) {
  const host = await lockHostAccount(tx, a.hostId);
  return host ? launchGate(host.standing) : ({ kind: "release", cause: "host_withdrawn", why: "host account is gone" } as const);
}

/** Renew the lease; false when the record is no longer exactly ours (a replacement took over: stop). */
async function renew(d: AllocWorkerDeps, actor: ActorRecord): Promise<boolean> {
  return d.ctx.store.transaction(async (tx) => renewActor(tx, actor, d.ctx.now()), { name: "alloc_actor_renew" });
}

async function act(d: AllocWorkerDeps, a: AllocationRecord, launch: LaunchRecord, actor: ActorRecord): Promise<void> {
  const { ctx, agent } = d;
  const machineId = allocationMachineId(a.id);
  const g = actor.generation;
  await d.pauseAt("alloc_after_actor");
  if (!(await renew(d, actor))) return;
  const hold = await agent.op(a.hostId, "alloc_hold", `${opBase(a.id)}-h${g}`, machineId, g, { allocationId: a.id, vcpu: a.vcpu, memoryMib: a.memoryMib });
  if (hold.kind !== "done") return noteFailure(d, a.id, `hold: ${hold.error}`);
  await d.pauseAt("alloc_after_hold");
  // A host withdrawn after placement never launches: checked again right before anything runs.
  const gate = await ctx.store.transaction(async (tx) => {
    await lockOwner(tx, a.org, a.owner);
    const g2 = await gateOf(tx, a);
    const now = ctx.now();
    const cur = await getAllocation(tx, a.id, true);
    if (g2.kind === "release" && cur?.state === "launching") await releaseIn(tx, ctx, cur, g2.cause, false, now);
    return { ...g2, epoch: (await lockHostAccount(tx, a.hostId))?.standingEpoch ?? 0 };
  }, { name: "alloc_launch_gate" });
  if (gate.kind !== "launch") return;
  if (!(await renew(d, actor))) return;
  // The standing epoch this launch was decided under: the agent refuses it once a later withdrawal reached it.
  const res = await agent.op(a.hostId, "alloc_launch", `${opBase(a.id)}-l${g}`, machineId, g, { allocationId: a.id, publicKey: launch.publicKey, expiresAt: a.expiresAt, ...(gate.epoch ? { standingEpoch: gate.epoch } : {}), ...launchVolume(launch), ...(a.diskMib > 0 ? { diskMib: a.diskMib } : {}) });
  if (res.kind === "ambiguous") return noteFailure(d, a.id, `launch: ${res.error}`);
  await ctx.store.transaction(async (tx) => {
    const now = ctx.now();
    await lockOwner(tx, a.org, a.owner);
    const cur = await getAllocation(tx, a.id, true);
    const rec = await readActor(tx, a.id);
    if (!cur || cur.state !== "launching" || !rec || rec.record.actor !== actor.actor || rec.record.generation !== g) return; // released or taken over meanwhile
    if (res.kind === "refused") {
      // The agent refused and changed nothing it did not undo: clean up like a release.
      await noteLaunchError(tx, a.id, `launch refused: ${res.error}`, now);
      if (res.code === "host_withdrawn") await releaseIn(tx, ctx, cur, "host_withdrawn", false, now);
      else await releaseIn(tx, ctx, cur, "launch_failed", false, now);
      return;
    }
    await setLaunched(tx, a.id, res.result, now);
    await moveLocked(tx, a.id, "launching", "ready", now, null);
    await clearDue(tx, "alloc_launch", a.id);
    await setDue(tx, "alloc_watch", a.id, now + ctx.config.allocationWatchMs);
    tx.afterCommit(() => ctx.metrics.allocationReady.observe((now - a.createdAt) / 1000));
  }, { name: "alloc_launched" });
}

async function noteFailure(d: AllocWorkerDeps, id: string, error: string): Promise<void> {
  d.ctx.log.warn({ allocation: id, error }, "allocation launch step failed; retried");
  await d.ctx.store.transaction(async (tx) => {
    await noteLaunchError(tx, id, error, d.ctx.now());
  }, { name: "alloc_launch_error" });
}

/** A kept volume the launch attaches (absent otherwise, so every other launch's arguments are unchanged). */
export function launchVolume(launch: LaunchRecord): { volume?: string } {
  return launch.volumeFrom ? { volume: launch.volumeFrom } : {};
}

/** The stem of an allocation's operation ids: one id segment with room for a suffix (long ids are hashed). */
export function opBase(allocationId: string): string {
  return allocationId.length <= 100 ? `a-${allocationId}` : `a-h${createHash("sha256").update(allocationId).digest("hex").slice(0, 40)}`;
}
