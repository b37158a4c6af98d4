/**
 * Machine networks: one network namespace per machine, joined to the host by
 * a veth pair with a /30 from the machine range (10.213.0.0/16 by default),
 * and one nftables table in the host's root namespace that enforces the
 * machine's policy (ruleset.ts). Only `egress` machines get one; `none`
 * machines stay as they were.
 *
 * Durable order (seed FR-16's helper rule, applied to the namespace, veth and table):
 *   set up:   record intent (names, policy) -> lease an address slot (host-wide,
 *             O_EXCL file) -> record slot -> namespace -> veth -> guest addresses ->
 *             nftables table -> host address, forwarding, link up (rules are in
 *             place before a packet can pass) -> hosts/resolv.conf -> record the
 *             exact identity (namespace inode, host ifindex, table handle): `up`.
 *   tear down: record `releasing` -> host veth (cuts the machine off) -> table ->
 *             namespace -> files -> lease -> delete the record. Each object is
 *             removed only if it is exactly the recorded one (inode, ifindex,
 *             handle); a same-named object with another identity is refused.
 * Names derive from the agent's state directory and the machine id, so two
 * agents on one host never share one, and a restarted agent finds what its
 * previous process left (`sweep`).
 */
import { closeSync, existsSync, mkdirSync, openSync, readdirSync, readFileSync, rmSync, unlinkSync, writeFileSync, writeSync } from "node:fs";
import { lookup } from "node:dns/promises";
import { createHash } from "node:crypto";
import { createServer, type Server } from "node:net";
import { join, resolve as resolvePath } from "node:path";
import { BerthError } from "../../core/errors.js";
import { cidrRange, intToIp, parseAllowEntry, policyFingerprint, allowOverlaps, DEFAULT_MACHINE_RANGE, type NetworkPolicy } from "../../core/network-policy.js";
import { linesDiff, type ReadinessEvidence, type RulesWitness } from "../../core/network-evidence.js";
import type { AgentLog } from "../log.js";
import { errorMessage } from "../log.js";
import type { Runtime } from "../runtime/types.js";
import { KeyedLock } from "../keyed-lock.js";
import { cmd, ifindex, listLinks, listNetns, listTables, must, netnsInode } from "./host.js";
import { machineRuleset } from "./ruleset.js";
import type { NetRecord, NetworkTable } from "../store/networks.js";
import { checksFromSteps, evidenceOf, probePlan, runInside, type ProbeSettings } from "./probe.js";
import { NftSession } from "./nft-session.js";

export { DEFAULT_MACHINE_RANGE };
export const DEFAULT_LEASE_DIR = "/run/berth/net-leases";

export interface NetworkOptions {
  /** Machine address range (a /30 per machine). */
  range?: string;
  /** Host-wide directory of address-slot leases (shared by every agent on the host). */
  leaseDir?: string;
  /** Resolves an allow entry's name to IPv4 addresses (default: the host's resolver). */
  resolve?: (name: string) => Promise<string[]>;
  probe?: ProbeSettings;
  /** Where /etc/netns/<ns>/{hosts,resolv.conf} live (iproute2's convention). */
  etcNetns?: string;
}

export interface NetworkDeps {
  /** The machine network records (the agent's store). */
  records: NetworkTable;
  stateDir: string;
  log: AgentLog;
  now: () => number;
  /** The agent's own listeners (API, SSH gateway): bound address and port, refused from inside and probed. */
  agentPorts: () => Array<{ host: string; port: number; why: string }>;
  /** The coordinator's address:port pairs, refused from inside and probed. */
  coordinator: () => Array<{ ip: string; port: number }>;
}

export interface SweepReport {
  records: number;
  netns: number;
  links: number;
  tables: number;
  leases: number;
}

/** The outcome of comparing a machine's live rules with the recorded ones. */
/** First uid of machines' own uids (process runtime under a policy); far above any account a host has. */
export const MACHINE_UID_BASE = 1_000_000_000;

