/**
 * Allocations under `berth up`. Its admin token is the local owner: admitted
 * with a budget of everything the local agent offers (its vCPUs, memory and
 * disk, and as many allocations as it has slots), so that
 * `berth alloc create --size small` works from the state directory on a host
 * that has room. Done once per state directory: an owner already admitted
 * keeps the budget it has (an operator's `berth owner budget` is never undone
 * by the next `berth up`).
 *
 * When `berth up` stops, its allocations are released with their volumes
 * kept (as `docker compose down` keeps volumes): cleanup is proven and the
 * budget comes back while the agent still runs, and nothing is left `failed`
 * for the next start. The volumes' disk images are then unmounted so nothing
 * holds the state directory. The next `berth up` there lists them
 * (`berth volume ls`); `berth alloc create --size small --volume VOL` runs a
 * new allocation on one.
 */
import { existsSync, readdirSync } from "node:fs";
import { join } from "node:path";
import type { Api } from "../client/http.js";

export type LocalOwner = "admitted" | "kept" | "no_host";

export async function admitLocalOwner(api: Api, tokenId: string): Promise<LocalOwner> {
  const { owners } = await api.send("GET /v1/owners", {});
  if (owners.some((o) => o.owner === tokenId)) return "kept";
  const { hosts } = await api.send("GET /v1/hosts", {});
  const host = hosts.find((h) => h.capacity.slots > 0);
  if (!host) return "no_host";
  const { vcpu, memoryMib, diskMib, slots } = host.capacity;
  await api.send("POST /v1/owners/{tokenId}/admit", { tokenId }, { vcpu, memoryMib, ...(diskMib ? { diskMib } : {}), count: slots });
  return "admitted";
}

/**
 * Releases every allocation not yet released, keeping its volume, and waits
 * (until `deadline`, or until `force` aborts: a second Ctrl-C) for each to end released or quarantined; says what
 * happened to each and how to use the kept volumes.
 */
export async function releaseKeepingVolumes(api: Api, deadline: number, force: AbortSignal, say: (s: string) => void): Promise<void> {
  const { allocations } = await api.send("GET /v1/allocations", {});
  const live = allocations.filter((a) => a.state !== "released" && a.state !== "quarantined");
  if (live.length === 0) return;
  say(`releasing ${live.length} allocation(s), keeping their volumes`);
  for (const a of live) {
    if (a.state === "releasing" || force.aborted) continue;
    await api.send("POST /v1/allocations/{id}/release", { id: a.id }, { keepVolume: true }).catch((e: unknown) => say(`could not release ${a.id}: ${e instanceof Error ? e.message : String(e)}`));
  }
  const ended = new Map<string, string>();
  while (ended.size < live.length && Date.now() < deadline && !force.aborted) {
    for (const a of live) {
      if (ended.has(a.id)) continue;
      const now = await api.send("GET /v1/allocations/{id}", { id: a.id }).catch(() => null);
      if (now && (now.state === "released" || now.state === "quarantined")) ended.set(a.id, now.state);
    }
    if (ended.size < live.length) await new Promise((r) => setTimeout(r, 100));
  }
  const kept = live.filter((a) => ended.get(a.id) === "released").map((a) => a.id);
  if (kept.length > 0) say(`volume(s) kept: ${kept.join(", ")}; after the next \`berth up\` here: berth alloc create --size SIZE --volume VOL`);
  for (const a of live.filter((x) => ended.get(x.id) !== "released")) {
    say(`allocation ${a.id} is ${ended.get(a.id) ?? "still releasing"}: see berth alloc show ${a.id} after the next \`berth up\` here`);
  }
}

/** Unmounts every volume disk image of the agent under `agentDir` (after the agent ended); returns the failures. */
export async function unmountVolumeImages(agentDir: string): Promise<string[]> {
  const volumes = join(agentDir, "volumes");
  if (!existsSync(volumes)) return [];
  // Loaded only here: the agent's code stays out of every other command.
  const { unmountImage } = await import("../agent/volume-disk.js");
  const failed: string[] = [];
  for (const v of readdirSync(volumes)) {
    try {
      unmountImage(join(volumes, v, "data"));
    } catch (e) {
      failed.push(e instanceof Error ? e.message : String(e));
    }
  }
  return failed;
}
