/**
 * Attaching a kept volume to a new allocation (`berth alloc create --volume
 * VOL`). A volume is named by the allocation it belongs to: VOL is a
 * released allocation of the same owner whose release kept its volume
 * (`--keep-volume`, or `alloc resolve --keep-volume`) and that no other
 * allocation attached since. The volume's host decides placement: the new
 * allocation goes there or nowhere (no other host has the directory).
 *
 * The checks run inside the create's transaction, under the owner's row
 * lock (the volume's owner is the creating owner, so two creates racing for
 * one volume take the same lock: the second sees the first's launch row and
 * is refused). Before that transaction the route asks the volume's agent to
 * verify it (`precheckVolume`), so a damaged or removed volume is refused
 * with nothing created; the agent checks again where it attaches it (the
 * record moves only if it is there, kept, not held and sound:
 * src/agent/volumes.ts `attach`). From then on the volume is the new
 * allocation's: `--volume` names that allocation next time.
 */
import { BerthError } from "../../core/errors.js";
import { parseId } from "../../core/ids.js";
import { gib, lookupSize, sizeCatalog, type Size } from "../../core/allocation-sizes.js";
import { verdict, type HostAccount } from "../../core/allocation-placement.js";
import type { Tx } from "../../store/store.js";
import { getAllocation } from "../../store/allocations.js";
import { attachmentsOf, getLaunch } from "../../store/allocation-launches.js";
import { lockHostAccount } from "../../store/host-accounts.js";
import type { AllocationAgent } from "../allocation-agent.js";
import type { AllocCtx } from "./allocation-context.js";

export interface KeptVolume {
  /** The allocation the volume belongs to (its name). */
  id: string;
  hostId: string;
  /** The disk its image was made with: that of the allocation that first made it (attachments keep it); 0: none counted. */
  diskMib: number;
}

/** The kept volume `raw` of `owner`, or a refusal naming why it cannot be attached. */
export async function keptVolumeIn(tx: Tx, org: string, owner: string, raw: string): Promise<KeptVolume> {
  const id = parseId(raw, "volume");
  const a = await getAllocation(tx, id);
  // Another owner's volume is not found rather than forbidden: ids do not leak.
  if (!a || a.org !== org || a.owner !== owner) throw new BerthError("not_found", `not_found: no volume ${id} of owner ${owner} in this organisation (a volume is named by its allocation: berth volume ls)`);
  if (a.state !== "released") {
    const how = a.state === "quarantined" ? `an operator ends the quarantine first (berth alloc resolve ${id} --keep-volume)` : `release it first (berth alloc release ${id} --keep-volume)`;
    throw new BerthError("conflict", `conflict: volume ${id} is attached to allocation ${id}, which is ${a.state}; ${how}`);
  }
  const l = await getLaunch(tx, id);
  if (l?.release?.volume !== "kept") {
    const why = !l?.launch ? "it never launched" : l.release?.volume === "wiped" ? "its volume was wiped at its release" : "it kept no volume";
    throw new BerthError("not_found", `not_found: allocation ${id} has no kept volume (${why})`);
  }
  for (const other of await attachmentsOf(tx, id)) {
    const b = await getAllocation(tx, other);
    if (!b) continue;
    if (b.state !== "released") throw new BerthError("conflict", `conflict: volume ${id} is attached to allocation ${other} (${b.state})`);
    // A released allocation whose release found no volume of its own never took this one: it is still free.
    const outcome = (await getLaunch(tx, other))?.release?.volume ?? "none";
    if (outcome === "kept") throw new BerthError("conflict", `conflict: volume ${id} was attached to allocation ${other}, which kept it: it is named ${other} now (--volume ${other})`);
    if (outcome === "wiped") throw new BerthError("not_found", `not_found: volume ${id} was attached to allocation ${other} and wiped at its release`);
  }
  // The image keeps the size it was made with: follow the attachments back to the allocation that made it.
  let origin = a;
  for (let from = l.volumeFrom, hops = 0; from !== null && hops < 1000; hops++) {
    const prev = await getAllocation(tx, from);
    if (!prev) break;
    origin = prev;
    from = (await getLaunch(tx, from))?.volumeFrom ?? null;
  }
  return { id, hostId: a.hostId, diskMib: origin.diskMib };
}

/** The volume's host, locked, if it can take `size` now; else a refusal naming why (gone, not ready, full). */
export async function volumeHostIn(tx: Tx, vol: KeptVolume, size: Size): Promise<HostAccount> {
  if (vol.diskMib > 0 && size.diskMib < vol.diskMib) {
    throw new BerthError(
      "conflict",
      `conflict: volume ${vol.id} has a disk of ${diskText(vol.diskMib)}; a ${size.name} (${diskText(size.diskMib)}) cannot take it; it is not attached; create with a size of at least ${diskText(vol.diskMib)} of disk (berth alloc sizes)`,
    );
  }
  const host = await lockHostAccount(tx, vol.hostId);
  if (!host) throw new BerthError("no_capacity", `no_capacity: volume ${vol.id} is on host ${vol.hostId}, which is gone; a volume is attached only on its own host`);
  const v = verdict(host, size);
  if (!v.fits) throw new BerthError("no_capacity", `no_capacity: volume ${vol.id} is on host ${host.name} (${host.hostId}), which cannot take a ${size.name} now: ${v.reason}; a volume is attached only on its own host`);
  return host;
}

/**
 * Before the create's transaction: the same checks (read only), then the
 * volume's agent verifies it (record, identity, marker), so a damaged or
 * removed volume is refused with nothing created. A create whose id exists
 * already is left to createAllocation (the same request is answered as it is).
 */
export async function precheckVolume(ctx: AllocCtx, agent: AllocationAgent, org: string, owner: string, id: string, sizeName: string, raw: string): Promise<void> {
  const size = lookupSize(sizeCatalog(ctx.config.allocationSizes), sizeName);
  const vol = await ctx.store.transaction(async (tx) => {
    if (await getAllocation(tx, parseId(id, "allocation id"))) return null;
    const v = await keptVolumeIn(tx, org, owner, raw);
    await volumeHostIn(tx, v, size);
    return v;
  }, { name: "alloc_volume_precheck" });
  if (!vol) return;
  const c = await agent.passthrough(vol.hostId, "POST /v1/agent/volumes/{allocation}/verify", { allocation: vol.id });
  if (c.ok) return;
  if (c.state === "clean") throw new BerthError("not_found", `not_found: volume ${vol.id} was removed from its host`);
  throw new BerthError("conflict", `conflict: volume ${vol.id} failed verification on its host (${c.problems.join("; ")}); it is not attached; an operator must inspect it (berth volume verify ${vol.id})`);
}

function diskText(mib: number): string {
  return mib < 1024 ? `${mib} MiB` : `${gib(mib)} GiB`;
}
