/**
 * A ready allocation's sandbox, watched; a failed one, restarted.
 *
 * Watch: every ready allocation has an `alloc_watch` due row (armed when it
 * becomes ready, re-armed every `allocationWatchMs` while it stays ready).
 * Its visit asks the agent whether the sandbox runs
 * (`GET /v1/agent/holds/{id}/sandbox`: the runtime is asked, not the
 * record). Only an answer that the sandbox is not running (killed from
 * outside — a gvisor sandbox past its memory limit is killed whole by its
 * cgroup — or not matching its record after an agent restart) moves
 * `ready` → `failed`, with the agent's words as the reason, in one
 * transaction under the owner's lock. No answer changes nothing. A failed
 * allocation keeps its hold, slot, budget and volume.
 *
 * Restart (`berth alloc restart ID`, only from `failed`): the request arms an
 * `alloc_restart` due row. Its drive sends `alloc_launch` again at the hold's
 * generation under a fresh operation id (`…-r<failed since>`, the same for
 * every retry of one restart): the agent starts the sandbox again on the same
 * volume and installs the key; the allocation is `ready` again with the new
 * incarnation. It carries the host's standing epoch like a launch, so a
 * withdrawn host refuses it (`host_withdrawn`). A refusal leaves it `failed`
 * with the refusal in the reason (release it, or restart again); no answer
 * retries at the lease end. No new hold is taken, the budget is untouched.
 */
import { allocationMachineId } from "../../core/allocation-access.js";
import { allocationTransition, launchGate } from "../../core/allocation.js";
import { BerthError } from "../../core/errors.js";
import { parseId } from "../../core/ids.js";
import type { Tx } from "../../store/store.js";
import { lockOwner } from "../../store/allocation-owners.js";
import { readActor } from "../../store/allocation-actors.js";
import { casAllocationState, getAllocation, type AllocationRecord } from "../../store/allocations.js";
import { getLaunch, noteLaunchError, setLaunched } from "../../store/allocation-launches.js";
import { lockHostAccount } from "../../store/host-accounts.js";
import { clearDue, hasDue, setDue } from "../../store/due.js";
import { launchVolume, opBase, type AllocWorkerDeps } from "./allocation-launch.js";
import type { AllocCtx } from "./allocation-context.js";
import { lockRequested, moveLocked, type Requester } from "./allocation-release.js";
import type { Ctx } from "../context.js";
import type { SandboxObservation } from "../allocation-agent.js";

/** The reconciler's visit of an `alloc_watch` row: re-armed while ready; true when the drive should run. */
export async function onAllocationWatchDue(tx: Tx, ctx: Ctx, id: string, now: number): Promise<boolean> {
  const a = await getAllocation(tx, id);
  if (!a || a.state !== "ready") {
    await clearDue(tx, "alloc_watch", id);
    return false;
  }
  await setDue(tx, "alloc_watch", id, now + ctx.config.allocationWatchMs);
  return true;
}

export async function driveWatch(d: AllocWorkerDeps, id: string): Promise<void> {
  const { ctx } = d;
  const a = await ctx.store.transaction((tx) => getAllocation(tx, id), { name: "alloc_watch_read" });
  if (!a || a.state !== "ready") return;
  const seen = await d.agent.sandbox(a.hostId, id);
  if (seen.kind === "unreadable" || seen.kind === "absent") {
    ctx.log.debug({ allocation: id, why: seen.why }, "allocation sandbox not observed; asked again at the next watch");
    return;
  }
  if (seen.kind === "running") return;
  const failed = await ctx.store.transaction(async (tx) => {
    const now = ctx.now();
    await lockOwner(tx, a.org, a.owner);
    const cur = await getAllocation(tx, id, true);
    if (!cur || cur.state !== "ready") return false;
    const t = allocationTransition(cur.state, { kind: "sandbox_died", reason: seen.why });
    if (!t.ok || !t.changed) return false;
    await moveLocked(tx, id, "ready", t.state, now, t.reason);
    await clearDue(tx, "alloc_watch", id);
    return true;
  }, { name: "alloc_sandbox_died" });
  if (failed) {
    ctx.metrics.allocationSandboxDeaths.inc();
    ctx.log.warn({ allocation: id, host: a.hostId, why: seen.why }, "allocation failed: its sandbox is not running; berth alloc restart or release it");
  }
}

/** Asks a host's agent what it sees of an allocation's sandbox (AllocationAgent.sandbox). */
export type SandboxProbe = (hostId: string, allocationId: string) => Promise<SandboxObservation>;

/**
 * `POST /v1/allocations/{id}/restart`: only a failed allocation, by its owner or an operator, on a ready host
 * whose agent still has its machine as recorded (asked first with `probe`: an agent that restarted and found the
 * machine not matching, or has no machine of it, does not start it again — refused, nothing changed).
 */
