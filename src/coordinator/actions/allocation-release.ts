/**
 * Releasing an allocation (by its owner, an operator, or expiry).
 *
 * One transaction locks the owner's budget row, then re-reads the allocation
 * under that lock and applies the lifecycle transition; when the transition
 * returns the reservation (`refund`: only on the edge into `released`), the
 * host's account row is locked too and both are credited, and the ledger
 * records the refund. Lock order owner → host, as at create.
 *
 * An allocation that never launched (`placed`) is released at once. One that
 * launched (or is launching) goes to `releasing`, keeping slot and budget
 * charged until its cleanup is proven on the agent (allocation-cleanup.ts,
 * armed here by an `alloc_cleanup` due row in the same transaction).
 */
import { BerthError } from "../../core/errors.js";
import { parseId } from "../../core/ids.js";
import { refund } from "../../core/allocation-budget.js";
import { allocationTransition, expired, type AllocationState, type ReleaseCause } from "../../core/allocation.js";
import type { Tx } from "../../store/store.js";
import { lockOwner, setOwnerUsage } from "../../store/allocation-owners.js";
import { lockHostAccount, setHostUsage } from "../../store/host-accounts.js";
import { casAllocationState, getAllocation, type AllocationRecord } from "../../store/allocations.js";
import { appendLedger } from "../../store/allocation-ledger.js";
import { clearDue, setDue } from "../../store/due.js";
import { getLaunch, setKeepVolume, setResolve, type ResolveChoice } from "../../store/allocation-launches.js";
import type { AllocCtx } from "./allocation-context.js";

export interface Requester {
  org: string;
  /** The principal asking; an owner may release only its own allocations. */
  principal: string;
  operator: boolean;
}

/**
 * An allocation the requester may act on, re-read under its owner's lock
 * (every change of a reservation-holding allocation takes that lock first):
 * `not_found` outside the requester's organisation; with `act`, only its
 * owner or an operator may (`forbidden` for another owner).
 */
export async function lockRequested(tx: Tx, who: Requester, id: string, act?: string): Promise<AllocationRecord> {
  const a0 = await getAllocation(tx, id);
  if (!a0 || a0.org !== who.org) throw new BerthError("not_found", `not_found: no allocation ${id} in this organisation`);
  if (act && !who.operator && a0.owner !== who.principal) throw new BerthError("forbidden", `forbidden: allocation ${id} belongs to another owner; only it or an operator may ${act} it`);
  await lockOwner(tx, a0.org, a0.owner);
  return (await getAllocation(tx, id, true))!;
}

/** Moves an allocation read under its owner's lock out of `from`: that it moved meanwhile is a broken invariant, not a refusal. */
export async function moveLocked(tx: Tx, id: string, from: AllocationState, to: AllocationState, since: number, reason: string | null): Promise<void> {
  if (!(await casAllocationState(tx, id, from, to, since, reason))) throw new Error(`allocation ${id} changed under the owner's lock`);
}

