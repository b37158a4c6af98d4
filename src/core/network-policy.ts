/**
 * Network policy of a pool's machines (docs/network.md). Pure: parsing,
 * canonical form, fingerprint, and the platform deny list.
 *
 *   none    — as before: gvisor machines have loopback only, process machines
 *             share the host's network (the process runtime isolates nothing).
 *   egress  — the machine gets its own network namespace; outbound IPv4 to the
 *             allow list only, on top of the always-on platform deny list;
 *             everything else is rejected (TCP reset / ICMP admin-prohibited).
 *
 * Allow entries (strings, canonicalised):
 *   CIDR or IPv4           every port, TCP and UDP          10.1.0.0/16, 203.0.113.7
 *   CIDR:PORT[-PORT]       those ports, TCP and UDP         203.0.113.0/24:443
 *   NAME:PORT[-PORT]       the name is resolved by the agent when it sets the
 *                          machine up and pinned (its addresses go into the
 *                          rules and into the machine's hosts file)   registry.npmjs.org:443
 * DNS resolvers (`dns`): IPv4 addresses the machine may query on port 53
 * (UDP and TCP); they are written to its resolv.conf. With none, the machine
 * has no resolver: only pinned names resolve.
 *
 * The fingerprint is a hash of the canonical policy (not of resolved
 * addresses): machines of one pool with one fingerprint are interchangeable.
 */
import { createHash } from "node:crypto";
import { BerthError } from "./errors.js";

export interface AllowEntry {
  /** Canonical text of the entry. */
  text: string;
  /** An IPv4 CIDR, or null for a name. */
  cidr: string | null;
  /** A DNS name (resolved and pinned at set-up), or null. */
  name: string | null;
  /** Inclusive port range; null: every port. */
  ports: [number, number] | null;
}

export type NetworkPolicy = { mode: "none" } | { mode: "egress"; allow: string[]; dns: string[] };

export const NO_NETWORK: NetworkPolicy = { mode: "none" };

/** Ranges no allow entry can open: link-local (cloud metadata 169.254.169.254), loopback, "this network", multicast, reserved, broadcast. */
export const HARD_DENY_CIDRS = ["169.254.0.0/16", "127.0.0.0/8", "0.0.0.0/8", "224.0.0.0/4", "240.0.0.0/4"] as const;
/** Private and shared ranges: denied unless an allow entry inside one of them opens it explicitly. */
export const PRIVATE_CIDRS = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "198.18.0.0/15"] as const;
/** Mail submission and relay: never, whatever the allow list says. */
export const SMTP_PORTS = [25, 465, 587] as const;
/** The cloud metadata address every probe checks. */
export const METADATA_ADDRESS = "169.254.169.254";

const MAX_ENTRIES = 64;

export function ipToInt(ip: string): number | null {
  const m = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/.exec(ip);
  if (!m) return null;
  const parts = m.slice(1).map(Number);
  if (parts.some((p) => p > 255)) return null;
  return ((parts[0]! << 24) >>> 0) + (parts[1]! << 16) + (parts[2]! << 8) + parts[3]!;
}

export function intToIp(n: number): string {
  return [n >>> 24, (n >>> 16) & 255, (n >>> 8) & 255, n & 255].join(".");
}

/** [first, last] address of an IPv4 CIDR (or a bare address, /32), or null when malformed. */
export function cidrRange(cidr: string): [number, number] | null {
  const [ip, bitsText] = cidr.split("/");
  const base = ipToInt(ip ?? "");
  const bits = bitsText === undefined ? 32 : /^\d{1,2}$/.test(bitsText) ? Number(bitsText) : NaN;
  if (base === null || !(bits >= 0 && bits <= 32)) return null;
  const size = 2 ** (32 - bits);
  const first = Math.floor(base / size) * size;
  return [first, first + size - 1];
}

/** Canonical CIDR text: the network address and the prefix length (a /32 stays a bare address). */
function canonicalCidr(cidr: string): string | null {
  const r = cidrRange(cidr);
  if (!r) return null;
  const bits = 32 - Math.log2(r[1] - r[0] + 1);
  return bits === 32 ? intToIp(r[0]) : `${intToIp(r[0])}/${bits}`;
}

export function inRange(ip: string, cidr: string): boolean {
  const n = ipToInt(ip);
  const r = cidrRange(cidr);
  return n !== null && r !== null && n >= r[0] && n <= r[1];
}

/** Whether CIDR `inner` lies wholly inside CIDR `outer`. */
export function cidrWithin(inner: string, outer: string): boolean {
  const a = cidrRange(inner);
  const b = cidrRange(outer);
  return a !== null && b !== null && a[0] >= b[0] && a[1] <= b[1];
}