export type RulesVerdict =
  | { ok: true; digest: string; evidenceAt: number | null }
  | { ok: false; why: string; diff: string[] };

export interface NetworkCounters {
  setUp: number;
  tornDown: number;
  probes: { pass: number; fail: number };
  /** Comparisons of live rules with the recorded ones (lend checks, returns, the periodic check, recovery). */
  checks: { match: number; mismatch: number };
  stale: SweepReport;
}

function digestOf(lines: readonly string[]): string {
  return "sha256:" + createHash("sha256").update(lines.join("\n")).digest("hex");
}

/** The refusal of a machine whose rules are not the recorded ones: what changed, for the audit timeline. */
export function tampered(machineId: string, v: Extract<RulesVerdict, { ok: false }>): BerthError {
  return new BerthError(
    "network_tampered",
    `network_tampered: the network rules of machine ${machineId} are not the ones recorded with its evidence: ${v.why}${v.diff.length > 0 ? `; diff: ${v.diff.join(" | ")}` : ""}; the machine is not lent again (quarantine and destroy it)`,
  );
}

function hex(s: string, n: number): string {
  return createHash("sha256").update(s).digest("hex").slice(0, n);
}

export class MachineNetworks {
  readonly store: NetworkTable;
  readonly tag: string;
  readonly range: string;
  readonly counters: NetworkCounters = { setUp: 0, tornDown: 0, probes: { pass: 0, fail: 0 }, checks: { match: 0, mismatch: 0 }, stale: { records: 0, netns: 0, links: 0, tables: 0, leases: 0 } };
  readonly #deps: NetworkDeps;
  readonly #opts: NetworkOptions;
  readonly #stateDir: string;
  readonly #leaseDir: string;
  readonly #etc: string;
  readonly #rangeFirst: number;
  readonly #slots: number;
  readonly #lock = new KeyedLock();
  readonly #nft = new NftSession();
  /** The lend-time check's own reader: a lend never waits behind a probe's, a reload's or the periodic sweep's reads of other machines. */
  readonly #lendNft = new NftSession();
  #canary: Promise<{ server: Server; port: number }> | null = null;

