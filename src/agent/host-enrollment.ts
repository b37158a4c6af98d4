/**
 * Step 7 of `startAgent` (agent.ts): the host's identity and its enrollment
 * with the coordinator.
 *
 *   - The enroll token: given, or read from its file only when needed, and
 *     forgotten once the host switched to its identity key.
 *   - Host identity (identity/host-switch.ts), made only with a coordinator.
 *   - The first enrollment: none once the host uses its identity key; none
 *     without a token when this state directory already enrolled. A
 *     coordinator that cannot be reached is retried in the background (1 s,
 *     doubling to 30 s); one that refuses (4xx) stops the start.
 *   - The switch's tick: owed reports, the next step, the credential's renewal.
 */
import { hashToken } from "../core/tokens.js";
import type { AgentOptions } from "./agent-options.js";
import type { SessionRegistry } from "./contracts.js";
import { enroll, EnrollRefusedError, readEnrollToken, type EnrollRequest } from "./enroll.js";
import { CoordinatorRefusal } from "./identity/coordinator.js";
import { createHostSwitch, META_HOST_ID, META_TOKEN_HASH, type HostSwitch } from "./identity/host-switch.js";
import { envHooks } from "./identity/record.js";
import type { AgentKeys } from "./keys.js";
import { errorMessage, type AgentLog } from "./log.js";
import type { AgentOperations } from "./operations/dispatch.js";
import type { AgentStore } from "./store/store.js";

export interface HostEnrollmentParts {
  opts: Pick<AgentOptions, "stateDir" | "coordinatorUrl" | "enrollToken" | "enrollTokenFile" | "legacyEnroll" | "identityHooks" | "identityTickMs">;
  name: string;
  version: string;
  store: AgentStore;
  keys: AgentKeys;
  sessions: SessionRegistry;
  ops: AgentOperations;
  /** What the coordinator should know of this host (its enrollment body less the name). */
  description: () => Omit<EnrollRequest, "name">;
  log: AgentLog;
  now: () => number;
}

export class HostEnrollment {
  /** Null until the agent has enrolled once. */
  hostId: string | null;
  /** Host identity (null without a coordinator). */
  readonly identity: HostSwitch | null;
  #token: string | null;
  #tokenDropped = false;
  readonly #legacy: boolean;
  #stopped = false;
  #wake: (() => void) | null = null;
  #timer: NodeJS.Timeout | null = null;
  #ticking: Promise<void> | null = null;

  constructor(private readonly p: HostEnrollmentParts) {
    const { opts } = p;
    this.hostId = p.store.meta.get(META_HOST_ID);
    this.#token = opts.enrollToken ?? null;
    this.identity =
      opts.coordinatorUrl === undefined
        ? null
        : createHostSwitch({
            stateDir: opts.stateDir,
            coordinatorUrl: opts.coordinatorUrl,
            store: p.store,
            keys: p.keys,
            sessions: p.sessions,
            ops: p.ops,
            tokenFile: opts.enrollTokenFile ?? null,
            dropToken: () => {
              this.#tokenDropped = true;
              this.#token = null;
            },
            hostId: () => this.hostId,
            description: p.description,
            rebind: () => this.#rebind(),
            version: p.version,
            hooks: opts.identityHooks ?? envHooks(process.env),
            log: p.log,
            now: p.now,
          });
    this.#legacy = opts.legacyEnroll ?? (process.env.BERTH_TEST_HOOKS === "1" && process.env.BERTH_TEST_LEGACY_ENROLL === "1");
  }

  /**
   * The first enrollment and the switch's tick. Rejects when the coordinator
   * refuses, or when there is no token and never was an enrollment; `enrolled`
   * settles once enrolled (or at once without a coordinator) and never rejects.
   */
  async start(): Promise<{ enrolled: Promise<void> }> {
    const { identity, p } = this;
    const coordinator = p.opts.coordinatorUrl;
    if (coordinator === undefined || identity === null) return { enrolled: Promise.resolve() };
    let enrolled: Promise<void> = Promise.resolve();
    if (!identity.authority.mayUseToken()) {
      // Past the local commit (or enrolled with the key): the enroll token is never used again.
      p.log.info({ hostId: this.hostId, step: identity.authority.step() }, "identity: this host uses its identity key; the enroll token is not used");
      enrolled = identity.authority.advance();
    } else {
      const raw = this.#enrollToken();
      if (raw === null) {
        if (p.store.meta.get(META_TOKEN_HASH) === null) {
          throw new Error("no enroll token: give --enroll-token-file FILE or set BERTH_ENROLL_TOKEN (the agent never enrolled from this state directory)");
        }
        p.log.info({ hostId: this.hostId }, "no enroll token given: keeping the enrollment this state directory already has");
      } else {
        try {
          await this.#once(raw, coordinator);
        } catch (e) {
          if (e instanceof EnrollRefusedError) throw e;
          p.log.warn({ error: errorMessage(e) }, "enrollment failed; retrying in the background");
          enrolled = this.#retry(identity, coordinator);
        }
      }
    }
    this.#startTicking(identity);
    return { enrolled };
  }

