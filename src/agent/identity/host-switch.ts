/**
 * The agent's host identity, wired: the identity key, the switch record and
 * floor, the coordinator client, the switch authority and its capabilities
 * over the agent's store, keys, sessions and operations, the gate on new
 * machines and keys, and the step and refusal counters.
 */
import { closeSync, fsyncSync, openSync, unlinkSync } from "node:fs";
import { dirname } from "node:path";
import { Counter, Registry } from "prom-client";
import { BerthError } from "../../core/errors.js";
import { callProof, type StoppedReport } from "../../core/host-identity.js";
import { hashToken } from "../../core/tokens.js";
import type { SessionRegistry } from "../contracts.js";
import type { EnrollRequest } from "../enroll.js";
import type { AgentKeys } from "../keys.js";
import { errorMessage, type AgentLog } from "../log.js";
import type { OperationRequest, OperationResponse } from "../../protocol/operations.js";
import type { AgentOperations } from "../operations/dispatch.js";
import type { AgentStore, MachineRecord } from "../store/store.js";
import { IdentityClient } from "./coordinator.js";
import { claimFloor, floorClaimed } from "./floor.js";
import { loadOrCreateIdentityKey, type IdentityKey } from "./key.js";
import { RecordFile, type TestHooks } from "./record.js";
import { SwitchAuthority, type RetirementPlan } from "./switch.js";

export const META_HOST_ID = "hostId";
export const META_TOKEN_HASH = "hostCallTokenHash";

export interface HostSwitchParts {
  stateDir: string;
  coordinatorUrl: string;
  store: AgentStore;
  keys: AgentKeys;
  sessions: SessionRegistry;
  ops: AgentOperations;
  /** Where the enroll token came from: a file (removed by the purge) or the environment. */
  tokenFile: string | null;
  /** Forget the enroll token in this process. */
  dropToken: () => void;
  hostId: () => string | null;
  /** What the coordinator should know of this host (its enrollment body less the name). */
  description: () => Omit<EnrollRequest, "name">;
  /**
   * An operator reset this host's identity (the coordinator answers
   * `host_awaiting`): enroll again with the one-time enroll token, proving the
   * key. Resolves true once the key is bound; false while no token is given.
   */
  rebind: () => Promise<boolean>;
  version: string;
  hooks: TestHooks;
  log: AgentLog;
  now: () => number;
}

export interface HostSwitch {
  key: IdentityKey;
  client: IdentityClient;
  authority: SwitchAuthority;
  /** The operations the coordinator may run now: new machines and keys only while the host admits starts. */
  gatedOps: Pick<AgentOperations, "run">;
  metrics: Registry;
  /** Tick: owed reports, the switch, the credential's renewal. */
  tick(): Promise<void>;
  status(): { mode: string; step: string | null; owed: number; fingerprint: string };
}

/** The retirement's operation id for one machine at one generation (so a retried retirement is the same operation). */
export function retireOpId(machineId: string, generation: number): string {
  return `idretire_${machineId}_g${generation}`.slice(0, 128);
}

export function createHostSwitch(p: HostSwitchParts): HostSwitch {
  const key = loadOrCreateIdentityKey(p.stateDir);
  const client = new IdentityClient({ coordinatorUrl: p.coordinatorUrl, key, hostId: p.hostId, now: p.now });
  const metrics = new Registry();
  const steps = new Counter({ name: "berth_agent_identity_steps_total", help: "Host identity switch steps reached by this agent", labelNames: ["step"], registers: [metrics] });
  const refusals = new Counter({ name: "berth_agent_identity_refusals_total", help: "Host identity switch refusals and waits, by reason", labelNames: ["reason"], registers: [metrics] });
  const gate = new StartGate();
  const authority = switchAuthority(p, key, client, gate, steps, refusals);
  return {
    key,
    client,
    authority,
    gatedOps: {
      run: async (req: OperationRequest): Promise<OperationResponse> => {
        if ((req.kind === "provision" || req.kind === "install_key") && (gate.paused || !authority.admitsStarts())) {
          refusals.inc({ reason: "host_switching" });
          throw new BerthError("host_switching", `host_switching: this host is switching to its identity key (${authority.mode()}); it admits no new machine or key until it is active`);
        }
        return gate.run(() => p.ops.run(req));
      },
    },
    metrics,
    tick: () => tick(p, client, authority),
    status: () => ({ mode: authority.mode(), step: authority.step(), owed: authority.owed().length, fingerprint: key.fingerprint }),
  };
}

/** The gate on new machines and keys: a count of operations under way, paused starts, and waiters for the count to drop to zero. */
class StartGate {
  #inFlight = 0;
  #paused = 0;
  readonly #idle: Array<() => void> = [];

  get paused(): boolean {
    return this.#paused > 0;
  }