const NAME_RE = /^(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$/;

function bad(entry: string, why: string): BerthError {
  return new BerthError("invalid_request", `invalid_request: network allow entry ${JSON.stringify(entry.slice(0, 80))} ${why}; use CIDR, CIDR:PORT, or NAME:PORT (e.g. 10.1.0.0/16, 203.0.113.0/24:443, registry.npmjs.org:443)`);
}

function parsePorts(entry: string, text: string): [number, number] {
  const m = /^(\d{1,5})(?:-(\d{1,5}))?$/.exec(text);
  const lo = Number(m?.[1]);
  const hi = m?.[2] === undefined ? lo : Number(m[2]);
  if (!m || lo < 1 || hi > 65535 || lo > hi) throw bad(entry, "has an invalid port (1-65535, or a range LOW-HIGH)");
  return [lo, hi];
}

/** One allow entry, parsed and canonicalised; throws invalid_request. */
export function parseAllowEntry(raw: string): AllowEntry {
  const entry = raw.trim();
  if (entry.length === 0 || entry.length > 300) throw bad(entry, "is empty or too long");
  const colon = entry.lastIndexOf(":");
  const hostPart = colon >= 0 ? entry.slice(0, colon) : entry;
  const ports = colon >= 0 ? parsePorts(entry, entry.slice(colon + 1)) : null;
  const portText = ports === null ? "" : ports[0] === ports[1] ? `:${ports[0]}` : `:${ports[0]}-${ports[1]}`;
  if (/^[\d./]+$/.test(hostPart)) {
    const cidr = canonicalCidr(hostPart);
    if (cidr === null) throw bad(entry, "is not a valid IPv4 address or CIDR");
    for (const hard of HARD_DENY_CIDRS) {
      if (cidrWithin(cidr, hard)) throw bad(entry, `lies in ${hard}, which the platform deny list always refuses`);
    }
    return { text: `${cidr}${portText}`, cidr, name: null, ports };
  }
  if (!NAME_RE.test(hostPart) || /^\d+$/.test(hostPart.split(".").pop() ?? "")) throw bad(entry, "is not a valid DNS name or IPv4 CIDR");
  if (ports === null) throw bad(entry, "names a host without a port (a name is pinned to its addresses on one port or range)");
  return { text: `${hostPart.toLowerCase()}${portText}`, cidr: null, name: hostPart.toLowerCase(), ports };
}

/** A policy from its parts (CLI flags, API body), canonical: entries sorted and unique. */
export function makePolicy(mode: "none" | "egress", allow: readonly string[] = [], dns: readonly string[] = []): NetworkPolicy {
  if (mode === "none") {
    if (allow.length > 0 || dns.length > 0) throw new BerthError("invalid_request", "invalid_request: --allow and --dns need --network egress (network none has no allow list)");
    return NO_NETWORK;
  }
  if (allow.length + dns.length > MAX_ENTRIES) throw new BerthError("invalid_request", `invalid_request: at most ${MAX_ENTRIES} allow entries and resolvers`);
  const entries = [...new Set(allow.map((a) => parseAllowEntry(a).text))].sort();
  const resolvers = [...new Set(dns.map((d) => {
    const ip = d.trim();
    if (ipToInt(ip) === null) throw new BerthError("invalid_request", `invalid_request: DNS resolver ${JSON.stringify(ip.slice(0, 60))} is not an IPv4 address`);
    if (HARD_DENY_CIDRS.some((c) => inRange(ip, c))) throw new BerthError("invalid_request", `invalid_request: DNS resolver ${ip} lies in a range the platform deny list always refuses`);
    return ip;
  }))].sort();
  return { mode: "egress", allow: entries, dns: resolvers };
}

/** Reads a stored or sent policy (JSON) back into canonical form; throws invalid_request. */
export function parsePolicy(v: unknown): NetworkPolicy {
  if (v === null || v === undefined) return NO_NETWORK;
  const o = v as { mode?: unknown; allow?: unknown; dns?: unknown };
  const strings = (x: unknown, what: string): string[] => {
    if (x === undefined) return [];
    if (!Array.isArray(x) || x.some((s) => typeof s !== "string")) throw new BerthError("invalid_request", `invalid_request: network.${what} must be a list of strings`);
    return x as string[];
  };
  if (o.mode !== "none" && o.mode !== "egress") throw new BerthError("invalid_request", "invalid_request: network.mode must be none or egress");
  return makePolicy(o.mode, strings(o.allow, "allow"), strings(o.dns, "dns"));
}

/** Stable short hash of the canonical policy: `np-` + 16 hex. `none` has the fingerprint "none". */
export function policyFingerprint(p: NetworkPolicy): string {
  if (p.mode === "none") return "none";
  const canonical = JSON.stringify({ v: 1, mode: p.mode, allow: p.allow, dns: p.dns });
  return "np-" + createHash("sha256").update(canonical).digest("hex").slice(0, 16);
}

/** Whether an allow entry inside a private range opens it explicitly (else private ranges stay denied). */
export function isPrivateAllow(e: AllowEntry): boolean {
  return e.cidr !== null && PRIVATE_CIDRS.some((p) => cidrWithin(e.cidr as string, p));
}

/** Whether the policy lets TCP to ip:port through (the deny list first). Used to choose probe targets. */
export function permitsTcp(p: NetworkPolicy, ip: string, port: number, resolved: Record<string, string[]> = {}, denied: readonly string[] = []): boolean {
  if (p.mode !== "egress" || ipToInt(ip) === null) return false;
  if (HARD_DENY_CIDRS.some((c) => inRange(ip, c)) || denied.some((c) => inRange(ip, c))) return false;
  if ((SMTP_PORTS as readonly number[]).includes(port)) return false;
  const entries = p.allow.map(parseAllowEntry);
  const portOk = (e: AllowEntry): boolean => e.ports === null || (port >= e.ports[0] && port <= e.ports[1]);
  const isPrivate = PRIVATE_CIDRS.some((c) => inRange(ip, c));
  for (const e of entries) {
    if (!portOk(e)) continue;
    if (e.cidr !== null && inRange(ip, e.cidr) && (!isPrivate || isPrivateAllow(e))) return true;
    // A name the operator wrote opens the addresses it was pinned to, private ones included.
    if (e.name !== null && (resolved[e.name] ?? []).includes(ip)) return true;
  }
  if (port === 53 && p.dns.includes(ip)) return true;
  return false;
}

/** The machine address range agents use unless started with another (`--network-range`). */
export const DEFAULT_MACHINE_RANGE = "10.213.0.0/16";

/**
 * An allow entry that lies wholly inside a range (the machine range): it
 * could open nothing, since the range is always refused, so it is refused
 * where it is written. An entry that merely contains the range (10.0.0.0/8,
 * 0.0.0.0/0) is accepted and opens everything else it names.
 */
export function allowOverlaps(p: NetworkPolicy, cidr: string): string | null {
  if (p.mode !== "egress") return null;
  for (const e of p.allow.map(parseAllowEntry)) if (e.cidr !== null && cidrWithin(e.cidr, cidr)) return e.text;
  return null;
}

/**
 * Why a policy cannot be written as it is (pool ensure), or null: an entry
 * the platform deny list always wins over opens nothing and would only
 * make the readiness probe or every provision fail. Names the entry and the rule.
 */
export function policyRefusal(p: NetworkPolicy, machineRange: string = DEFAULT_MACHINE_RANGE): string | null {
  if (p.mode !== "egress") return null;
  for (const e of p.allow.map(parseAllowEntry)) {
    if (e.ports !== null && [...Array(e.ports[1] - e.ports[0] + 1).keys()].every((i) => (SMTP_PORTS as readonly number[]).includes((e.ports as [number, number])[0] + i))) {
      return `invalid_request: network allow entry ${e.text} opens only SMTP (ports ${SMTP_PORTS.join(", ")}), which the platform deny list always refuses; remove it`;
    }
    if (e.cidr !== null && cidrWithin(e.cidr, machineRange)) {
      return `invalid_request: network allow entry ${e.text} lies in the machine range ${machineRange}, which the platform deny list always refuses (machines never reach each other); remove it`;
    }
  }
  return null;
}

/**
 * An allow entry that names exactly one of the hosts' own addresses (an IPv4
 * literal of an enrolled agent's URL or SSH address): the host is always
 * refused to its machines, so the entry opens nothing. An entry that merely
 * contains the address (a /24, 0.0.0.0/0) opens the rest and is accepted.
 */
export function hostAddressRefusal(p: NetworkPolicy, hostAddresses: readonly string[]): string | null {
  if (p.mode !== "egress") return null;
  for (const e of p.allow.map(parseAllowEntry)) {
    if (e.cidr === null) continue;
    for (const a of hostAddresses) {
      if (cidrRange(`${a}/32`) !== null && cidrWithin(e.cidr, `${a}/32`)) {
        return `invalid_request: network allow entry ${e.text} names the address of an enrolled host (${a}), which the platform deny list always refuses to machines; remove it`;
      }
    }
  }
  return null;
}