export async function restartAllocation(ctx: AllocCtx, who: Requester, rawId: string, probe?: SandboxProbe): Promise<AllocationRecord> {
  const id = parseId(rawId, "allocation id");
  const failed = await ctx.store.transaction(async (tx) => restartable(tx, who, id), { name: "alloc_restart_check" });
  if (probe) {
    const seen = await probe(failed.hostId, id);
    if (seen.kind === "unreadable") {
      throw new BerthError("provider_unavailable", `provider_unavailable: allocation ${id} is not restarted: the agent of host ${failed.hostId} did not answer (${seen.why}); nothing changed; try again`);
    }
    if (seen.kind === "absent" || (seen.kind === "dead" && seen.lost)) {
      throw new BerthError(
        "conflict",
        `conflict: allocation ${id} is not restarted: the agent of host ${failed.hostId} no longer has its sandbox as recorded (${seen.why}); release it (berth alloc release ${id}); a quarantine that follows ends by berth alloc resolve ${id}`,
      );
    }
  }
  const now = ctx.now();
  return ctx.store.transaction(async (tx) => {
    const a = await restartable(tx, who, id);
    if (await hasDue(tx, "alloc_restart", id)) return a; // a restart is already under way: the same request
    await setDue(tx, "alloc_restart", id, now);
    tx.afterCommit(() => ctx.kick?.());
    return a;
  }, { name: "alloc_restart" });
}

/** The request's checks, under the owner then host locks: the requester's, a failed allocation, a ready host. */
async function restartable(tx: Tx, who: Requester, id: string): Promise<AllocationRecord> {
  const a = await lockRequested(tx, who, id, "restart");
  if (a.state !== "failed") {
    const hint = a.state === "ready" ? "its sandbox runs" : a.state === "placed" || a.state === "launching" ? "it is still being launched" : "it is being released or was released";
    throw new BerthError("conflict", `conflict: allocation ${id} is ${a.state}; only a failed allocation is restarted (${hint})`);
  }
  const host = await lockHostAccount(tx, a.hostId);
  const gate = host ? launchGate(host.standing) : ({ kind: "release", why: "host account is gone" } as const);
  if (gate.kind !== "launch") throw new BerthError("conflict", `conflict: allocation ${id} is not restarted: ${gate.why}; release it (berth alloc release ${id})`);
  return a;
}

/** The reconciler's visit of an `alloc_restart` row: true when the drive should run (pushed to the lease end first). */
export async function onAllocationRestartDue(tx: Tx, ctx: Ctx, id: string, now: number): Promise<boolean> {
  const a = await getAllocation(tx, id);
  if (!a || a.state !== "failed") {
    await clearDue(tx, "alloc_restart", id);
    return false;
  }
  await setDue(tx, "alloc_restart", id, now + ctx.config.allocationActorLeaseMs);
  return true;
}

export async function driveRestart(d: AllocWorkerDeps, id: string): Promise<void> {
  const { ctx, agent } = d;
  const start = await ctx.store.transaction(async (tx) => {
    const a0 = await getAllocation(tx, id);
    if (!a0 || a0.state !== "failed") return null;
    await lockOwner(tx, a0.org, a0.owner); // lock order owner → host, as everywhere
    const a = (await getAllocation(tx, id, true))!;
    const launch = await getLaunch(tx, id);
    const actor = await readActor(tx, id);
    if (a.state !== "failed" || !launch || !actor || actor.record.kind !== "actor") return null;
    const host = await lockHostAccount(tx, a.hostId);
    // The epoch is sent only as one decided under a ready standing (the agent moves to a newer epoch as ready,
    // as for a launch): a host that left ready since the request is not restarted on.
    const gate = host ? launchGate(host.standing) : ({ kind: "release", why: "host account is gone" } as const);
    if (gate.kind !== "launch") {
      await casAllocationState(tx, id, "failed", "failed", ctx.now(), `restart not done: ${gate.why}; release it; ${a.reason ?? ""}`.slice(0, 2000));
      await clearDue(tx, "alloc_restart", id);
      return null;
    }
    return { a, launch, generation: actor.record.generation, epoch: host!.standingEpoch };
  }, { name: "alloc_restart_start" });
  if (!start) return;
  const { a, launch, generation: g } = start;
  const opId = `${opBase(id)}-r${a.stateSince.toString(36)}`;
  const res = await agent.op(a.hostId, "alloc_launch", opId, allocationMachineId(id), g, { allocationId: id, publicKey: launch.publicKey, expiresAt: a.expiresAt, ...(start.epoch ? { standingEpoch: start.epoch } : {}), ...launchVolume(launch), ...(a.diskMib > 0 ? { diskMib: a.diskMib } : {}) });
  if (res.kind === "ambiguous") {
    await ctx.store.transaction(async (tx) => void (await noteLaunchError(tx, id, `restart: ${res.error}`, ctx.now())), { name: "alloc_restart_error" });
    return;
  }
  const outcome = await ctx.store.transaction(async (tx) => {
    const now = ctx.now();
    await lockOwner(tx, a.org, a.owner);
    const cur = await getAllocation(tx, id, true);
    await clearDue(tx, "alloc_restart", id);
    if (!cur || cur.state !== "failed") return "moot";
    if (res.kind === "refused") {
      const reason = `restart refused: ${res.error}; ${cur.reason ?? ""}`.slice(0, 2000);
      await moveLocked(tx, id, "failed", "failed", now, reason);
      return "refused";
    }
    const t = allocationTransition(cur.state, { kind: "restarted" });
    if (!t.ok) throw new Error(`allocation ${id}: ${t.refusal}`);
    await setLaunched(tx, id, res.result, now);
    await moveLocked(tx, id, "failed", t.state, now, t.reason);
    await setDue(tx, "alloc_watch", id, now + ctx.config.allocationWatchMs);
    return "restarted";
  }, { name: "alloc_restarted" });
  if (outcome !== "moot") ctx.metrics.allocationRestarts.inc({ outcome });
  ctx.log.info({ allocation: id, outcome, ...(res.kind === "refused" ? { error: res.error } : {}) }, "allocation restart ended");
}
