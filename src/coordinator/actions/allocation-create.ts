/**
 * Creating an allocation: admission against the owner's budget, placement on
 * a host, and the reservation of both, in one transaction.
 *
 * The transaction locks exactly two rows: the owner's budget row first, then
 * the chosen host's account row (the same order as release, so the two never
 * deadlock). Placement reads the org's host accounts without locks, locks the
 * chosen one, and decides again on the locked row; if the host changed
 * meanwhile (filled, withdrawn) it is excluded and placement runs again.
 * A host withdrawn after this commit never launches the allocation: the
 * launch re-checks the standing (core/allocation.ts `launchGate`).
 *
 * Create is idempotent by id: the same id with the same request (owner,
 * size, duration, strategy) returns the allocation already made, without
 * charging again; another request under that id is `conflict`. The id is
 * checked by the one id constructor before anything is read or written.
 *
 * With `volume` (a kept volume: allocation-volume.ts) the volume's host is
 * the only candidate, and the attachment is recorded with the launch and
 * audited (`volume_attached`) in the same transaction.
 */
import { createHash } from "node:crypto";
import { BerthError } from "../../core/errors.js";
import { parseId } from "../../core/ids.js";
import { admit } from "../../core/allocation-budget.js";
import { lookupSize, sizeCatalog } from "../../core/allocation-sizes.js";
import { choose, noCapacityMessage, place, verdict, type Strategy } from "../../core/allocation-placement.js";
import { expiryFor } from "../../core/allocation.js";
import type { AllocCtx } from "./allocation-context.js";
import { lockOwner, setOwnerUsage } from "../../store/allocation-owners.js";
import { candidateHostAccounts, listHostAccounts, lockHostAccount, setHostUsage } from "../../store/host-accounts.js";
import { getAllocation, insertAllocation, type AllocationRecord } from "../../store/allocations.js";
import { appendLedger } from "../../store/allocation-ledger.js";
import { setDue } from "../../store/due.js";
import { insertLaunch } from "../../store/allocation-launches.js";
import { audit } from "../../store/audit.js";
import { allocationMachineId } from "../../core/allocation-access.js";
import { keptVolumeIn, volumeHostIn } from "./allocation-volume.js";

/** How many best candidates the database returns per placement attempt. */
const CANDIDATES = 8;

export interface CreateInput {
  id: string;
  size: string;
  /** Requested lifetime; null = the policy maximum. */
  durationMs: number | null;
  strategy: Strategy;
  /**
   * The allocation's OpenSSH public key (the client keeps the private half).
   * With a key the allocation is launched on its host; without one it is
   * placed and charged only (no sandbox, no access).
   */
  publicKey?: { line: string; fingerprint: string } | null;
  /** A kept volume to run on (the released allocation it belongs to); needs a public key (a launch). */
  volume?: string | null;
}

export interface CreateResult {
  allocation: AllocationRecord;
  /** false when an earlier create with the same id and request made it. */
  created: boolean;
}

/** The fingerprint of a create request, to tell a retry from a different request under the same id. */
export function requestHash(owner: string, input: Omit<CreateInput, "id">): string {
  const key = input.publicKey ? [input.publicKey.fingerprint] : [];
  // Only when one is attached, so the hash of every other request is unchanged.
  const volume = input.volume ? [`volume:${input.volume}`] : [];
  return createHash("sha256").update(JSON.stringify(["berth-alloc-v1", owner, input.size, input.durationMs, input.strategy, ...key, ...volume])).digest("hex");
}

