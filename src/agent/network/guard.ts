/**
 * The lend-time check and its periodic twin: a machine's readiness evidence
 * counts only while the rules it was probed against are the rules in force.
 *
 *   lend check   (the coordinator, before it answers a keeper borrow; the
 *                install_key of a portable grant, before its key is
 *                installed): the machine's nftables table is read back and
 *                compared with the recorded one (digest over its normalised
 *                lines, handles included), and its namespace and veth must be
 *                the recorded ones (inode, ifindex). Evidence older than
 *                `maxEvidenceAgeMs` is renewed by probing again first.
 *   periodic     every `intervalMs`, every running machine with a network, and
 *                its namespace's addresses and routes as well.
 *   recovery     once at start (src/agent/recovery.ts asks `check`).
 *
 * A mismatch retires the machine here and now, durably: its record becomes
 * `mismatch` ("network: …", with what changed), every key of it is dropped
 * (nothing authenticates from then on), and every operation but destroy is
 * refused, so the coordinator quarantines and destroys it. Nothing is
 * repaired in place: the changed rules are the evidence.
 */
import { errorMessage, type AgentLog } from "../log.js";
import type { AgentKeys } from "../keys.js";
import type { Runtime } from "../runtime/types.js";
import type { AgentStore } from "../store/store.js";
import type { MachineNetworks } from "./manager.js";
import type { RulesVerdict } from "./live-rules.js";

export const DEFAULT_CHECK_INTERVAL_MS = 10_000;
export const DEFAULT_EVIDENCE_MAX_AGE_MS = 15 * 60_000;

export interface GuardDeps {
  network: MachineNetworks;
  store: AgentStore;
  keys: AgentKeys;
  runtime: Runtime;
  log: AgentLog;
  now: () => number;
}

export type LendCheck =
  | { ok: true; machineId: string; digest: string; evidenceAt: number | null; reprobed: boolean }
  | { ok: false; machineId: string; why: string; diff: string[] };

export class NetworkGuard {
  readonly #deps: GuardDeps;
  readonly maxEvidenceAgeMs: number;
  #timer: NodeJS.Timeout | null = null;
  #sweeping: Promise<void> | null = null;

  constructor(deps: GuardDeps, opts: { maxEvidenceAgeMs?: number } = {}) {
    this.#deps = deps;
    this.maxEvidenceAgeMs = opts.maxEvidenceAgeMs ?? DEFAULT_EVIDENCE_MAX_AGE_MS;
  }

  /** Retires a machine whose rules are not the recorded ones (see the header). */
  retire(machineId: string, v: Extract<RulesVerdict, { ok: false }>): void {
    const { store, keys, log, now } = this.#deps;
    const m = store.machines.get(machineId);
    if (!m || m.state === "destroyed" || m.state === "destroying") return;
    const why = `network: ${v.why}${v.diff.length > 0 ? `; diff: ${v.diff.join(" | ")}` : ""}`;
    keys.drop(machineId, () => store.machines.put({ ...m, state: "mismatch", mismatch: why.slice(0, 4000), updatedAt: now() }));
    log.warn({ machineId, why: v.why, diff: v.diff }, "machine network rules are not the recorded ones: the machine is retired (keys dropped, only destroy accepted)");
  }

  /** The lend-time check of one machine (fast path: the table and the kernel identities). */
  async lendCheck(machineId: string): Promise<LendCheck> {
    const { network, store, runtime } = this.#deps;
    const m = store.machines.get(machineId);
    if (!m) return { ok: false, machineId, why: `machine ${machineId} is not on this host`, diff: [] };
    if (m.state !== "running") return { ok: false, machineId, why: `machine ${machineId} is ${m.state}${m.mismatch ? ` (${m.mismatch})` : ""}`, diff: [] };
    if (!network.get(machineId)) return { ok: true, machineId, digest: "none", evidenceAt: null, reprobed: false };
    const v = await network.verify(machineId, { lend: true });
    if (!v.ok) {
      this.retire(machineId, v);
      return { ok: false, machineId, why: v.why, diff: v.diff };
    }
    const rec = network.get(machineId);
    const evidence = rec?.evidence ?? null;
    if (evidence === null || evidence.result !== "pass") return { ok: false, machineId, why: `machine ${machineId} has no passing readiness evidence`, diff: [] };
    if (this.#deps.now() - evidence.at <= this.maxEvidenceAgeMs) return { ok: true, machineId, digest: v.digest, evidenceAt: evidence.at, reprobed: false };
    // Older than the bound: probed again before it is lent.
    const fresh = await network.probe(machineId, runtime, evidence.generation);
    if (fresh.result !== "pass") {
      const failed = fresh.checks.filter((c) => !c.ok).map((c) => `${c.kind} ${c.target}: ${c.got}`);
      const fv = { ok: false as const, why: `the renewed probe failed: ${fresh.error ?? failed.slice(0, 3).join("; ")}`, diff: [] };
      this.retire(machineId, fv);
      return { machineId, ...fv };
    }
    return { ok: true, machineId, digest: fresh.rules?.digest ?? v.digest, evidenceAt: fresh.at, reprobed: true };
  }

  /** Every running machine with a network, namespace included; retires each mismatch. Resolves to the machines retired. */
  async checkAll(): Promise<string[]> {
    const { network, store } = this.#deps;
    const retired: string[] = [];
    for (const rec of network.store.list()) {
      if (rec.state !== "up") continue;
      const m = store.machines.get(rec.machineId);
      if (!m || m.state !== "running") continue;
      const v = await network.verify(rec.machineId, { namespace: true });
      if (!v.ok) {
        this.retire(rec.machineId, v);
        retired.push(rec.machineId);
      }
    }
    return retired;
  }

  /** Starts the periodic check (interval stated in docs/network.md). */
  start(intervalMs = DEFAULT_CHECK_INTERVAL_MS): void {
    if (this.#timer || intervalMs <= 0) return;
    this.#timer = setInterval(() => {
      if (this.#sweeping) return;
      this.#sweeping = this.checkAll()
        .then(() => undefined)
        .catch((e) => this.#deps.log.warn({ error: errorMessage(e) }, "periodic network check failed"))
        .finally(() => (this.#sweeping = null));
    }, intervalMs);
    this.#timer.unref();
  }

  async stop(): Promise<void> {
    if (this.#timer) clearInterval(this.#timer);
    this.#timer = null;
    await this.#sweeping;
  }
}
