/**
 * The size catalog of allocations. A size is an exact grant (vCPU, memory and
 * the disk of its workspace volume) the runtime is meant to enforce; the
 * catalog is operator-defined (`berth serve --alloc-size`), with a default of
 * `small` (2 vCPU / 4 GiB / 20 GiB disk) and `large` (4 vCPU / 8 GiB / 40 GiB).
 * Memory and disk are counted in MiB everywhere (so a test size can have a
 * disk of 64 MiB); messages show GiB.
 */
import { BerthError } from "./errors.js";

export interface Size {
  name: string;
  vcpu: number;
  memoryMib: number;
  /** The workspace volume's size. */
  diskMib: number;
}

export type SizeCatalog = ReadonlyMap<string, Size>;

export const DEFAULT_SIZES: readonly Size[] = [
  { name: "small", vcpu: 2, memoryMib: 4096, diskMib: 20 * 1024 },
  { name: "large", vcpu: 4, memoryMib: 8192, diskMib: 40 * 1024 },
];

const SIZE_NAME = /^[a-z][a-z0-9-]{0,31}$/;

/** Builds a catalog, refusing duplicate names, bad names and non-positive dimensions. */
export function sizeCatalog(sizes: readonly Size[] = DEFAULT_SIZES): SizeCatalog {
  const m = new Map<string, Size>();
  for (const s of sizes) {
    if (!SIZE_NAME.test(s.name)) throw new BerthError("invalid_request", `invalid_request: size name ${JSON.stringify(s.name)} must be 1 to 32 of a-z, 0-9, '-' starting with a letter`);
    if (!Number.isInteger(s.vcpu) || s.vcpu < 1) throw new BerthError("invalid_request", `invalid_request: size ${s.name} needs a whole number of vCPU, at least 1`);
    if (!Number.isInteger(s.memoryMib) || s.memoryMib < 64) throw new BerthError("invalid_request", `invalid_request: size ${s.name} needs at least 64 MiB of memory`);
    // An ext4 image below 32 MiB has too little room left after its own metadata to be a workspace.
    if (!Number.isInteger(s.diskMib) || s.diskMib < 32) throw new BerthError("invalid_request", `invalid_request: size ${s.name} needs at least 32 MiB of disk`);
    if (m.has(s.name)) throw new BerthError("invalid_request", `invalid_request: size ${s.name} is defined twice`);
    m.set(s.name, { ...s });
  }
  return m;
}

export function lookupSize(catalog: SizeCatalog, name: string): Size {
  const s = catalog.get(name);
  if (!s) {
    const known = [...catalog.keys()].join(", ");
    throw new BerthError("invalid_request", `invalid_request: unknown size ${JSON.stringify(name.length > 40 ? name.slice(0, 40) + "…" : name)}; known sizes: ${known}`);
  }
  return s;
}

/** "4", "0.5", "12.3" — GiB from MiB, at most one decimal, no trailing zero. */
export function gib(mib: number): string {
  const v = Math.round((mib / 1024) * 10) / 10;
  return Number.isInteger(v) ? String(v) : v.toFixed(1);
}

/**
 * A size as an operator writes it for `berth serve --alloc-size`:
 * `NAME=VCPU,MEMORY,DISK`, e.g. `small=2,4G,20G` or `tiny=1,512M,64M`
 * (units as parseBytes reads them; a plain number is MiB).
 */
export function parseSizeSpec(text: string, parseMib: (t: string, what: string) => number): Size {
  const m = /^([^=]+)=([^,]+),([^,]+),([^,]+)$/.exec(text.trim());
  if (!m) throw new BerthError("invalid_request", `invalid_request: size ${JSON.stringify(text)} is not NAME=VCPU,MEMORY,DISK (e.g. small=2,4G,20G)`);
  const vcpu = Number(m[2]);
  return { name: m[1]!, vcpu, memoryMib: parseMib(m[3]!, `memory of size ${m[1]}`), diskMib: parseMib(m[4]!, `disk of size ${m[1]}`) };
}

/** "used/limit GiB" for disk figures, or in MiB when any is below 1 GiB (a test size): "30/30 GiB", "64/100 MiB". */
export function diskFigures(used: number, limit: number, need: number): { used: string; limit: string; need: string; unit: "GiB" | "MiB" } {
  if (Math.min(limit, need) >= 1024) return { used: gib(used), limit: gib(limit), need: gib(need), unit: "GiB" };
  return { used: String(used), limit: String(limit), need: String(need), unit: "MiB" };
}