export async function createAllocation(ctx: AllocCtx, org: string, owner: string, input: CreateInput): Promise<CreateResult> {
  const id = parseId(input.id, "allocation id");
  const size = lookupSize(sizeCatalog(ctx.config.allocationSizes), input.size);
  const now = ctx.now();
  const expiry = expiryFor(now, input.durationMs, ctx.config.maxAllocationMs);
  if (!expiry.ok) throw new BerthError("invalid_request", expiry.message);
  const volumeId = input.volume ? parseId(input.volume, "volume") : null;
  if (volumeId && !input.publicKey) throw new BerthError("invalid_request", "invalid_request: a volume is attached only to an allocation that launches (with a public key; not --no-key)");
  const hash = requestHash(owner, { size: size.name, durationMs: input.durationMs, strategy: input.strategy, publicKey: input.publicKey ?? null, volume: volumeId });
  for (let attempt = 0; ; attempt++) {
    const r = await ctx.store.transaction(async (tx): Promise<CreateResult | "raced"> => {
      const o = await lockOwner(tx, org, owner);
      const existing = await getAllocation(tx, id);
      if (existing) {
        if (existing.org === org && existing.owner === owner && existing.requestHash === hash) return { allocation: existing, created: false };
        throw new BerthError("conflict", `conflict: allocation id ${id} is already taken by a different request; retry with the same request or choose another id`);
      }
      if (!o) throw new BerthError("not_admitted", `not_admitted: ${owner} is not admitted to allocate in this organisation; an operator runs berth owner admit ${owner}`);
      const adm = admit(o.budget, o.used, size);
      if (adm.kind === "refuse") throw new BerthError("budget_exhausted", adm.message);
      const vol = volumeId ? await keptVolumeIn(tx, org, owner, volumeId) : null;
      const exclude = new Set<string>();
      for (;;) {
        // The database narrows to the best few candidates; `choose` decides among them. A kept volume's host is the only one.
        const chosen = vol ? await volumeHostIn(tx, vol, size) : choose(await candidateHostAccounts(tx, org, size, input.strategy, exclude.size + CANDIDATES), size, input.strategy, exclude);
        if (!chosen) {
          // Every host's reason, for the refusal (the slow path reads them all).
          throw new BerthError("no_capacity", noCapacityMessage(place(await listHostAccounts(tx, org), size, input.strategy), size));
        }
        const host = await lockHostAccount(tx, chosen.hostId);
        const v = host ? verdict(host, size) : null;
        if (!host || !v || !v.fits) {
          // Changed between the read and the lock (filled, withdrawn): place again without it.
          exclude.add(chosen.hostId);
          continue;
        }
        const allocation: AllocationRecord = {
          id,
          org,
          owner,
          size: size.name,
          vcpu: size.vcpu,
          memoryMib: size.memoryMib,
          diskMib: size.diskMib,
          requestHash: hash,
          state: "placed",
          hostId: host.hostId,
          plan: { hostId: host.hostId, hostName: host.name, strategy: input.strategy, size: size.name, vcpu: size.vcpu, memoryMib: size.memoryMib, diskMib: size.diskMib, placedAt: now },
          createdAt: now,
          expiresAt: expiry.expiresAt,
          stateSince: now,
          reason: null,
        };
        // Another owner took this id after our read: start over (the re-read then answers conflict).
        if (!(await insertAllocation(tx, allocation))) return "raced";
        await setOwnerUsage(tx, org, owner, adm.after, now);
        await setHostUsage(tx, host.hostId, { vcpu: host.used.vcpu + size.vcpu, memoryMib: host.used.memoryMib + size.memoryMib, diskMib: (host.used.diskMib ?? 0) + size.diskMib, slots: host.used.slots + 1 });
        await appendLedger(tx, { at: now, event: "reserve", org, allocation_id: id, owner, host_id: host.hostId, vcpu: size.vcpu, memory_mib: size.memoryMib, disk_mib: size.diskMib, detail: size.name, actor: ctx.actor });
        await setDue(tx, "alloc_expiry", id, expiry.expiresAt);
        if (input.publicKey) {
          // The launch's durable inputs and its due row, in the reserving transaction: any coordinator launches it.
          await insertLaunch(tx, id, input.publicKey.line, input.publicKey.fingerprint, now, vol?.id ?? null);
          // In the volume's trail (its name is its allocation's), as `volume rm` and `volume reset` are.
          if (vol) await audit(tx, { at: now, machineId: allocationMachineId(vol.id), subject: owner, event: "volume_attached", from: "kept", to: "attached", generation: 0, actor: ctx.actor, detail: `to allocation ${id} on host ${host.hostId}` });
          await setDue(tx, "alloc_launch", id, now);
          tx.afterCommit(() => ctx.kick?.());
        }
        return { allocation, created: true };
      }
    }, { name: "alloc_create" }).catch((e: unknown) => {
      if (e instanceof BerthError && (e.code === "budget_exhausted" || e.code === "no_capacity" || e.code === "not_admitted")) ctx.onRefusal?.(e.code);
      throw e;
    });
    if (r !== "raced") return r;
    if (attempt >= 2) throw new BerthError("store_busy", `store_busy: allocation id ${id} kept being taken concurrently; try again`);
  }
}