  async run<T>(op: () => Promise<T>): Promise<T> {
    this.#inFlight++;
    try {
      return await op();
    } finally {
      this.#inFlight--;
      if (this.#inFlight === 0) for (const r of this.#idle.splice(0)) r();
    }
  }

  /** Pauses starts; `drained` settles once no operation is under way. */
  pause(): { drained: Promise<void>; resume: () => void } {
    this.#paused++;
    let resumed = false;
    return {
      drained: this.#inFlight === 0 ? Promise.resolve() : new Promise<void>((r) => this.#idle.push(r)),
      resume: () => {
        if (!resumed) this.#paused--;
        resumed = true;
      },
    };
  }
}

/** The switch authority, with its capabilities over the agent's store, keys, sessions and operations. */
function switchAuthority(p: HostSwitchParts, key: IdentityKey, client: IdentityClient, gate: StartGate, steps: Counter, refusals: Counter): SwitchAuthority {
  const keepCallToken = (token: string) => p.store.meta.set(META_TOKEN_HASH, hashToken("host-call", token));
  const authority: SwitchAuthority = new SwitchAuthority({
    record: new RecordFile(p.stateDir, p.hooks),
    floorClaimed: () => floorClaimed(p.stateDir, p.store),
    claimFloor: () => claimFloor(p.stateDir, p.store, p.version),
    proveForPrepare: (challenge) => {
      const hostId = p.hostId();
      const tokenHash = p.store.meta.get(META_TOKEN_HASH);
      if (hostId === null || tokenHash === null) throw new BerthError("conflict", "conflict: this agent never enrolled; it has no host to switch");
      // The key vouched for by the host's current credential: the coordinator records it only with both proofs.
      return { publicKey: key.publicKey, signature: key.prove("prepare", hostId, challenge), callProof: callProof(tokenHash, "prepare", hostId, challenge, key.publicKey) };
    },
    confirmPrepared: async () => {
      await client.renew();
    },
    pauseStarts: () => gate.pause(),
    learnGenerations: (generations) => {
      for (const [id, generation] of Object.entries(generations)) {
        const m = p.store.machines.get(id);
        if (m !== null && Number.isSafeInteger(generation) && generation > m.generation) p.store.machines.put({ ...m, generation, updatedAt: p.now() });
      }
    },
    planRetirement: (force) => planRetirement(p, force),
    retire: (plan) => retire(p, plan),
    leaveToken: p.dropToken,
    cloudCommit: async () => (await client.commit()).hostCallToken,
    keepCallToken,
    purge: () => purgeToken(p),
    sendStopped: async (owed) => (await client.stopped(owed)).moot,
    advertise: async () => {
      const owed = authority.owed().length;
      const got = await client.describe({ description: p.description(), step: authority.step() ?? "legacy", owed, version: p.version });
      keepCallToken(got.hostCallToken);
      await client.active(p.version);
    },
    onStep: (step, detail) => {
      steps.inc({ step });
      p.log.info({ step, ...(detail ?? {}) }, `identity: switch step ${step}`);
    },
    onRefusal: (reason) => {
      refusals.inc({ reason });
      p.log.warn({ reason }, `identity: switch refused or waiting (${reason})`);
    },
    hooks: p.hooks,
    log: p.log,
    now: p.now,
  });
  return authority;
}

/** The machines a retirement destroys, and what blocks it (sessions, borrow keys) unless forced. */
function planRetirement(p: HostSwitchParts, force: boolean): RetirementPlan {
  const machines: RetirementPlan["machines"] = [];
  const blockers: string[] = [];
  for (const m of p.store.machines.list(true)) {
    const retired = p.store.operations.get(retireOpId(m.id, m.generation));
    if (m.state === "destroyed" && retired === null) continue;
    machines.push({ machineId: m.id, generation: m.generation });
    if (force || m.state === "destroyed") continue;
    const sessions = p.sessions.count(m.id);
    const grantKeys = p.keys.list(m.id).filter((k) => k.mode === "grant").length;
    if (sessions > 0 || grantKeys > 0) blockers.push(`machine ${m.id} (${sessions} session(s), ${grantKeys} borrow key(s))`);
  }
  return { machines, blockers };
}

/** Destroys each planned machine (one operation id per machine and generation); a stopped report is owed for each. */
async function retire(p: HostSwitchParts, plan: RetirementPlan): Promise<{ stopped: StoppedReport[]; problem: string | null }> {
  const stopped: StoppedReport[] = [];
  const problems: string[] = [];
  for (const m of plan.machines) {
    const current: MachineRecord | null = p.store.machines.get(m.machineId);
    const generation = Math.max(m.generation, current?.generation ?? 0);
    try {
      await p.ops.run({ opId: retireOpId(m.machineId, generation), kind: "destroy", machineId: m.machineId, generation, args: {} });
      stopped.push({ machineId: m.machineId, generation });
      p.log.info({ machineId: m.machineId, generation }, "identity: sandbox retired; a stopped report is owed");
    } catch (e) {
      problems.push(`machine ${m.machineId}: ${errorMessage(e)}`);
    }
  }
  return { stopped, problem: problems.length === 0 ? null : `the retirement could not destroy ${problems.join("; ")}` };
}

/** The enroll token forgotten, and its file (if it came from one) removed durably. */
function purgeToken(p: HostSwitchParts): void {
  p.dropToken();
  if (p.tokenFile === null) return;
  try {
    unlinkSync(p.tokenFile);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT") return;
    throw new Error(`cannot remove the enroll token file ${p.tokenFile} (${(e as NodeJS.ErrnoException).code ?? "error"}); remove it by hand`);
  }
  const fd = openSync(dirname(p.tokenFile), "r");
  try {
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
  p.log.info({ file: p.tokenFile }, "identity: the enroll token file was removed");
}

/** Tick: the switch's next step, binding the key again after a reset, the credential's renewal. */
async function tick(p: HostSwitchParts, client: IdentityClient, authority: SwitchAuthority): Promise<void> {
  await authority.advance();
  if (client.awaitingReset && authority.step() !== null) {
    try {
      if (await p.rebind()) {
        client.awaitingReset = false;
        client.forget();
        await authority.rebound();
      }
    } catch (e) {
      p.log.warn({ error: errorMessage(e) }, "identity: binding the key again after the reset failed; retrying on the next tick");
    }
  }
  if (authority.mode() === "active") {
    try {
      await client.credential();
    } catch (e) {
      p.log.warn({ error: errorMessage(e) }, "identity: the host credential could not be renewed; retrying on the next tick");
    }
  }
}
