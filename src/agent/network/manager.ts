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
import { rmSync, writeFileSync } from "node:fs";
import { createHash } from "node:crypto";
import { createServer, type Server } from "node:net";
import { join, resolve as resolvePath } from "node:path";
import { BerthError } from "../../core/errors.js";
import { cidrRange, intToIp, policyFingerprint, allowOverlaps, DEFAULT_MACHINE_RANGE, type NetworkPolicy } from "../../core/network-policy.js";
import type { ReadinessEvidence, RulesWitness } from "../../core/network-evidence.js";
import type { AgentLog } from "../log.js";
import { errorMessage } from "../log.js";
import type { Runtime } from "../runtime/types.js";
import { KeyedLock } from "../keyed-lock.js";
import { cmd, ifindex, listLinks, listNetns, listTables, must, netnsInode } from "./host.js";
import { machineRuleset } from "./ruleset.js";
import type { NetRecord, NetworkTable } from "../store/networks.js";
import { checksFromSteps, evidenceOf, probePlan, runInside, type ProbeSettings } from "./probe.js";
import { NftSession } from "./nft-session.js";
import { compareRules, liveTable, readBack, tampered, type RulesVerdict } from "./live-rules.js";
import { DEFAULT_LEASE_DIR, SlotLeases } from "./slot-leases.js";
import { netnsFiles, resolveNames, writeNetnsFiles } from "./pinned-names.js";

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

/** First uid of machines' own uids (process runtime under a policy); far above any account a host has. */
export const MACHINE_UID_BASE = 1_000_000_000;

export interface NetworkCounters {
  setUp: number;
  tornDown: number;
  probes: { pass: number; fail: number };
  /** Comparisons of live rules with the recorded ones (lend checks, returns, the periodic check, recovery). */
  checks: { match: number; mismatch: number };
  stale: SweepReport;
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
  readonly #leases: SlotLeases;
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
    this.#leases = new SlotLeases(opts.leaseDir ?? DEFAULT_LEASE_DIR, this.range, this.#stateDir, this.#slots);
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
      rec = { ...rec, slot: this.#leases.lease(machineId, parseInt(hex(`${this.#stateDir}\0${machineId}`, 8), 16) % this.#slots), updatedAt: this.#deps.now() };
      this.store.put(rec);
    }
    const { host, guest } = this.addresses(rec.slot as number);
    const resolved = await resolveNames(policy, this.#opts.resolve);

    if (netnsInode(names.netns) === null) await must("ip", ["netns", "add", names.netns], `creating network namespace ${names.netns}`);
    if (ifindex(names.hostIf) !== null) await must("ip", ["link", "del", names.hostIf], `removing a half-made veth ${names.hostIf}`);
    await must("ip", ["link", "add", names.hostIf, "type", "veth", "peer", "name", "eth0", "netns", names.netns], `creating veth ${names.hostIf}`);
    await must("ip", ["netns", "exec", names.netns, "sh", "-c", "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6; echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6"], "disabling IPv6 in the machine namespace");
    await must("ip", ["-n", names.netns, "-batch", "-"], `configuring namespace ${names.netns}`,
      `addr add ${guest}/30 dev eth0\nlink set lo up\nlink set eth0 up\nroute add default via ${host}\n`);
    await must("nft", ["-f", "-"], `loading nftables table ${names.table}`, this.#ruleset(rec, guest, resolved));
    writeFileSync(`/proc/sys/net/ipv4/conf/${names.hostIf}/forwarding`, "1");
    await must("ip", ["-batch", "-"], `configuring veth ${names.hostIf}`, `addr add ${host}/30 dev ${names.hostIf}\nlink set ${names.hostIf} up\n`);
    writeNetnsFiles(this.#etc, names.netns, policy, resolved);

    const handle = (await listTables()).get(names.table) ?? null;
    const up: NetRecord = {
      ...rec, state: "up", resolved, netnsInode: netnsInode(names.netns), hostIfindex: ifindex(names.hostIf), nftHandle: handle, updatedAt: this.#deps.now(),
      rules: await readBack(this.#nft, names.table, names.netns),
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

  /** The files a runtime binds over /etc/hosts and /etc/resolv.conf (gvisor). */
  files(netns: string): { hosts: string; resolvConf: string } {
    return netnsFiles(this.#etc, netns);
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
    if (rec.slot !== null) this.#leases.release(rec.slot, machineId);
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
      this.store.put({ ...rec, nftHandle: handle, rules: await readBack(this.#nft, rec.table, rec.netns), updatedAt: this.#deps.now() });
    });
  }

  async #verify(rec: NetRecord, namespace: boolean, session: NftSession = this.#nft): Promise<RulesVerdict> {
    const v = await compareRules(rec, namespace, session);
    this.counters.checks[v.ok ? "match" : "mismatch"]++;
    return v;
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
      const counter = async (): Promise<number | null> => (await liveTable(this.#nft, rec.table))?.refused ?? null;
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
    report.leases += this.#leases.sweepOrphans(new Set(this.store.list().map((r) => r.slot)));
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
