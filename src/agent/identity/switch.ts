/**
 * The switch authority: one agent's one-way move from the shared enroll
 * token (`legacy`) to its own identity key (docs/host-identity.md).
 *
 * 1. Prepare, changing nothing that cannot be undone. The coordinator asks
 *    (`POST /v1/agent/identity/prepare`, an operator's `berth host
 *    activate`); the agent admits no new machine or key, waits for the
 *    operations under way, and plans the retirement of every sandbox: a
 *    lent one (a live session or a borrow key) is a blocker unless forced.
 *    A blocker resumes everything as it was. Otherwise the agent answers
 *    with its public key and a signature over the coordinator's challenge,
 *    and waits until the coordinator recorded it (a session against the
 *    key succeeds); if that does not come, it resumes, and the next attempt
 *    prepares again.
 * 2. Local commit, from which it only goes forward: the record `local` is
 *    written. Then the agent stops using the enroll token, retires every
 *    sandbox (destroyed through its own operations; each owes a stopped
 *    report at the machine's exact generation, kept in the record), and
 *    claims the floor (floor.ts). From the record on it runs nothing, and a
 *    restart resumes here.
 * 3. Cloud commit: the coordinator records the floor (the enroll token is
 *    refused for this host from then on, `host_activated`) and answers with
 *    the host-call token bound to the key; record `cloud`.
 * 4. Purge: the enroll token file is removed; record `active`. The agent
 *    advertises itself (`describe`, then `active`) and admits machines
 *    again. If advertising fails it is pending again and says so later.
 *
 * Owed stopped reports are sent on every attempt and tick, `active`
 * included, until the coordinator says each is moot (taken, a newer
 * generation, or no row); a report the coordinator could not write is
 * simply sent again. Nothing irreversible runs on a record not known to be
 * durable (record.ts `ensureDurable`). A record that cannot be read is
 * `local`: the local step's work is idempotent and is done again.
 */
import { BerthError } from "../../core/errors.js";
import type { StoppedReport, SwitchStep } from "../../core/host-identity.js";
import { errorMessage, type AgentLog } from "../log.js";
import type { RecordFile, SwitchRecord, TestHooks } from "./record.js";

export type SwitchMode = "legacy" | "preparing" | "pending" | "active";

export interface RetirementPlan {
  machines: Array<{ machineId: string; generation: number }>;
  /** What stops the switch unless forced: lent machines. */
  blockers: string[];
}

export interface SwitchDeps {
  /** The record file of this state directory. */
  record: RecordFile;
  /** The floor is claimed here (a record may have been lost). */
  floorClaimed: () => boolean;
  /** Claim the floor: no older agent runs on this state directory again. Idempotent. */
  claimFloor: () => void;
  /** This agent's public key, a signature over the coordinator's prepare challenge, and the proof of its host-call token. */
  proveForPrepare: (challenge: string) => { publicKey: string; signature: string; callProof: string };
  /** The coordinator recorded the prepare: a session against the key is granted. Rejects while it is not. */
  confirmPrepared: () => Promise<void>;
  /** Admit no new machine or key; resolves `drained` once the operations under way are done. */
  pauseStarts: () => { drained: Promise<void>; resume(): void };
  /** Raise the agent's machine generations to the coordinator's (a keeper borrow never told the agent). */
  learnGenerations: (generations: Record<string, number>) => void;
  /** The plan: changes nothing. */
  planRetirement: (force: boolean) => RetirementPlan;
  /** Destroys every planned sandbox (idempotent); names those gone at their generation. */
  retire: (plan: RetirementPlan) => Promise<{ stopped: StoppedReport[]; problem: string | null }>;
  /** Stop using the enroll token in this process. */
  leaveToken: () => void;
  /** Ask the coordinator to record the floor; resolves to the host-call token bound to the key. */
  cloudCommit: () => Promise<string>;
  /** Keep (the hash of) the host-call token the coordinator will now present. */
  keepCallToken: (token: string) => void;
  /** Remove the enroll token file. Idempotent. */
  purge: () => void;
  /** Send owed reports; resolves to those the coordinator says are moot. */
  sendStopped: (owed: StoppedReport[]) => Promise<StoppedReport[]>;
  /** Tell the coordinator where this host is and that it is active. */
  advertise: () => Promise<void>;
  /** Per step and refusal: a log line and a metric. */
  onStep: (step: SwitchStep | "prepared" | "announced", detail?: Record<string, unknown>) => void;
  onRefusal: (reason: string) => void;
  hooks: TestHooks;
  log: AgentLog;
  now: () => number;
}

/** How long a prepared agent waits for the coordinator to record its key before it resumes. */
export const PREPARE_WAIT_MS = 30_000;

