/** Reading allocations, and the placement dry run (`berth alloc plan`). */
import { BerthError } from "../../core/errors.js";
import { parseId } from "../../core/ids.js";
import { admit } from "../../core/allocation-budget.js";
import { lookupSize, sizeCatalog } from "../../core/allocation-sizes.js";
import { place, type PlacementDecision, type Strategy } from "../../core/allocation-placement.js";
import { getAllocation, listAllocations, type AllocationRecord } from "../../store/allocations.js";
import { getOwner } from "../../store/allocation-owners.js";
import { listHostAccounts } from "../../store/host-accounts.js";
import type { AllocCtx } from "./allocation-context.js";
import type { Requester } from "./allocation-release.js";
import { getLaunch } from "../../store/allocation-launches.js";
import { readHost } from "../../store/hosts.js";
import type { AllocReleaseResult } from "../../protocol/operations.js";

export async function showAllocation(ctx: AllocCtx, who: Requester, rawId: string): Promise<AllocationRecord> {
  const id = parseId(rawId, "allocation id");
  const a = await ctx.store.transaction((tx) => getAllocation(tx, id));
  // Another org's (or, for a member, another owner's) allocation is not found rather than forbidden: ids do not leak.
  if (!a || a.org !== who.org || (!who.operator && a.owner !== who.principal)) throw new BerthError("not_found", `not_found: no allocation ${id} in this organisation`);
  return a;
}

export async function listAllocationsFor(ctx: AllocCtx, who: Requester, all: boolean): Promise<AllocationRecord[]> {
  return ctx.store.transaction((tx) => listAllocations(tx, who.org, who.operator ? null : who.principal, all));
}

export interface PlanResult {
  size: { name: string; vcpu: number; memoryMib: number; diskMib: number };
  strategy: Strategy;
  decision: PlacementDecision;
  /** The caller's budget check: null if the caller is not an admitted owner. */
  budget: { admitted: true; fits: boolean; message: string | null } | null;
}

export async function planAllocation(ctx: AllocCtx, who: Requester, sizeName: string, strategy: Strategy): Promise<PlanResult> {
  const size = lookupSize(sizeCatalog(ctx.config.allocationSizes), sizeName);
  return ctx.store.transaction(async (tx) => {
    const hosts = await listHostAccounts(tx, who.org);
    const owner = await getOwner(tx, who.org, who.principal);
    const adm = owner ? admit(owner.budget, owner.used, size) : null;
    return {
      size: { ...size },
      strategy,
      decision: place(hosts, size, strategy),
      budget: adm ? { admitted: true as const, fits: adm.kind === "admit", message: adm.kind === "refuse" ? adm.message : null } : null,
    };
  });
}

/** What the launch and release proved, and how to reach a ready allocation (its host's gateway, pinned key). */
export interface AllocationDetail {
  launch: {
    fingerprint: string;
    keepVolume: boolean;
    readyAt: number | null;
    attempts: number;
    error: string | null;
    machineId: string | null;
    incarnation: string | null;
    runtime: string | null;
    enforcement: string | null;
    volume: { path: string; dev: string; ino: string; disk?: { enforced: boolean; how: string; sizeMib: number } | undefined } | null;
    /** The allocation whose kept volume this one attached (`alloc create --volume`); null: its own. */
    volumeFrom: string | null;
    release: AllocReleaseResult | null;
  } | null;
  access: { host: string; port: number; user: string; hostKey: string; hostKeyFingerprint: string } | null;
}

export async function allocationDetail(ctx: AllocCtx, a: AllocationRecord): Promise<AllocationDetail> {
  return ctx.store.transaction(async (tx) => {
    const l = await getLaunch(tx, a.id);
    const host = await readHost(tx, a.hostId);
    const launch = l
      ? {
          fingerprint: l.fingerprint, keepVolume: l.keepVolume, readyAt: l.readyAt, attempts: l.attempts, error: l.error,
          machineId: l.launch?.machineId ?? null, incarnation: l.launch?.incarnation ?? null, runtime: l.launch?.runtime ?? null,
          enforcement: l.launch?.enforcement ?? null, volume: l.launch?.volume ?? null, volumeFrom: l.volumeFrom, release: l.release,
        }
      : null;
    const access = a.state === "ready" && host && l?.launch
      ? { host: host.ssh_host, port: host.ssh_port, user: l.launch.machineId, hostKey: host.host_key, hostKeyFingerprint: host.fingerprint }
      : null;
    return { launch, access };
  });
}
