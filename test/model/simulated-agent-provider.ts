/**
 * A simulated agent provider for the model-based tests: the outermost boundary (the
 * cloud API / host agent) replaced by a small in-memory simulation, so the
 * coordinator code above it runs for real.
 *
 * It follows the agent's operation contract (src/agent/operations/dispatch.ts):
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
 * A timing/fault profile (`AWS_PROFILE`) makes it behave like the AWS
 * provider (src/providers/aws/): a launch answers `ambiguous` ("not running
 * yet") for several calls of the same op id before it is up; fence removes
 * every grant key, then requests a reboot that is slow and sometimes
 * accepted but never performed, answering `ambiguous` until a retry of the
 * same op id observes a new boot id (the incarnation changes, and sessions
 * close, only when the reboot really happened); SSM-run operations sometimes
 * complete ambiguously, applied or not.
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
  /** A reboot the cloud accepted and will perform (AWS profile). */
  reboot?: { pollsLeft: number; at: number } | null;
}

export interface EffectLog {
  seq: number;
  opId: string;
  kind: string;
  machine: string;
  generation: number;
  /** fence: the machine's boot (incarnation) when the fence began and when it was reported done. */
  bootBefore?: number;
  bootAfter?: number;
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

/** How the simulated cloud answers over time. The default (all zero) is an agent that answers at once. */
export interface SimProfile {
  name: string;
  /** Calls of one provision op id answered "launched, not running yet" before the instance is up… */
  provisionPolls: number;
  /** …or clock time after the launch, whichever comes first. */
  provisionMs: number;
  /** Calls of one fence op id answered "reboot requested, same boot id" before the reboot happens… */
  rebootPolls: number;
  /** …or clock time after the request, whichever comes first. */
  rebootMs: number;
  /** Chance a reboot request is accepted but never performed (a retry requests it again). */
  rebootLost: number;
  /** Chance an SSM-run operation (install_key, remove_key, scrub) completes ambiguously… */
  ssmAmbiguous: number;
  /** …and, when it does, chance its effect happened anyway. */
  ssmApplied: number;
  /** The coordinator's fill-claim TTL this profile runs with: a launch must fit in it (the coordinator's default, 5 min, for AWS). */
  claimTtlMs?: number;
}

export const AGENT_PROFILE: SimProfile = { name: "agent", provisionPolls: 0, provisionMs: 0, rebootPolls: 0, rebootMs: 0, rebootLost: 0, ssmAmbiguous: 0, ssmApplied: 0 };
/** The AWS provider's profile: EC2 launches take minutes, reboots tens of seconds, SSM invocations time out. */
export const AWS_PROFILE: SimProfile = { name: "aws", provisionPolls: 3, provisionMs: 90_000, rebootPolls: 2, rebootMs: 45_000, rebootLost: 0.25, ssmAmbiguous: 0.15, ssmApplied: 0.5, claimTtlMs: 5 * 60_000 };

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
  /** Ambiguous calls per provision op id, and when it launched (AWS profile). */
  readonly launches = new Map<string, { polls: number; at: number }>();
  /** The boot (incarnation) each fence op id saw first: the fence is proven by a different one. */
  readonly bootBefore = new Map<string, number>();
  /** Reboots accepted but never performed, performed, and ambiguous SSM completions (what a run exercised). */
  readonly counts = { reboot_lost: 0, reboot_done: 0, ssm_ambiguous: 0, provision_pending: 0 };
  #sessionIds = 0;

  constructor(
    private readonly now: () => number,
    readonly profile: SimProfile = AGENT_PROFILE,
    private readonly random: () => number = Math.random,
  ) {}

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
      if (!m && (this.profile.provisionPolls > 0 || this.profile.provisionMs > 0)) {
        const l = this.launches.get(op.opId) ?? { polls: 0, at: this.now() };
        this.launches.set(op.opId, l);
        if (l.polls < this.profile.provisionPolls && this.now() < l.at + this.profile.provisionMs) {
          l.polls++;
          this.counts.provision_pending++;
          return { kind: "ambiguous", error: `instance for ${resId} launched, not running yet` };
        }
      }
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
    this.#catchUp(m);
    if (this.profile.ssmAmbiguous > 0 && (op.kind === "install_key" || op.kind === "remove_key" || op.kind === "scrub") && this.random() < this.profile.ssmAmbiguous) {
      this.counts.ssm_ambiguous++;
      if (this.random() >= this.profile.ssmApplied) return { kind: "ambiguous", error: `ssm ${op.kind}: invocation still pending` };
      const applied = this.#effect(op, m, now);
      return applied.kind === "done" ? { kind: "ambiguous", error: `ssm ${op.kind}: invocation status lost` } : applied;
    }
    return this.#effect(op, m, now);
  }

  /** A reboot the cloud accepted happens once its time has come, whoever looks. */
  #catchUp(m: SimMachine): void {
    if (m.reboot && this.now() >= m.reboot.at) this.#reboot(m);
  }

  #reboot(m: SimMachine): void {
    m.reboot = null;
    m.sessions = [];
    m.incarnation++;
    this.counts.reboot_done++;
  }

  /** fence on AWS: remove every grant key, reboot, done only when a new boot id is seen. */
  #fenceSlow(op: OperationRequest, m: SimMachine): OperationOutcome {
    if (!this.bootBefore.has(op.opId)) {
      this.bootBefore.set(op.opId, m.incarnation);
      for (const [f, k] of m.keys) if (k.mode === "grant") m.keys.delete(f);
    }
    const before = this.bootBefore.get(op.opId)!;
    if (m.incarnation === before && m.reboot) {
      if (--m.reboot.pollsLeft <= 0) this.#reboot(m);
    }
    if (m.incarnation !== before) return this.#done(op, m, { incarnation: `inc-${m.incarnation}`, incarnationBefore: `inc-${before}` });
    if (!m.reboot) {
      if (this.random() < this.profile.rebootLost) this.counts.reboot_lost++;
      else m.reboot = { pollsLeft: this.profile.rebootPolls, at: this.now() + this.profile.rebootMs };
    }
    return { kind: "ambiguous", error: `reboot of ${m.id} requested; still boot inc-${before}` };
  }

  #effect(op: OperationRequest, m: SimMachine, now: number): OperationOutcome {
    const refuse = (error: string): OperationOutcome => ({ kind: "failed", error, retryable: false });
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
        if (this.profile.rebootPolls > 0 || this.profile.rebootMs > 0) return this.#fenceSlow(op, m);
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
    const boots = op.kind === "fence" ? { bootBefore: this.bootBefore.get(op.opId) ?? m.incarnation - 1, bootAfter: m.incarnation } : {};
    this.log.push({ seq: this.seq, opId: op.opId, kind: op.kind, machine: m.id, generation: op.generation, ...boots });
    return { kind: "done", result };
  }

  /** The gateway's admission: a session opens only with an installed, unexpired key of the current generation (or the keeper key). */
  openSession(resId: string, fingerprint: string): boolean {
    const m = this.machines.get(resId);
    if (!m || !m.exists) return false;
    this.#catchUp(m);
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
    this.#catchUp(m);
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