export class SwitchAuthority {
  readonly #d: SwitchDeps;
  #preparing: { resume(): void } | null = null;
  #plan: RetirementPlan | null = null;
  #announced = false;
  #advancing: Promise<void> | null = null;
  #lastNote: string | null = null;
  /** Starts paused by this process while pending (never resumed once a record exists). */
  #paused: { resume(): void } | null = null;

  constructor(deps: SwitchDeps) {
    this.#d = deps;
    if (deps.record.record === null && deps.floorClaimed()) {
      // Only the switch claims the floor, after its record: a floor without one means the record was lost.
      deps.record.adopt({ step: "local", stopped: [], damaged: true });
      deps.log.warn({ record: deps.record.path }, "identity: the floor is claimed but the switch record is missing; treating it as the local commit");
    } else if (deps.record.record?.damaged) {
      deps.log.warn({ record: deps.record.path }, "identity: the switch record cannot be read; treating it as the local commit (runs nothing, retires every sandbox again)");
    }
  }

  /** The step the record names, or null (legacy). */
  step(): SwitchStep | null {
    return this.#d.record.record?.step ?? null;
  }

  owed(): StoppedReport[] {
    return this.#d.record.record?.stopped ?? [];
  }

  mode(): SwitchMode {
    const r = this.#d.record.record;
    if (r === null) return this.#preparing !== null ? "preparing" : "legacy";
    return r.step === "active" && this.#announced ? "active" : "pending";
  }

  /** Whether the enroll token may be used: never once a record exists (or the floor was claimed). */
  mayUseToken(): boolean {
    return this.#d.record.record === null && !this.#d.floorClaimed();
  }

  /** Whether a new machine or key may be admitted now. */
  admitsStarts(): boolean {
    const m = this.mode();
    return m === "legacy" || m === "active";
  }