  constructor(deps: NetworkDeps, opts: NetworkOptions = {}) {
    this.#deps = deps;
    this.#opts = opts;
    this.store = deps.records;
    this.#stateDir = resolvePath(deps.stateDir);
    this.tag = hex(this.#stateDir, 4);
    this.range = opts.range ?? DEFAULT_MACHINE_RANGE;
    const r = cidrRange(this.range);
    if (!r || r[1] - r[0] + 1 < 4) throw new BerthError("invalid_request", `invalid_request: machine network range ${this.range} is not an IPv4 CIDR of /30 or larger`);
    this.#rangeFirst = r[0];
    this.#slots = (r[1] - r[0] + 1) / 4;
    this.#leaseDir = opts.leaseDir ?? DEFAULT_LEASE_DIR;
    this.#etc = opts.etcNetns ?? "/etc/netns";
  }

  /** The kernel names of a machine's objects. */
  names(machineId: string): { netns: string; hostIf: string; table: string } {
    const m = hex(`${this.#stateDir}\0${machineId}`, 8);
    return { netns: `berth-${this.tag}-${m}`, hostIf: `bm${this.tag}${m}`, table: `berth_${this.tag}_${m}` };
  }

  /**
   * The machine's own uid (and gid) on this host: MACHINE_UID_BASE + the
   * first address of its /30 divided by 4. Unique among live machine networks
   * of the host: the slot lease is host-wide and ranges of agents on one host
   * cannot overlap (their routes would). No passwd entry; the process runtime
   * runs the machine's commands as it.
   */
  machineUid(slot: number): number {
    return MACHINE_UID_BASE + Math.floor((this.#rangeFirst + slot * 4) / 4);
  }

  addresses(slot: number): { host: string; guest: string } {
    const base = this.#rangeFirst + slot * 4;
    return { host: intToIp(base + 1), guest: intToIp(base + 2) };
  }

  get(machineId: string): NetRecord | null {
    return this.store.get(machineId);
  }

  /** Sets up (or finds, exactly as recorded) the machine's network. Resolves to the namespace name. */
  setUp(machineId: string, policy: NetworkPolicy): Promise<NetRecord> {
    return this.#lock.run(machineId, () => this.#setUp(machineId, policy));
  }

  async #setUp(machineId: string, policy: NetworkPolicy): Promise<NetRecord> {
    if (policy.mode !== "egress") throw new Error("setUp needs an egress policy");
    const overlap = allowOverlaps(policy, this.range);
    if (overlap) throw new BerthError("invalid_request", `invalid_request: allow entry ${overlap} lies in the machine range ${this.range} of this host, which is always refused (machines never reach each other)`);
    const fingerprint = policyFingerprint(policy);
    const now = this.#deps.now();
    let rec = this.store.get(machineId);
    if (rec && rec.fingerprint !== fingerprint) {
      throw new BerthError("conflict", `conflict: machine ${machineId} was set up for network policy ${rec.fingerprint}, not ${fingerprint}; a policy change rotates machines, it never changes a live one`);
    }
    if (rec && rec.state === "up" && this.#matches(rec)) return rec;
    if (rec && rec.state === "releasing") throw new BerthError("conflict", `conflict: the network of machine ${machineId} is being removed`);
    const names = this.names(machineId);
    if (!rec) {
      rec = {
        machineId, state: "intent", policy, fingerprint, slot: null, ...names, netnsInode: null, hostIfindex: null, nftHandle: null,
        resolved: {}, evidence: null, rules: null, createdAt: now, updatedAt: now,
      };
      this.store.put(rec); // intent, before anything exists
    }
    if (rec.slot === null) {
      rec = { ...rec, slot: this.#lease(machineId), updatedAt: this.#deps.now() };
      this.store.put(rec);
    }
    const { host, guest } = this.addresses(rec.slot as number);
    const resolved = await this.#resolveNames(policy);

    if (netnsInode(names.netns) === null) await must("ip", ["netns", "add", names.netns], `creating network namespace ${names.netns}`);
    if (ifindex(names.hostIf) !== null) await must("ip", ["link", "del", names.hostIf], `removing a half-made veth ${names.hostIf}`);
    await must("ip", ["link", "add", names.hostIf, "type", "veth", "peer", "name", "eth0", "netns", names.netns], `creating veth ${names.hostIf}`);
    await must("ip", ["netns", "exec", names.netns, "sh", "-c", "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6; echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6"], "disabling IPv6 in the machine namespace");
    await must("ip", ["-n", names.netns, "-batch", "-"], `configuring namespace ${names.netns}`,
      `addr add ${guest}/30 dev eth0\nlink set lo up\nlink set eth0 up\nroute add default via ${host}\n`);
    await must("nft", ["-f", "-"], `loading nftables table ${names.table}`, this.#ruleset(rec, guest, resolved));
    writeFileSync(`/proc/sys/net/ipv4/conf/${names.hostIf}/forwarding`, "1");
    await must("ip", ["-batch", "-"], `configuring veth ${names.hostIf}`, `addr add ${host}/30 dev ${names.hostIf}\nlink set ${names.hostIf} up\n`);
    this.#writeFiles(names.netns, policy, resolved);

    const handle = (await listTables()).get(names.table) ?? null;
    const up: NetRecord = {
      ...rec, state: "up", resolved, netnsInode: netnsInode(names.netns), hostIfindex: ifindex(names.hostIf), nftHandle: handle, updatedAt: this.#deps.now(),
      rules: await this.#readBack(names.table, names.netns),
    };
    if (up.netnsInode === null || up.hostIfindex === null || up.nftHandle === null) {
      throw new BerthError("operation_failed", `operation_failed: the network of machine ${machineId} is not complete after set-up`);
    }
    this.store.put(up);
    this.counters.setUp++;
    return up;
  }

  #ruleset(rec: NetRecord, guest: string, resolved: Record<string, string[]>): string {
    return machineRuleset({
      table: rec.table, hostIf: rec.hostIf, guestIp: guest, policy: rec.policy, resolved, machineRange: this.range,
      denyServices: this.#deps.coordinator(),
    });
  }

  #matches(rec: NetRecord): boolean {
    return rec.netnsInode !== null && netnsInode(rec.netns) === rec.netnsInode && ifindex(rec.hostIf) === rec.hostIfindex;
  }

  /** Whether the machine's namespace and veth are exactly the recorded ones (recovery). */
  intact(machineId: string): boolean | null {
    const rec = this.store.get(machineId);
    if (!rec) return null;
    return rec.state === "up" && this.#matches(rec);
  }

  async #resolveNames(policy: NetworkPolicy): Promise<Record<string, string[]>> {
    if (policy.mode !== "egress") return {};
    const out: Record<string, string[]> = {};
    const resolve = this.#opts.resolve ?? (async (n: string) => (await lookup(n, { all: true, family: 4 })).map((a) => a.address));
    for (const e of policy.allow.map(parseAllowEntry)) {
      if (e.name === null || out[e.name]) continue;
      let ips: string[];
      try {
        ips = [...new Set(await resolve(e.name))].sort();
      } catch (err) {
        throw new BerthError("operation_failed", `operation_failed: allow entry ${e.text}: name ${e.name} could not be resolved (${errorMessage(err)})`);
      }
      if (ips.length === 0) throw new BerthError("operation_failed", `operation_failed: allow entry ${e.text}: name ${e.name} has no IPv4 address`);
      out[e.name] = ips;
    }
    return out;
  }

  #writeFiles(netns: string, policy: NetworkPolicy, resolved: Record<string, string[]>): void {
    if (policy.mode !== "egress") return;
    const dir = join(this.#etc, netns);
    mkdirSync(dir, { recursive: true, mode: 0o755 });
    const hosts = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"];
    for (const [name, ips] of Object.entries(resolved)) for (const ip of ips) hosts.push(`${ip} ${name}`);
    writeFileSync(join(dir, "hosts"), "# berth: names pinned by the machine's network policy\n" + hosts.join("\n") + "\n", { mode: 0o644 });
    const resolv = policy.dns.length > 0 ? policy.dns.map((d) => `nameserver ${d}`).join("\n") : "# berth: no DNS resolver by policy (pinned names only)\nnameserver 127.0.0.1";
    writeFileSync(join(dir, "resolv.conf"), resolv + "\noptions timeout:1 attempts:1\n", { mode: 0o644 });
  }

  /** The files a runtime binds over /etc/hosts and /etc/resolv.conf (gvisor). */
  files(netns: string): { hosts: string; resolvConf: string } {
    return { hosts: join(this.#etc, netns, "hosts"), resolvConf: join(this.#etc, netns, "resolv.conf") };
  }

  // ---- address-slot leases (host-wide) ------------------------------------

  #lease(machineId: string): number {
    mkdirSync(this.#leaseDir, { recursive: true, mode: 0o700 });
    const start = parseInt(hex(`${this.#stateDir}\0${machineId}`, 8), 16) % this.#slots;
    const owner = JSON.stringify({ stateDir: this.#stateDir, machineId }) + "\n";
    for (let i = 0; i < this.#slots; i++) {
      const slot = (start + i) % this.#slots;
      const path = join(this.#leaseDir, `${this.range.replace("/", "_")}-${slot}`);
      let fd: number;
      try {
        fd = openSync(path, "wx", 0o600);
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code === "EEXIST") {
          if (this.#leaseOwner(path)?.machineId === machineId && this.#leaseOwner(path)?.stateDir === this.#stateDir) return slot;
          continue;
        }
        throw e;
      }
      writeSync(fd, owner);
      closeSync(fd);
      return slot;
    }
    throw new BerthError("no_capacity", `no_capacity: every address slot of ${this.range} is leased on this host`);
  }

  #leasePath(slot: number): string {
    return join(this.#leaseDir, `${this.range.replace("/", "_")}-${slot}`);
  }

  #leaseOwner(path: string): { stateDir: string; machineId: string } | null {
    try {
      return JSON.parse(readFileSync(path, "utf8")) as { stateDir: string; machineId: string };
    } catch {
      return null;
    }
  }

  #release(slot: number, machineId: string): void {
    const path = this.#leasePath(slot);
    const o = this.#leaseOwner(path);
    if (o && o.stateDir === this.#stateDir && o.machineId === machineId) unlinkSync(path);
  }

  // ---- tear down ----------------------------------------------------------

  /** Removes the machine's network in order (idempotent). Resolves to what was removed. */
  tearDown(machineId: string): Promise<string[]> {
    return this.#lock.run(machineId, () => this.#tearDown(machineId));
  }

  async #tearDown(machineId: string): Promise<string[]> {
    const rec = this.store.get(machineId);
    if (!rec) return [];
    this.store.put({ ...rec, state: "releasing", updatedAt: this.#deps.now() });
    const removed: string[] = [];
    const idx = ifindex(rec.hostIf);
    if (idx !== null) {
      if (rec.hostIfindex !== null && idx !== rec.hostIfindex) throw this.#foreign(machineId, `veth ${rec.hostIf} has ifindex ${idx}, recorded ${rec.hostIfindex}`);
      await must("ip", ["link", "del", rec.hostIf], `removing veth ${rec.hostIf}`);
      removed.push(`veth ${rec.hostIf}`);
    }
    const handle = (await listTables()).get(rec.table);
    if (handle !== undefined) {
      if (rec.nftHandle !== null && handle !== rec.nftHandle) throw this.#foreign(machineId, `table ${rec.table} has handle ${handle}, recorded ${rec.nftHandle}`);
      await must("nft", ["delete", "table", "inet", "handle", String(handle)], `removing nftables table ${rec.table}`);
      removed.push(`table ${rec.table}`);
    }
    const ino = netnsInode(rec.netns);
    if (ino !== null) {
      if (rec.netnsInode !== null && ino !== rec.netnsInode) throw this.#foreign(machineId, `namespace ${rec.netns} has inode ${ino}, recorded ${rec.netnsInode}`);
      await must("ip", ["netns", "del", rec.netns], `removing network namespace ${rec.netns}`);
      removed.push(`netns ${rec.netns}`);
    }
    rmSync(join(this.#etc, rec.netns), { recursive: true, force: true });
    if (rec.slot !== null) this.#release(rec.slot, machineId);
    if (ifindex(rec.hostIf) !== null || netnsInode(rec.netns) !== null) {
      throw new BerthError("operation_failed", `operation_failed: the network of machine ${machineId} is still present after removal`);
    }
    this.store.delete(machineId);
    this.counters.tornDown++;
    return removed;
  }

  #foreign(machineId: string, what: string): BerthError {
    return new BerthError("operation_failed", `operation_failed: the network of machine ${machineId} does not match its record (${what}); it is left untouched; quarantine the machine`);
  }

  /**
   * Loads the machine's rules again (after a return) — only once they were
   * found exactly as recorded: rules changed while the machine was lent are
   * the borrower's evidence, reported (`network_tampered`), never silently
   * repaired.
   */
  reapply(machineId: string): Promise<void> {
    return this.#lock.run(machineId, async () => {
      const rec = this.store.get(machineId);
      if (!rec || rec.state !== "up" || rec.slot === null) throw new BerthError("operation_failed", `operation_failed: machine ${machineId} has no network set up`);
      const v = await this.#verify(rec, true);
      if (!v.ok) throw tampered(machineId, v);
      await must("nft", ["-f", "-"], `reloading nftables table ${rec.table}`, this.#ruleset(rec, this.addresses(rec.slot).guest, rec.resolved));
      const handle = (await listTables()).get(rec.table) ?? null;
      this.store.put({ ...rec, nftHandle: handle, rules: await this.#readBack(rec.table, rec.netns), updatedAt: this.#deps.now() });
    });
  }

  // ---- the rules as they are ----------------------------------------------

  /** The machine's table read back from the kernel: normalised lines (handles kept, packet counts zeroed) and the refuse chain's packet count. */
  async #liveTable(table: string, session: NftSession = this.#nft): Promise<{ lines: string[]; refused: number | null } | null> {
    let parsed: unknown;
    try {
      parsed = await session.ask(`list table inet ${table}`);
    } catch {
      return null;
    }
    const items = ((parsed as { nftables?: unknown[] }).nftables ?? []) as Array<Record<string, Record<string, unknown>>>;
    const lines: string[] = [];
    let refused: number | null = null;
    for (const item of items) {
      const [kind, body] = Object.entries(item)[0] ?? [];
      if (!kind || !body || kind === "metainfo") continue;
      if (kind === "rule" && body.chain === "refuse" && refused === null) {
        for (const x of (body.expr as Array<Record<string, { packets?: number }>>) ?? []) if (x.counter && typeof x.counter.packets === "number") refused = x.counter.packets;
      }
      lines.push(`${kind} ${JSON.stringify(body, (k, v: unknown) => (k === "counter" ? "counter" : v))}`);
    }
    return { lines, refused };
  }

  async #liveNamespace(netns: string): Promise<string[]> {
    const r = await cmd("ip", ["-n", netns, "-j", "-b", "-"], "addr show\nroute show\n");
    if (r.code !== 0) return [`unreadable: ${r.stderr.trim().slice(0, 200)}`];
    const out: string[] = [];
    for (const chunk of r.stdout.split("\n").filter((l) => l.trim().startsWith("["))) {
      for (const o of JSON.parse(chunk) as Array<Record<string, unknown>>) {
        if ("addr_info" in o) {
          out.push(`link ${String(o.ifname)} ${JSON.stringify(o.flags)}`);
          for (const a of (o.addr_info as Array<Record<string, unknown>>) ?? []) out.push(`addr ${String(o.ifname)} ${String(a.family)} ${String(a.local)}/${String(a.prefixlen)}`);
        } else {
          out.push(`route ${String(o.dst)} via ${String(o.gateway ?? "-")} dev ${String(o.dev)} ${String(o.protocol ?? "")} ${String(o.scope ?? "")}`);
        }
      }
    }
    return out;
  }

  async #readBack(table: string, netns: string): Promise<RulesWitness> {
    const t = await this.#liveTable(table);
    if (!t) throw new BerthError("operation_failed", `operation_failed: nftables table ${table} could not be read back after loading it`);
    const ns = await this.#liveNamespace(netns);
    return { digest: digestOf(t.lines), namespaceDigest: digestOf(ns), lines: t.lines, namespaceLines: ns };
  }

  async #verify(rec: NetRecord, namespace: boolean, session?: NftSession): Promise<RulesVerdict> {
    const v = await this.#compare(rec, namespace, session);
    this.counters.checks[v.ok ? "match" : "mismatch"]++;
    return v;
  }

  async #compare(rec: NetRecord, namespace: boolean, session?: NftSession): Promise<RulesVerdict> {
    if (rec.state !== "up") return { ok: false, why: `the network of machine ${rec.machineId} is ${rec.state}, not up`, diff: [] };
    if (!rec.rules) return { ok: false, why: `no rules were recorded for machine ${rec.machineId}'s network`, diff: [] };
    const ino = netnsInode(rec.netns);
    if (ino !== rec.netnsInode) return { ok: false, why: `namespace ${rec.netns} is ${ino === null ? "gone" : `inode ${ino}`}, recorded inode ${rec.netnsInode}`, diff: [] };
    const idx = ifindex(rec.hostIf);
    if (idx !== rec.hostIfindex) return { ok: false, why: `veth ${rec.hostIf} is ${idx === null ? "gone" : `ifindex ${idx}`}, recorded ${rec.hostIfindex}`, diff: [] };
    const live = await this.#liveTable(rec.table, session);
    if (!live) return { ok: false, why: `nftables table ${rec.table} is gone`, diff: (rec.rules.lines ?? []).slice(0, 5).map((l) => `- ${l}`) };
    const digest = digestOf(live.lines);
    if (digest !== rec.rules.digest) return { ok: false, why: `the rules of table ${rec.table} changed (${rec.rules.digest.slice(0, 19)} recorded, ${digest.slice(0, 19)} now)`, diff: linesDiff(rec.rules.lines ?? [], live.lines) };
    if (namespace) {
      const ns = await this.#liveNamespace(rec.netns);
      if (digestOf(ns) !== rec.rules.namespaceDigest) return { ok: false, why: `the addresses or routes of namespace ${rec.netns} changed`, diff: linesDiff(rec.rules.namespaceLines ?? [], ns) };
    }
    return { ok: true, digest, evidenceAt: rec.evidence?.at ?? null };
  }

  /**
   * Compares the machine's live rules with the recorded ones (table always;
   * the namespace's addresses and routes too when `namespace`). Never changes
   * anything; serialised with set-up, reload and removal of the machine's
   * network. `lend`: the lend-time check, read through its own nft session.
   */
  verify(machineId: string, opts: { namespace?: boolean; lend?: boolean } = {}): Promise<RulesVerdict> {
    return this.#lock.run(machineId, async () => {
      const rec = this.store.get(machineId);
      if (!rec) return { ok: false as const, why: `machine ${machineId} has no network record`, diff: [] };
      return this.#verify(rec, opts.namespace ?? false, opts.lend ? this.#lendNft : this.#nft);
    });
  }

  /** The agent's canary listener on every host address (started once): refused from inside, so a refusal is told apart from "nothing listens". */
  canaryPort(): Promise<number> {
    this.#canary ??= new Promise((resolve, reject) => {
      const server = createServer((s) => s.destroy());
      server.once("error", reject);
      server.listen(0, "0.0.0.0", () => {
        server.unref();
        resolve({ server, port: (server.address() as { port: number }).port });
      });
    });
    return this.#canary.then((c) => c.port);
  }