/** Applies a release inside `tx`; returns the allocation as it now is. */
export async function releaseIn(tx: Tx, ctx: AllocCtx, a0: AllocationRecord, cause: ReleaseCause, keepVolume: boolean, now: number): Promise<AllocationRecord> {
  const owner = await lockOwner(tx, a0.org, a0.owner);
  // Re-read under the owner's lock: every change of a reservation-holding allocation takes that lock first.
  const a = (await getAllocation(tx, a0.id, true))!;
  // A kept volume attached to it is never wiped because its launch failed: it stays kept (now this allocation's).
  const keep = keepVolume || (cause === "launch_failed" && (await getLaunch(tx, a.id))?.volumeFrom != null);
  const t = allocationTransition(a.state, { kind: "release", cause, keepVolume: keep });
  if (!t.ok) throw new BerthError("conflict", `conflict: allocation ${a.id}: ${t.refusal}`);
  if (!t.changed) return a;
  if (t.effects.some((e) => e.kind === "refund")) {
    if (!owner) throw new Error(`allocation ${a.id} has no owner row for ${a.owner}`);
    const host = await lockHostAccount(tx, a.hostId);
    if (!host) throw new Error(`allocation ${a.id} has no host account ${a.hostId}`);
    const size = { name: a.size, vcpu: a.vcpu, memoryMib: a.memoryMib, diskMib: a.diskMib };
    await setOwnerUsage(tx, a.org, a.owner, refund(owner.used, size), now);
    await setHostUsage(tx, a.hostId, { vcpu: host.used.vcpu - a.vcpu, memoryMib: host.used.memoryMib - a.memoryMib, diskMib: (host.used.diskMib ?? 0) - a.diskMib, slots: host.used.slots - 1 });
    await appendLedger(tx, { at: now, event: "refund", org: a.org, allocation_id: a.id, owner: a.owner, host_id: a.hostId, vcpu: a.vcpu, memory_mib: a.memoryMib, disk_mib: a.diskMib, detail: cause, actor: ctx.actor });
  }
  await moveLocked(tx, a.id, a.state, t.state, now, t.reason);
  for (const e of t.effects) {
    if (e.kind !== "cleanup") continue;
    // The cleanup's durable intent: what to do with the volume, and a due row any coordinator picks up.
    await setKeepVolume(tx, a.id, e.keepVolume, now);
    await setDue(tx, "alloc_cleanup", a.id, now);
    await clearDue(tx, "alloc_launch", a.id);
    tx.afterCommit(() => ctx.kick?.());
  }
  return { ...a, state: t.state, stateSince: now, reason: t.reason };
}

export async function releaseAllocation(ctx: AllocCtx, who: Requester, rawId: string, keepVolume: boolean): Promise<AllocationRecord> {
  const id = parseId(rawId, "allocation id");
  const now = ctx.now();
  return ctx.store.transaction(async (tx) => {
    const a = await getAllocation(tx, id);
    if (!a || a.org !== who.org) throw new BerthError("not_found", `not_found: no allocation ${id} in this organisation`);
    if (!who.operator && a.owner !== who.principal) throw new BerthError("forbidden", `forbidden: allocation ${id} belongs to another owner; only it or an operator may release it`);
    return releaseIn(tx, ctx, a, who.operator && a.owner !== who.principal ? "operator" : "owner", keepVolume, now);
  }, { name: "alloc_release" });
}

/**
 * An operator ends a quarantine (`berth alloc resolve ID --keep-volume|--destroy`):
 * the choice is recorded and the cleanup is due at once, now sending the
 * agent a release with `resolve` — the agent then destroys a sandbox that
 * does not match its record instead of refusing, and proves nothing of it is
 * left. Slot and budget come back only when that is proven (the cleanup's
 * own last transaction); until then the allocation stays `quarantined`, its
 * reason naming the resolution under way. Only a quarantined allocation is
 * resolved; the same resolution again is answered as it is.
 */
export async function resolveAllocation(ctx: AllocCtx, who: Requester, rawId: string, volume: ResolveChoice | "host_gone"): Promise<AllocationRecord> {
  const id = parseId(rawId, "allocation id");
  const now = ctx.now();
  return ctx.store.transaction(async (tx) => {
    const a = await lockRequested(tx, who, id);
    if (a.state !== "quarantined" && !(volume === "host_gone" && a.state === "releasing")) {
      const hint = a.state === "released" ? "there is nothing left to resolve" : a.state === "releasing" ? "its cleanup is still under way; resolve it if it ends quarantined" : `release it first (berth alloc release ${id})`;
      throw new BerthError("conflict", `conflict: allocation ${id} is ${a.state}; only a quarantined allocation is resolved (${hint})`);
    }
    if (volume === "host_gone") return endOnGoneHost(tx, ctx, a, who, now);
    const launch = await getLaunch(tx, id);
    if (!launch) throw new BerthError("conflict", `conflict: allocation ${id} never launched; nothing is on a host to resolve`);
    if (launch.resolve && launch.resolve.volume !== volume) {
      throw new BerthError("conflict", `conflict: allocation ${id} is already being resolved with its volume ${launch.resolve.volume === "keep" ? "kept" : "destroyed"}; that choice stands`);
    }
    const reason = `quarantined; resolution by an operator (${who.principal}) under way, volume ${volume === "keep" ? "kept" : "destroyed"}: ${a.reason ?? ""}`.slice(0, 2000);
    await setResolve(tx, id, volume, who.principal, now);
    await moveLocked(tx, id, "quarantined", "quarantined", a.stateSince, reason);
    await setDue(tx, "alloc_cleanup", id, now);
    tx.afterCommit(() => ctx.kick?.());
    return { ...a, reason };
  }, { name: "alloc_resolve" });
}

