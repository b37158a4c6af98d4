/**
 * Placement: which host gets a new allocation. A pure decision over the
 * org's host capacity accounts and the size. A host is a candidate only if
 * it is `ready` (never draining, withdrawn or not ready) and has room in
 * every dimension (vCPU, memory, disk, slots; a host whose agent declared no
 * disk — one older than the disk dimension — is not checked for disk).
 * Among candidates:
 *   - `binpack` (default) picks the one left with the least free memory,
 *     then the least free vCPU, so big holes stay open for big sizes;
 *   - `spread` picks the one left with the most free memory, then the most
 *     free vCPU, then the fewest allocations.
 * Ties break on host id, so the same input always gives the same choice.
 * Every host gets a verdict naming why it does or does not fit — that is
 * what `berth alloc plan` prints.
 */
import { assertNever } from "./errors.js";
import { diskFigures, gib, type Size } from "./allocation-sizes.js";

export type HostStanding = "ready" | "draining" | "withdrawn" | "not_ready";
export const HOST_STANDINGS: readonly HostStanding[] = ["ready", "draining", "withdrawn", "not_ready"];

export type Strategy = "binpack" | "spread";

export interface Capacity {
  vcpu: number;
  memoryMib: number;
  /** null: not declared by the host's agent (older than the disk dimension); never null in `used`. */
  diskMib: number | null;
  slots: number;
}

export interface HostAccount {
  hostId: string;
  name: string;
  standing: HostStanding;
  capacity: Capacity;
  used: Capacity;
}

export type Verdict = { hostId: string; name: string; fits: true; freeAfter: Capacity } | { hostId: string; name: string; fits: false; reason: string };

export interface PlacementDecision {
  chosen: { hostId: string; name: string } | null;
  verdicts: Verdict[];
}

/** Why a host takes no new allocation, or null if its standing allows one. */
export function standingRefusal(s: HostStanding): string | null {
  switch (s) {
    case "ready":
      return null;
    case "draining":
      return "host is draining";
    case "withdrawn":
      return "host is withdrawn";
    case "not_ready":
      return "host is not ready";
    default:
      return assertNever(s, "host standing");
  }
}

export function verdict(h: HostAccount, size: Size): Verdict {
  const base = { hostId: h.hostId, name: h.name };
  const standing = standingRefusal(h.standing);
  if (standing) return { ...base, fits: false, reason: standing };
  const usedDisk = h.used.diskMib ?? 0;
  const free = { vcpu: h.capacity.vcpu - h.used.vcpu, memoryMib: h.capacity.memoryMib - h.used.memoryMib, diskMib: h.capacity.diskMib === null ? null : h.capacity.diskMib - usedDisk, slots: h.capacity.slots - h.used.slots };
  if (free.vcpu < size.vcpu) return { ...base, fits: false, reason: `vcpu: ${Math.max(free.vcpu, 0)}/${h.capacity.vcpu} free, ${size.name} needs ${size.vcpu}` };
  if (free.memoryMib < size.memoryMib) {
    return { ...base, fits: false, reason: `memory: ${gib(Math.max(free.memoryMib, 0))}/${gib(h.capacity.memoryMib)} GiB free, ${size.name} needs ${gib(size.memoryMib)}` };
  }
  if (free.diskMib !== null && h.capacity.diskMib !== null && free.diskMib < size.diskMib) {
    const f = diskFigures(Math.max(free.diskMib, 0), h.capacity.diskMib, size.diskMib);
    return { ...base, fits: false, reason: `disk: ${f.used}/${f.limit} ${f.unit} free, ${size.name} needs ${f.need}` };
  }
  if (free.slots < 1) return { ...base, fits: false, reason: `slots: 0/${h.capacity.slots} free` };
  return { ...base, fits: true, freeAfter: { vcpu: free.vcpu - size.vcpu, memoryMib: free.memoryMib - size.memoryMib, diskMib: free.diskMib === null ? null : free.diskMib - size.diskMib, slots: free.slots - 1 } };
}

function better(strategy: Strategy, a: Verdict & { fits: true }, b: Verdict & { fits: true }): boolean {
  const fa = a.freeAfter;
  const fb = b.freeAfter;
  switch (strategy) {
    case "binpack":
      if (fa.memoryMib !== fb.memoryMib) return fa.memoryMib < fb.memoryMib;
      if (fa.vcpu !== fb.vcpu) return fa.vcpu < fb.vcpu;
      break;
    case "spread":
      if (fa.memoryMib !== fb.memoryMib) return fa.memoryMib > fb.memoryMib;
      if (fa.vcpu !== fb.vcpu) return fa.vcpu > fb.vcpu;
      if (fa.slots !== fb.slots) return fa.slots > fb.slots;
      break;
    default:
      return assertNever(strategy, "strategy");
  }
  return a.hostId < b.hostId;
}

/** Chooses a host and gives every host's verdict (for `plan` and refusals); one pass (O(hosts)). */
export function place(hosts: readonly HostAccount[], size: Size, strategy: Strategy = "binpack", exclude: ReadonlySet<string> = new Set()): PlacementDecision {
  const verdicts: Verdict[] = [];
  let best: (Verdict & { fits: true }) | null = null;
  for (const h of hosts) {
    const v = exclude.has(h.hostId) ? { hostId: h.hostId, name: h.name, fits: false as const, reason: "changed while placing" } : verdict(h, size);
    verdicts.push(v);
    if (v.fits && (best === null || better(strategy, v, best))) best = v;
  }
  return { chosen: best ? { hostId: best.hostId, name: best.name } : null, verdicts };
}

/**
 * The same choice as `place` without building verdicts: the hot path of a
 * create, where only the chosen host matters (no allocation per host).
 */
export function choose(hosts: readonly HostAccount[], size: Size, strategy: Strategy = "binpack", exclude: ReadonlySet<string> = new Set()): HostAccount | null {
  let best: HostAccount | null = null;
  let bm = 0;
  let bv = 0;
  let bs = 0;
  const spread = strategy === "spread";
  for (const h of hosts) {
    if (h.standing !== "ready" || exclude.has(h.hostId)) continue;
    const m = h.capacity.memoryMib - h.used.memoryMib - size.memoryMib;
    const v = h.capacity.vcpu - h.used.vcpu - size.vcpu;
    const s = h.capacity.slots - h.used.slots - 1;
    if (m < 0 || v < 0 || s < 0) continue;
    if (h.capacity.diskMib !== null && h.capacity.diskMib - (h.used.diskMib ?? 0) < size.diskMib) continue;
    let wins: boolean;
    if (best === null) wins = true;
    else if (m !== bm) wins = spread ? m > bm : m < bm;
    else if (v !== bv) wins = spread ? v > bv : v < bv;
    else if (spread && s !== bs) wins = s > bs;
    else wins = h.hostId < best.hostId;
    if (wins) {
      best = h;
      bm = m;
      bv = v;
      bs = s;
    }
  }
  return best;
}

/** One line for a refusal: every host's reason, or that there are no hosts. */
export function noCapacityMessage(d: PlacementDecision, size: Size): string {
  if (d.verdicts.length === 0) return `no_capacity: no host is enrolled to place a ${size.name} allocation on; enroll a berth agent`;
  const why = d.verdicts.filter((v) => !v.fits).map((v) => `${v.name}: ${(v as { reason: string }).reason}`);
  return `no_capacity: no host has room for ${size.name} (${why.join("; ")}); see berth alloc plan --size ${size.name}`;
}