  /** Stops the tick (waiting for one under way) and the background retries. */
  async stop(): Promise<void> {
    try {
      if (this.#timer !== null) {
        clearInterval(this.#timer);
        await this.#ticking;
      }
    } finally {
      this.#stopped = true;
      this.#wake?.();
    }
  }

  #enrollToken(): string | null {
    if (this.#tokenDropped) return null;
    if (this.#token === null && this.p.opts.enrollTokenFile !== undefined) this.#token = readEnrollToken(this.p.opts.enrollTokenFile, {});
    return this.#token;
  }

  /** An operator reset this host's identity: enroll again with the reset's one-time token. */
  async #rebind(): Promise<boolean> {
    const { opts, log } = this.p;
    // The reset's one-time token, read afresh (the switch forgot the old one; its file may hold the new one).
    const fresh = opts.enrollTokenFile !== undefined ? readEnrollToken(opts.enrollTokenFile, {}) : (opts.enrollToken ?? null);
    if (fresh === null || opts.coordinatorUrl === undefined) {
      log.warn({ hostId: this.hostId }, "identity: an operator reset this host's identity; start the agent with the one-time enroll token `berth host reset-identity` printed (--enroll-token-file) to bind its key again");
      return false;
    }
    await this.#once(fresh, opts.coordinatorUrl, true);
    return true;
  }

  /**
   * One enrollment with the enroll token: with an identity proof, unless told to enroll the old way.
   * `rebind`: the host's identity was reset by an operator and the token is the reset's one-time
   * token; the enrollment binds this agent's key (it is made whatever the switch record says).
   */
  async #once(raw: string, coordinator: string, rebind = false): Promise<void> {
    const { identity } = this;
    const { store, log, name } = this.p;
    if (!rebind && identity !== null && !identity.authority.mayUseToken()) return;
    const proof = identity !== null && (rebind || !this.#legacy) ? await proofIfKnown(identity, name, log) : undefined;
    let got;
    try {
      got = await enroll(coordinator, raw, { name, ...this.p.description() }, proof);
    } catch (e) {
      if (!rebind && e instanceof EnrollRefusedError && e.code === "host_exists" && this.hostId !== null && store.meta.get(META_TOKEN_HASH) !== null) {
        // The enroll token only creates hosts: this one exists, and this state directory holds its enrollment.
        log.warn(
          { hostId: this.hostId, name },
          "the coordinator already has this host; keeping the enrollment this state directory holds (the enroll token only creates new hosts). " +
            "The coordinator calls the host at the address it enrolled with: if that changed, an operator runs `berth host reset-identity` and the agent starts with the one-time enroll token it prints",
        );
        return;
      }
      throw e;
    }
    if (this.hostId !== null && got.hostId !== this.hostId) {
      throw new EnrollRefusedError(
        409,
        "conflict",
        `the coordinator enrolled this agent as host ${got.hostId}, but its state directory ${this.p.opts.stateDir} belongs to host ${this.hostId}; ` +
          "use a fresh --state-dir for a new host, or ask the coordinator's operator to restore the host",
      );
    }
    store.transaction(() => {
      store.meta.set(META_HOST_ID, got.hostId);
      store.meta.set(META_TOKEN_HASH, hashToken("host-call", got.hostCallToken));
    });
    this.hostId = got.hostId;
    log.info({ hostId: this.hostId, coordinator: new URL(coordinator).origin, identity: got.identity ?? "legacy", rebind }, "enrolled with the coordinator");
    // The coordinator recorded this host's identity key: it is active from the start.
    if (got.identity === "active" && identity !== null && !rebind) await identity.authority.enrolledActive();
  }

  /** The background retries of the first enrollment: 1 s, doubling to 30 s, until enrolled, refused, stopped or past the token. */
  async #retry(identity: HostSwitch, coordinator: string): Promise<void> {
    let delay = 1000;
    while (!this.#stopped) {
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, delay);
        this.#wake = () => {
          clearTimeout(t);
          resolve();
        };
      });
      if (this.#stopped || !identity.authority.mayUseToken()) return;
      const again = this.#enrollToken();
      if (again === null) return;
      try {
        await this.#once(again, coordinator);
        return;
      } catch (e2) {
        this.p.log.warn({ error: errorMessage(e2) }, "enrollment failed; retrying");
        if (e2 instanceof EnrollRefusedError) return;
        delay = Math.min(delay * 2, 30_000);
      }
    }
  }

  /** The switch's tick: owed reports, the next step, the credential's renewal (one at a time). */
  #startTicking(identity: HostSwitch): void {
    const testTick = process.env.BERTH_TEST_HOOKS === "1" ? Number(process.env.BERTH_TEST_IDENTITY_TICK_MS) : NaN;
    const tickMs = this.p.opts.identityTickMs ?? (Number.isFinite(testTick) && testTick > 0 ? testTick : 5_000);
    this.#timer = setInterval(() => {
      this.#ticking ??= identity.tick().finally(() => (this.#ticking = null));
    }, tickMs);
    this.#timer.unref();
  }
}

/** The enrollment's identity proof; none from a coordinator built before host identity (no challenge route): the host then stays on the token. */
async function proofIfKnown(identity: HostSwitch, name: string, log: AgentLog): Promise<Awaited<ReturnType<HostSwitch["client"]["enrollProof"]>> | undefined> {
  try {
    return await identity.client.enrollProof(name);
  } catch (e) {
    if (!(e instanceof CoordinatorRefusal) || (e.status !== 404 && e.status !== 405)) throw e;
    log.warn({}, "identity: the coordinator does not offer host identity; enrolling with the shared token (the host can be switched once it does)");
    return undefined;
  }
}