/**
 * `--host-gone`: the allocation's host was withdrawn and an operator attested
 * it gone for good (`berth alloc standing H withdrawn --host-gone`, recorded
 * as the epoch it came with: checked to be the current one), so no cleanup
 * can ever be proven there. The reservation comes back now, in this
 * transaction (owner row locked, then the host's), recorded as the
 * operator's word in the ledger and the allocation's reason.
 */
async function endOnGoneHost(tx: Tx, ctx: AllocCtx, a: AllocationRecord, who: Requester, now: number): Promise<AllocationRecord> {
  const host = await lockHostAccount(tx, a.hostId);
  if (!host) throw new Error(`allocation ${a.id} has no host account ${a.hostId}`);
  // The operator's attestation under the current standing epoch, not an acknowledged withdrawal alone: an agent
  // that acknowledged lives, and what it runs of this allocation is cleaned up by the cleanup (still armed).
  if (host.standing !== "withdrawn" || host.goneEpoch !== host.standingEpoch) {
    const why = host.standing !== "withdrawn" ? "" : host.standingAcked < host.standingEpoch ? " but its withdrawal is not acknowledged and it is not attested gone" : " (acknowledged by its agent) but not attested gone";
    throw new BerthError("conflict", `conflict: host ${host.name} is ${host.standing}${why}; only on a host attested gone (berth alloc standing ${a.hostId} withdrawn --host-gone) is a cleanup ended unproven`);
  }
  const t = allocationTransition(a.state, { kind: "host_gone", by: who.principal });
  if (!t.ok) throw new BerthError("conflict", `conflict: allocation ${a.id}: ${t.refusal}`);
  const owner = await getOwnerLocked(tx, a);
  await setOwnerUsage(tx, a.org, a.owner, refund(owner.used, { name: a.size, vcpu: a.vcpu, memoryMib: a.memoryMib, diskMib: a.diskMib }), now);
  await setHostUsage(tx, a.hostId, { vcpu: host.used.vcpu - a.vcpu, memoryMib: host.used.memoryMib - a.memoryMib, diskMib: (host.used.diskMib ?? 0) - a.diskMib, slots: host.used.slots - 1 });
  await appendLedger(tx, { at: now, event: "refund", org: a.org, allocation_id: a.id, owner: a.owner, host_id: a.hostId, vcpu: a.vcpu, memory_mib: a.memoryMib, disk_mib: a.diskMib, detail: `host gone, attested by operator ${who.principal}: cleanup not proven`, actor: ctx.actor });
  await moveLocked(tx, a.id, a.state, t.state, now, t.reason);
  await clearDue(tx, "alloc_cleanup", a.id);
  await clearDue(tx, "alloc_launch", a.id);
  return { ...a, state: t.state, stateSince: now, reason: t.reason };
}

async function getOwnerLocked(tx: Tx, a: AllocationRecord) {
  const owner = await lockOwner(tx, a.org, a.owner);
  if (!owner) throw new Error(`allocation ${a.id} has no owner row for ${a.owner}`);
  return owner;
}

/** The reconciler's handler of an `alloc_expiry` due row: release at expiry (at equality), else re-arm. */
export async function onAllocationExpiryDue(tx: Tx, ctx: AllocCtx, id: string, now: number): Promise<void> {
  const a = await getAllocation(tx, id);
  if (!a || a.state === "released") return clearDue(tx, "alloc_expiry", id);
  if (!expired(a.expiresAt, now)) return setDue(tx, "alloc_expiry", id, a.expiresAt);
  await clearDue(tx, "alloc_expiry", id);
  await releaseIn(tx, ctx, a, "expiry", false, now);
}
