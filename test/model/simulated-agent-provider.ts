/**
 * A simulated agent provider for the model-based tests: the outermost boundary (the
 * cloud API / host agent) replaced by a small in-memory simulation, so the
 * coordinator code above it runs for real.
 *
 * It follows the agent's operation contract (src/agent/ops.ts):
 *   - an op id that completed returns its first result and acts on nothing;
 *   - an operation below the machine's generation is refused and changes
 *     nothing; one above it advances it and drops older grant keys;
 *   - a removed key is never installed again at its generation, and an
 *     expired key is never installed;
 *   - fence closes every session and starts a new incarnation;
 *   - destroy of an unknown machine records it destroyed.
 *
 * Faults are scripted per call by the test: a failure, an ambiguous outcome
 * whose effect may or may not have happened (timeout), an applied effect
 * whose reply is lost, or a parked call whose reply is delivered later (or
 * never, if the coordinator that made it crashes). Parked calls of a dead
 * coordinator become orphans: their request may still reach the machine
 * later, acting on whatever generation it then has.
 *
 * It also keeps the evidence the invariant checks ask for: the keys and live
 * sessions of each machine, and a log of every effect with a logical time.
 */
import type { OperationOutcome, OperationRequest, Provider, ProviderCapabilities } from "../../src/providers/provider.js";
import { parsePublicKey } from "../../src/core/ssh-public-key.js";

export type Fault = "none" | "fail" | "fail_permanent" | "timeout_applied" | "timeout_lost" | "lost_reply" | "park_applied" | "park_unapplied";

export interface SimKey {
  fingerprint: string;
  generation: number;
  grantId: string;
  mode: "grant" | "keeper";
  expiresAt: number | null;
}

export interface SimSession {
  id: number;
  fingerprint: string;
  incarnation: number;
  openedAt: number;
  /** Logical step at which it was opened (ordering against fences). */
  seq: number;
}

export interface SimMachine {
  id: string;
  exists: boolean;
  generation: number;
  incarnation: number;
  keys: Map<string, SimKey>;
  /** `${generation}:${grantId}` and `${generation}:${fingerprint}` removed. */
  removed: Set<string>;
  sessions: SimSession[];
}

export interface EffectLog {
  seq: number;
  opId: string;
  kind: string;
  machine: string;
  generation: number;
}

export interface Parked {
  opId: string;
  kind: string;
  /** The coordinator incarnation (epoch) that made the call. */
  epoch: number;
  /** Whether the effect already happened at the machine. */
  applied: boolean;
  outcome: OperationOutcome | null;
  request: OperationRequest;
  resolve: (o: OperationOutcome) => void;
}

const CAPS: ProviderCapabilities = { provision: true, installKey: true, revokeKey: true, fence: true, scrub: true, destroy: true, observeIdentity: true };

export class SimulatedAgentProvider implements Provider {
  readonly name = "hosts";
  readonly capabilities = CAPS;
  readonly machines = new Map<string, SimMachine>();
  readonly done = new Map<string, Record<string, unknown>>();
  readonly log: EffectLog[] = [];
  /** Install effects per `${machine}:${generation}`: the distinct op ids that installed there. */
  readonly installs = new Map<string, Set<string>>();
  readonly parked: Parked[] = [];
  readonly orphans: Parked[] = [];
  /** Faults to apply to the next calls, in order (then "none"). */
  faults: Fault[] = [];
  epoch = 0;
  seq = 0;
  /** Called when a call is parked (the test waits for "settled or parked"). */
  onPark: (() => void) | null = null;
  #sessionIds = 0;

  constructor(private readonly now: () => number) {}

  async run(op: OperationRequest): Promise<OperationOutcome> {
    const fault = this.faults.shift() ?? "none";
    switch (fault) {
      case "none":
        return this.apply(op);
      case "fail":
        return { kind: "failed", error: "scripted: the provider refused (retryable)", retryable: true };
      case "fail_permanent":
        return { kind: "failed", error: "scripted: the provider refused", retryable: false };
      case "timeout_applied":
        this.apply(op);
        return { kind: "ambiguous", error: "scripted: timed out (it happened)" };
      case "timeout_lost":
        return { kind: "ambiguous", error: "scripted: timed out (it did not happen)" };
      case "lost_reply":
        this.apply(op);
        throw new Error("scripted: connection reset after the request was sent");
      case "park_applied":
      case "park_unapplied": {
        const applied = fault === "park_applied";
        const outcome = applied ? this.apply(op) : null;
        return new Promise<OperationOutcome>((resolve) => {
          this.parked.push({ opId: op.opId, kind: op.kind, epoch: this.epoch, applied, outcome, request: op, resolve });
          this.onPark?.();
        });
      }
    }
  }

  /** Delivers a parked call's reply (applying it first if its request was still on its way). */
  deliver(i: number): Parked | null {
    const p = this.parked.splice(i, 1)[0];
    if (!p) return null;
    const outcome = p.applied ? p.outcome! : this.apply(p.request);
    p.resolve(outcome);
    return p;
  }

  /** A coordinator crash: its parked calls lose their caller. */
  crash(): void {
    this.epoch++;
    for (const p of this.parked.splice(0)) if (!p.applied) this.orphans.push(p);
  }

  /** A late request of a dead coordinator reaches the machine (nobody hears the reply). */
  deliverOrphan(i: number): void {
    const p = this.orphans.splice(i, 1)[0];
    if (p) this.apply(p.request);
  }