  /** A fresh host enrolled straight into identity mode: its record is `active` from the start. */
  async enrolledActive(): Promise<void> {
    if (this.#d.record.record === null) this.#write({ step: "active", stopped: [] });
    await this.advance();
  }

  /**
   * An operator reset this host's identity and the agent bound its key again
   * (an enrollment with the reset's one-time token and a proof of the key):
   * the coordinator drained the host's machines, so what the local step had
   * left to retire goes through their normal destroy; owed reports stay owed.
   * The record is `active`; the agent advertises itself again.
   */
  async rebound(): Promise<void> {
    this.#preparing = null;
    this.#plan = null;
    this.#write({ step: "active", stopped: this.owed() });
    this.#announced = false;
    this.#d.onStep("active", { rebound: true });
    await this.advance();
  }

  /**
   * The coordinator's prepare. Answers with the proof (or refuses with the
   * blockers); the local commit follows once the coordinator recorded it.
   */
  async prepare(input: { challenge: string; force: boolean; generations: Record<string, number> }): Promise<{ publicKey: string; signature: string; callProof: string; step: string }> {
    const d = this.#d;
    if (d.record.record !== null) {
      // Past the local commit already: the coordinator may be asking again after losing track.
      void this.advance();
      return { ...d.proveForPrepare(input.challenge), step: d.record.record.step };
    }
    if (this.#preparing !== null) throw new BerthError("conflict", "conflict: this host is already preparing its identity switch; wait for it");
    const paused = d.pauseStarts();
    this.#preparing = paused;
    try {
      await paused.drained;
      d.learnGenerations(input.generations);
      const plan = d.planRetirement(input.force);
      if (plan.blockers.length > 0) {
        d.onRefusal("host_busy");
        throw new BerthError("host_busy", `host_busy: the host still lends ${plan.blockers.join(", ")}; wait until they are returned, or activate with --force to end those borrows`);
      }
      this.#plan = plan;
    } catch (e) {
      this.#preparing = null;
      paused.resume();
      throw e;
    }
    d.onStep("prepared", { machines: this.#plan.machines.length, force: input.force });
    void this.#awaitCommit(paused);
    return { ...d.proveForPrepare(input.challenge), step: "prepared" };
  }

  /** Once the coordinator recorded the prepare: the local commit; else, past the wait, everything resumes. */
  async #awaitCommit(paused: { resume(): void }): Promise<void> {
    const d = this.#d;
    const deadline = d.now() + PREPARE_WAIT_MS;
    for (;;) {
      try {
        await d.confirmPrepared();
        break;
      } catch (e) {
        if (d.now() >= deadline) {
          this.#preparing = null;
          this.#plan = null;
          paused.resume();
          d.onRefusal("prepare_unconfirmed");
          d.log.warn({ error: errorMessage(e) }, "identity: the coordinator did not record the prepare; the host resumes on the enroll token, nothing changed");
          return;
        }
        await new Promise((r) => setTimeout(r, 200));
      }
    }
    try {
      this.#write({ step: "local", stopped: [] });
    } catch (e) {
      if (d.record.record === null) {
        // Nothing was renamed into place: still legacy, nothing changed.
        this.#preparing = null;
        this.#plan = null;
        paused.resume();
        d.onRefusal("record_write_failed");
        d.log.warn({ error: errorMessage(e) }, "identity: the switch record could not be written; the host resumes on the enroll token");
        return;
      }
      // Renamed but not synced: it is the record; the switch waits until it is durable.
    }
    this.#preparing = null;
    this.#paused = paused;
    d.onStep("local");
    await this.advance();
  }

  /** Single flight; never rejects (a failure is logged once and retried on the next tick). */
  advance(): Promise<void> {
    this.#advancing ??= this.#advanceOnce()
      .catch((e: unknown) => this.#note(`identity: the switch stopped here for now (${errorMessage(e)}); it tries again on the next tick`))
      .finally(() => {
        this.#advancing = null;
      });
    return this.#advancing;
  }

  async #advanceOnce(): Promise<void> {
    const d = this.#d;
    if (d.record.record === null) return;
    // A record found at boot (or renamed without its directory sync) is proven durable before anything runs on it.
    try {
      d.record.ensureDurable();
    } catch (e) {
      d.onRefusal("record_not_durable");
      this.#note(`identity: the switch record is not known to be on disk yet (${errorMessage(e)}); the host runs nothing and waits`);
      return;
    }
    await this.#reportOwed();
    if (d.record.record.step === "local") {
      d.leaveToken();
      const plan = this.#plan ?? d.planRetirement(true);
      const { stopped, problem } = await d.retire(plan);
      this.#plan = null;
      const owed = mergeOwed(d.record.record.stopped, stopped);
      if (owed.length !== d.record.record.stopped.length || d.record.record.damaged) this.#write({ step: "local", stopped: owed });
      d.hooks.at?.("retired");
      await this.#reportOwed();
      if (problem !== null) throw new Error(problem);
      d.claimFloor();
      const callToken = await d.cloudCommit();
      d.keepCallToken(callToken);
      d.hooks.at?.("committed");
      this.#write({ step: "cloud", stopped: d.record.record.stopped });
      d.onStep("cloud");
    }
    if (d.record.record.step === "cloud") {
      d.purge();
      d.hooks.at?.("purged");
      this.#write({ step: "active", stopped: d.record.record.stopped });
      d.onStep("active");
    }
    if (d.record.record.step === "active" && !this.#announced) {
      d.claimFloor();
      try {
        await d.advertise();
      } catch (e) {
        d.onRefusal("advertise_failed");
        throw e;
      }
      // The token file goes once the coordinator has taken the active host (the cloud step removed
      // the shared token already): until then the file may hold the one-time token of an
      // operator's reset (`host_awaiting`), which the rebind reads and must still find.
      d.purge();
      this.#announced = true;
      this.#paused?.resume();
      this.#paused = null;
      d.onStep("announced");
    }
  }

  async #reportOwed(): Promise<void> {
    const r = this.#d.record.record;
    if (r === null || r.stopped.length === 0) return;
    let moot: StoppedReport[];
    try {
      moot = await this.#d.sendStopped(r.stopped);
    } catch (e) {
      this.#note(`identity: ${r.stopped.length} stopped report(s) could not be sent (${errorMessage(e)}); they stay owed`);
      return;
    }
    if (moot.length === 0) return;
    const gone = new Set(moot.map((x) => `${x.machineId}@${x.generation}`));
    const owed = r.stopped.filter((x) => !gone.has(`${x.machineId}@${x.generation}`));
    if (owed.length !== r.stopped.length) {
      this.#write({ step: r.step, stopped: owed });
      this.#d.log.info({ owed: owed.length }, "identity: stopped reports taken or moot");
    }
  }

  /** Writes the record; a failure after the rename leaves it held but not durable (ensureDurable retries). */
  #write(r: SwitchRecord): void {
    this.#d.record.write(r);
    this.#lastNote = null;
  }

  #note(line: string): void {
    if (line === this.#lastNote) return;
    this.#lastNote = line;
    this.#d.log.warn({}, line);
  }
}

function mergeOwed(a: StoppedReport[], b: StoppedReport[]): StoppedReport[] {
  const m = new Map<string, StoppedReport>();
  for (const r of [...a, ...b]) m.set(`${r.machineId}@${r.generation}`, r);
  return [...m.values()];
}