  /** Stops the canary and the nft session (agent shutdown). */
  async close(): Promise<void> {
    this.#nft.close();
    this.#lendNft.close();
    const c = this.#canary;
    this.#canary = null;
    if (c) await c.then((x) => new Promise<void>((r) => x.server.close(() => r()))).catch(() => undefined);
  }

  /**
   * Probes from inside the machine; records and returns the evidence (never
   * throws for a failed probe). The rules are compared with the recorded ones
   * before the checks and read again after them: evidence passes only for
   * rules that were in force, unchanged, for the whole probe, and each
   * refusal check carries the refuse chain's count as its witness.
   */
  async probe(machineId: string, runtime: Runtime, generation: number): Promise<ReadinessEvidence> {
    const rec = this.store.get(machineId);
    if (!rec || rec.slot === null) throw new BerthError("operation_failed", `operation_failed: machine ${machineId} has no network set up`);
    const startedAt = this.#deps.now();
    const plan = probePlan({
      policy: rec.policy, resolved: rec.resolved, gatewayIp: this.addresses(rec.slot).host, agentPorts: this.#deps.agentPorts(),
      canaryPort: await this.canaryPort(), coordinator: this.#deps.coordinator(), settings: this.#opts.probe ?? {}, machineRange: this.range,
    });
    const incarnation = await runtime.incarnation(machineId);
    const meta = { fingerprint: rec.fingerprint, generation, incarnation, startedAt, pinned: rec.resolved };
    let evidence: ReadinessEvidence;
    try {
      const before = await this.verify(machineId, { namespace: true });
      if (!before.ok) throw new Error(`the rules are not the recorded ones: ${before.why}${before.diff.length > 0 ? `: ${before.diff.join("; ")}` : ""}`);
      const counter = async (): Promise<number | null> => (await this.#liveTable(rec.table))?.refused ?? null;
      const steps = await runInside(runtime, machineId, plan, this.#opts.probe?.dnsName ?? Object.keys(rec.resolved)[0] ?? "berth-probe.invalid", process.execPath, counter);
      const after = await this.verify(machineId);
      if (!after.ok) throw new Error(`the rules changed during the probe: ${after.why}`);
      const { lines: _l, namespaceLines: _n, ...witness } = this.store.get(machineId)?.rules ?? (rec.rules as RulesWitness);
      evidence = evidenceOf(checksFromSteps(plan, steps), { ...meta, now: this.#deps.now(), rules: witness });
    } catch (e) {
      evidence = evidenceOf([], { ...meta, now: this.#deps.now(), error: errorMessage(e) });
    }
    this.counters.probes[evidence.result]++;
    this.store.put({ ...(this.store.get(machineId) ?? rec), evidence, updatedAt: this.#deps.now() });
    if (evidence.result === "fail") this.#deps.log.warn({ machineId, generation, failed: evidence.checks.filter((c) => !c.ok), error: evidence.error }, "network probe failed");
    return evidence;
  }

  // ---- recovery -------------------------------------------------------------

  /**
   * After a restart: removes the network of every machine `keep` rejects (its
   * machine is gone, being created or destroyed), then every object named with
   * this agent's tag that no record explains, then this agent's orphaned leases.
   */
  async sweep(keep: (machineId: string) => boolean): Promise<SweepReport> {
    const report: SweepReport = { records: 0, netns: 0, links: 0, tables: 0, leases: 0 };
    for (const rec of this.store.list()) {
      if (keep(rec.machineId) && rec.state === "up") continue;
      try {
        const removed = await this.tearDown(rec.machineId);
        report.records++;
        for (const r of removed) {
          if (r.startsWith("veth")) report.links++;
          else if (r.startsWith("table")) report.tables++;
          else report.netns++;
        }
      } catch (e) {
        this.#deps.log.warn({ machineId: rec.machineId, error: errorMessage(e) }, "a stale machine network could not be removed; retried at the next start");
      }
    }
    const known = new Set(this.store.list().flatMap((r) => [r.netns, r.hostIf, r.table]));
    for (const ns of listNetns()) {
      if (ns.startsWith(`berth-${this.tag}-`) && !known.has(ns) && (await cmd("ip", ["netns", "del", ns])).code === 0) {
        rmSync(join(this.#etc, ns), { recursive: true, force: true });
        report.netns++;
      }
    }
    for (const l of listLinks()) if (l.startsWith(`bm${this.tag}`) && !known.has(l) && (await cmd("ip", ["link", "del", l])).code === 0) report.links++;
    for (const [t, handle] of await listTables()) {
      if (t.startsWith(`berth_${this.tag}_`) && !known.has(t) && (await cmd("nft", ["delete", "table", "inet", "handle", String(handle)])).code === 0) report.tables++;
    }
    const slots = new Set(this.store.list().map((r) => r.slot));
    if (existsSync(this.#leaseDir)) {
      for (const f of readdirSync(this.#leaseDir)) {
        const o = this.#leaseOwner(join(this.#leaseDir, f));
        const slot = Number(f.slice(f.lastIndexOf("-") + 1));
        if (o && o.stateDir === this.#stateDir && !slots.has(slot)) {
          unlinkSync(join(this.#leaseDir, f));
          report.leases++;
        }
      }
    }
    for (const k of Object.keys(report) as Array<keyof SweepReport>) this.counters.stale[k] += report[k];
    if (Object.values(report).some((n) => n > 0)) this.#deps.log.warn({ ...report }, "removed machine networks a previous agent process left");
    return report;
  }

  /** Every object of this agent in the kernel now (tests, health). */
  async inventory(): Promise<{ netns: string[]; links: string[]; tables: string[] }> {
    return {
      netns: listNetns().filter((n) => n.startsWith(`berth-${this.tag}-`)),
      links: listLinks().filter((l) => l.startsWith(`bm${this.tag}`)),
      tables: [...(await listTables()).keys()].filter((t) => t.startsWith(`berth_${this.tag}_`)),
    };
  }
}