  apply(op: OperationRequest): OperationOutcome {
    this.seq++;
    const prior = this.done.get(op.opId);
    if (prior) return { kind: "done", result: prior };
    const resId = op.machine.resource_id;
    let m = this.machines.get(resId);
    const refuse = (error: string): OperationOutcome => ({ kind: "failed", error, retryable: false });
    if (op.kind === "provision") {
      if (m && !m.exists) return refuse("conflict: machine was destroyed; use a new id");
      if (!m) {
        m = { id: resId, exists: true, generation: 0, incarnation: 1, keys: new Map(), removed: new Set(), sessions: [] };
        this.machines.set(resId, m);
      }
      const keeperKey = typeof op.args.keeperKey === "string" ? op.args.keeperKey : null;
      if (keeperKey) m.keys.set("keeper", { fingerprint: "keeper", generation: 0, grantId: "keeper", mode: "keeper", expiresAt: null });
      return this.#done(op, m, { incarnation: `inc-${m.incarnation}`, sshHost: "127.0.0.1", sshPort: 2222, hostKey: "ssh-ed25519 AAAAscripted" });
    }
    if (op.kind === "destroy") {
      if (!m) {
        m = { id: resId, exists: false, generation: op.generation, incarnation: 0, keys: new Map(), removed: new Set(), sessions: [] };
        this.machines.set(resId, m);
      }
      m.exists = false;
      m.keys.clear();
      m.sessions = [];
      return this.#done(op, m, { destroyed: true });
    }
    if (!m || !m.exists) return refuse(`not_found: machine ${resId} is not here`);
    if (op.generation < m.generation) return refuse(`generation_mismatch: operation at ${op.generation}, machine at ${m.generation}`);
    if (op.generation > m.generation) {
      m.generation = op.generation;
      for (const [fp, k] of m.keys) if (k.mode === "grant" && k.generation < op.generation) m.keys.delete(fp);
    }
    const now = this.now();
    switch (op.kind) {
      case "install_key": {
        const pk = parsePublicKey(op.args.publicKey);
        const grantId = String(op.args.grantId);
        const expiresAt = typeof op.args.expiresAt === "number" ? op.args.expiresAt : null;
        if (expiresAt !== null && now >= expiresAt) return refuse("grant_expired: not installed");
        if (m.removed.has(`${op.generation}:${grantId}`) || m.removed.has(`${op.generation}:${pk.fingerprint}`)) return refuse("conflict: a removed key is never installed again");
        m.keys.set(pk.fingerprint, { fingerprint: pk.fingerprint, generation: op.generation, grantId, mode: "grant", expiresAt });
        const k = `${m.id}:${op.generation}`;
        if (!this.installs.has(k)) this.installs.set(k, new Set());
        this.installs.get(k)!.add(op.opId);
        return this.#done(op, m, { fingerprint: pk.fingerprint, grantId });
      }
      case "remove_key": {
        const grantId = typeof op.args.grantId === "string" ? op.args.grantId : null;
        const fp = typeof op.args.fingerprint === "string" ? op.args.fingerprint : null;
        const gone: string[] = [];
        for (const [f, k] of m.keys) {
          if (k.mode === "grant" && (k.grantId === grantId || k.fingerprint === fp)) {
            m.keys.delete(f);
            gone.push(f);
          }
        }
        if (grantId) m.removed.add(`${op.generation}:${grantId}`);
        if (fp) m.removed.add(`${op.generation}:${fp}`);
        m.sessions = m.sessions.filter((s) => !gone.includes(s.fingerprint));
        return this.#done(op, m, { removed: gone.length });
      }
      case "fence":
        m.sessions = [];
        m.incarnation++;
        return this.#done(op, m, { incarnation: `inc-${m.incarnation}` });
      case "scrub":
        return this.#done(op, m, { scrubbed: true });
    }
    return refuse(`unknown operation ${op.kind}`);
  }

  #done(op: OperationRequest, m: SimMachine, result: Record<string, unknown>): OperationOutcome {
    this.done.set(op.opId, result);
    this.log.push({ seq: this.seq, opId: op.opId, kind: op.kind, machine: m.id, generation: op.generation });
    return { kind: "done", result };
  }

  /** The gateway's admission: a session opens only with an installed, unexpired key of the current generation (or the keeper key). */
  openSession(resId: string, fingerprint: string): boolean {
    const m = this.machines.get(resId);
    if (!m || !m.exists) return false;
    const k = m.keys.get(fingerprint);
    if (!k) return false;
    if (k.mode === "grant" && (k.generation !== m.generation || (k.expiresAt !== null && this.now() >= k.expiresAt))) return false;
    this.seq++;
    m.sessions.push({ id: ++this.#sessionIds, fingerprint, incarnation: m.incarnation, openedAt: this.now(), seq: this.seq });
    return true;
  }

  /** Grant keys in force now (the agent drops expired keys itself). */
  liveGrantKeys(resId: string): SimKey[] {
    const m = this.machines.get(resId);
    if (!m || !m.exists) return [];
    const now = this.now();
    return [...m.keys.values()].filter((k) => k.mode === "grant" && (k.expiresAt === null || now < k.expiresAt));
  }

  /** Sessions still open (one admitted with a grant key ends when that key expires). */
  liveSessions(resId: string): SimSession[] {
    const m = this.machines.get(resId);
    if (!m || !m.exists) return [];
    const now = this.now();
    return m.sessions.filter((s) => {
      const k = m.keys.get(s.fingerprint);
      if (s.fingerprint === "keeper") return true;
      return k !== undefined && (k.expiresAt === null || now < k.expiresAt);
    });
  }

  lastEffect(resId: string, kind: string, generation: number): EffectLog | undefined {
    for (let i = this.log.length - 1; i >= 0; i--) {
      const e = this.log[i]!;
      if (e.machine === resId && e.kind === kind && e.generation === generation) return e;
    }
    return undefined;
  }
}
