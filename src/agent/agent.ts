/**
 * `berth agent`: the host daemon, wired together.
 *
 * Start-up order, and why:
 *   1. the local store, which takes the state directory's lock: a second
 *      agent on the same directory refuses here, before touching anything;
 *   2. the runtime (sandboxes under the state directory);
 *   3. the key authority, empty;
 *   4. the recovery sweep: re-attaches machines whose record matches, loads
 *      their keys (expired ones dropped), reports the rest, signals nothing;
 *   5. the SSH gateway (its own session recovery first), so keys authenticate
 *      only once recovery decided which machines are this agent's;
 *   6. operations and the HTTP API;
 *   7. enrollment with the coordinator, which needs the API's URL and the
 *      gateway's address and host key. A coordinator that cannot be reached
 *      is retried in the background: the agent keeps enforcing key expiry and
 *      serving SSH without it. A coordinator that refuses (4xx) stops the start.
 *
 * Stopping closes the API, the gateway, the key timers and the store (its
 * lock). Machines keep running; the next start re-attaches them.
 */
import { readFileSync } from "node:fs";
import { availableParallelism, hostname, totalmem } from "node:os";
import { join } from "node:path";
import { parseId } from "../core/ids.js";
import { hashToken } from "../core/tokens.js";
import { checkFloor } from "./identity/floor.js";
import { createHostSwitch, META_HOST_ID, META_TOKEN_HASH, type HostSwitch } from "./identity/host-switch.js";
import { envHooks, type TestHooks } from "./identity/record.js";
import { CoordinatorRefusal } from "./identity/coordinator.js";
import type { SessionRegistry } from "./contracts.js";
import { enroll, EnrollRefusedError, readEnrollToken, type EnrollRequest } from "./enroll.js";
import { startGateway, type Gateway } from "./ssh/gateway.js";
import type { SshAdmissionLimits } from "./ssh/admission.js";
import type { HttpLimits } from "../http/admission.js";
import { startHttp, type AgentHttp } from "./http.js";
import { AgentKeys } from "./keys.js";
import { errorMessage, silentLog, type AgentLog } from "./log.js";
import { AgentOperations } from "./operations/dispatch.js";
import { recover, type RecoveryReport } from "./recovery.js";
import { createRuntime, GvisorRuntime, type GvisorChoice, type RuntimeChoice } from "./runtime/index.js";
import { ImageCache } from "./images/cache.js";
import { registerImageRoutes } from "./images/http.js";
import type { RegistryOptions } from "./images/registry.js";
import type { Runtime } from "./runtime/types.js";
import { allocationMachineId } from "../core/allocation-access.js";
import { AgentStore } from "./store/store.js";
import { raiseStanding, readStanding } from "./standing.js";
import { defaultHostCapacity } from "../core/host-capacity.js";
import { registerAllocRoutes, type SandboxView } from "./alloc-http.js";
import { enforcementOf } from "./runtime/limits.js";
import { Volumes } from "./volumes.js";
import { MachineNetworks, type NetworkOptions } from "./network/manager.js";
import { networkAvailability } from "./network/host.js";
import { DEFAULT_CHECK_INTERVAL_MS, NetworkGuard } from "./network/guard.js";
import { coordinatorServices } from "./network/coordinator.js";

export interface AgentOptions {
  /** The agent's own directory: store, machines, host key. One agent per directory. */
  stateDir: string;
  /** Where to enroll; omitted for an agent driven in-process (berth up, tests). */
  coordinatorUrl?: string;
  /** The raw enroll token (from BERTH_ENROLL_TOKEN, or given in-process; never argv). */
  enrollToken?: string;
  /**
   * The file holding the enroll token, read only when the agent needs it
   * (never once the host switched to its identity key, which removes it).
   */
  enrollTokenFile?: string;
  /**
   * Enroll the way agents did before host identity (no identity proof): a
   * fresh host then stays on the shared token until it is switched. For
   * tests of the switch; BERTH_TEST_HOOKS=1 with BERTH_TEST_LEGACY_ENROLL=1
   * sets it for a child agent.
   */
  legacyEnroll?: boolean;
  /** Fault and crash points of the switch record (tests); default from the environment (record.ts envHooks). */
  identityHooks?: TestHooks;
  /** How often the switch, owed reports and the credential are looked at (default 5 s). */
  identityTickMs?: number;
  /** host:port of the HTTP API; default 127.0.0.1:0. */
  listen?: string;
  /** host:port of the SSH gateway; default 127.0.0.1:0. */
  sshListen?: string;
  /** Host name the coordinator and clients should use, when the listen address is a wildcard. */
  advertiseHost?: string;
  runtime?: RuntimeChoice;
  /** The runsc binary and gVisor platform of the gvisor runtime (default: runsc on PATH, the fastest platform). */
  gvisor?: GvisorChoice;
  /** The image cache (gvisor hosts): its size limit (default 20 GiB) and how registries are reached (docs/images.md). */
  images?: { maxBytes?: number; registry?: RegistryOptions };
  slots?: number;
  vcpu?: number;
  memoryMb?: number;
  name?: string;
  log?: AgentLog;
  /** The clock (epoch ms) that decides key expiry. */
  now?: () => number;
  /**
   * A host-call token accepted without enrollment (an embedded coordinator in
   * the same process, or a test). Only its hash is kept.
   */
  hostCallToken?: string;
  /**
   * Network policies (docs/network.md): options of the machine networks, or
   * false to refuse every `egress` machine. Default: enabled where the host
   * allows it (Linux, root, `ip` and `nft`).
   */
  network?: NetworkOptions | false;
  /** The lend-time and periodic network checks (network/guard.ts): check interval (0: none) and the probe evidence's maximum age. */
  networkCheck?: { intervalMs?: number; maxEvidenceAgeMs?: number };
  /** The API's timeouts, connection caps and unauthenticated rate (src/http/admission.ts); unset fields take the defaults. */
  httpLimits?: Partial<HttpLimits>;
  /** The SSH gateway's authentication timeout and caps on unauthenticated connections (ssh/admission.ts). */
  sshAdmission?: Partial<SshAdmissionLimits>;
}

/** The image cache's default limit (`berth agent --image-cache-max`). */
export const DEFAULT_IMAGE_CACHE_MAX = 20 * 2 ** 30;

export interface RunningAgent {
  url: string;
  /** Null until the agent has enrolled once. */
  hostId: string | null;
  name: string;
  runtime: Runtime;
  ssh: { host: string; port: number; hostKey: string; fingerprint: string };
  recovery: RecoveryReport;
  store: AgentStore;
  keys: AgentKeys;
  /** The operations the coordinator runs (src/agent/operations/). */
  ops: AgentOperations;
  /** Allocation workspace volumes. */
  volumes: Volumes;
  sessions: SessionRegistry;
  /** Machine networks, or why this agent has none. */
  network: MachineNetworks | { unavailable: string };
  /** The lend-time and periodic checks of machine networks (null: no machine networks here). */
  guard: NetworkGuard | null;
  /** The image cache (null: this runtime boots no images). */
  images: ImageCache | null;
  /** Settles once enrolled (or at once without a coordinator); never rejects. */
  enrolled: Promise<void>;
  /** Host identity (null without a coordinator). */
  identity: HostSwitch | null;
  stop(): Promise<void>;
}

export const AGENT_VERSION = readVersion();


export async function startAgent(opts: AgentOptions): Promise<RunningAgent> {
  const log = opts.log ?? silentLog;
  const now = opts.now ?? Date.now;
  const listen = parseHostPort(opts.listen ?? "127.0.0.1:0", "listen");
  const sshListen = parseHostPort(opts.sshListen ?? "127.0.0.1:0", "ssh listen");
  // The coordinator knows a host by this name (an id: re-enrolling under it keeps the host).
  const name = parseId(opts.name ?? (hostname().replace(/[^A-Za-z0-9_-]/g, "-").slice(0, 128) || "host"), "host name");
  const slots = opts.slots ?? 4;
  // The host's real capacity minus a stated reserve, unless told otherwise (core/host-capacity.ts).
  const real = defaultHostCapacity(availableParallelism(), totalmem());
  const vcpu = opts.vcpu ?? real.vcpu;
  const memoryMb = opts.memoryMb ?? real.memoryMb;

  const store = AgentStore.open(opts.stateDir);
  const cleanups: Array<() => Promise<void> | void> = [() => store.close()];
  const teardown = async (): Promise<void> => {
    for (const c of cleanups.reverse()) {
      try {
        await c();
      } catch (e) {
        log.warn({ error: errorMessage(e) }, "agent shutdown step failed");
      }
    }
    cleanups.length = 0;
  };

  try {
    // An agent built before the floor this state directory claimed would use the enroll token again.
    checkFloor(opts.stateDir, AGENT_VERSION);
    if (opts.hostCallToken !== undefined) store.meta.set(META_TOKEN_HASH, hashToken("host-call", opts.hostCallToken));
    const runtime = createRuntime(opts.runtime ?? "auto", opts.stateDir, opts.gvisor);
    if (runtime.kind === "process") {
      log.warn({ runtime: runtime.kind }, "runtime: process (plain child processes in a directory, NO isolation)");
    }
    if (runtime.detail.warning) log.warn({ runtime: runtime.kind, runsc: runtime.detail.runsc }, runtime.detail.warning);
    // Images boot on gvisor only; what an interrupted pull left is removed first.
    const images = runtime instanceof GvisorRuntime
      ? new ImageCache({ stateDir: opts.stateDir, maxBytes: opts.images?.maxBytes ?? DEFAULT_IMAGE_CACHE_MAX, registry: opts.images?.registry ?? {}, inUse: () => runtime.imagesInUse(), log, now })
      : null;
    if (images) {
      const swept = images.sweep();
      if (swept > 0) log.info({ swept }, "image cache: removed what interrupted pulls left");
    }
    const keys = new AgentKeys({ store, now, log });
    cleanups.push(() => keys.close());
    // Machine networks: the agent's own ports are known once its listeners run.
    const ports: Array<{ host: string; port: number; why: string }> = [];
    const coordinator = opts.coordinatorUrl !== undefined ? await coordinatorServices(opts.coordinatorUrl) : [];
    const avail = opts.network === false ? { ok: false as const, why: "disabled on this agent" } : networkAvailability();
    const network: MachineNetworks | { unavailable: string } = avail.ok
      ? new MachineNetworks({ records: store.networks, stateDir: opts.stateDir, log, now, agentPorts: () => ports, coordinator: () => coordinator }, opts.network || {})
      : { unavailable: avail.why };
    if (network instanceof MachineNetworks) cleanups.push(() => network.close());
    const recovery = await recover({ store, runtime, keys, now, log, network: network instanceof MachineNetworks ? network : null });
    const guard = network instanceof MachineNetworks ? new NetworkGuard({ network, store, keys, runtime, log, now }, { maxEvidenceAgeMs: opts.networkCheck?.maxEvidenceAgeMs }) : null;
    if (guard) {
      guard.start(opts.networkCheck?.intervalMs ?? DEFAULT_CHECK_INTERVAL_MS);
      cleanups.push(() => guard.stop());
    }

    const gateway: Gateway = await startGateway({
      hostKeyPath: join(opts.stateDir, "ssh_host_ed25519_key"),
      listen: sshListen,
      keys,
      runtime,
      now,
      log,
      sessionStore: store.sessions,
      ...(opts.sshAdmission ? { admission: opts.sshAdmission } : {}),
    });
    cleanups.push(() => gateway.close());
    const sessions = gateway.sessions;

    ports.push({ host: sshListen.host, port: gateway.port, why: "agent SSH gateway" });
    const volumes = new Volumes({ stateDir: opts.stateDir, records: store.volumes, now, log });
    volumes.recover();
    const ops = new AgentOperations({
      store, keys, runtime, sessions, network, volumes, images, now, log,
      ...(guard ? { lendCheck: (id: string) => guard.lendCheck(id), retire: (id: string, v: Parameters<NetworkGuard["retire"]>[1]) => guard.retire(id, v) } : {}),
      workspacePath: (machineId) => join(opts.stateDir, "machines", machineId, "workspace"),
      enforcement: (vcpu, memoryMib) => enforcementOf(runtime, vcpu, memoryMib),
    });
    let hostId = store.meta.get(META_HOST_ID);
    const advertised = opts.advertiseHost ?? (isWildcard(listen.host) ? hostname() : listen.host);
    const sshHost = opts.advertiseHost ?? (isWildcard(sshListen.host) ? hostname() : sshListen.host);
    const ssh = { host: sshHost, port: gateway.port, hostKey: gateway.hostKey, fingerprint: gateway.fingerprint };
    let url = "";
    const description = () => ({ url, runtime: runtime.kind, runtimeDetail: runtime.detail, capacity: { vcpu, memoryMib: memoryMb, slots }, ssh });

    // ---- host identity ------------------------------------------------------
    // The enroll token: given, or read from its file only when needed.
    let token: string | null = opts.enrollToken ?? null;
    let tokenDropped = false;
    const enrollToken = (): string | null => {
      if (tokenDropped) return null;
      if (token === null && opts.enrollTokenFile !== undefined) token = readEnrollToken(opts.enrollTokenFile, {});
      return token;
    };
    const identity: HostSwitch | null =
      opts.coordinatorUrl === undefined
        ? null
        : createHostSwitch({
            stateDir: opts.stateDir,
            coordinatorUrl: opts.coordinatorUrl,
            store,
            keys,
            sessions,
            ops,
            tokenFile: opts.enrollTokenFile ?? null,
            dropToken: () => {
              tokenDropped = true;
              token = null;
            },
            hostId: () => hostId,
            description,
            rebind: async () => {
              // The reset's one-time token, read afresh (the switch forgot the old one; its file may hold the new one).
              const fresh = opts.enrollTokenFile !== undefined ? readEnrollToken(opts.enrollTokenFile, {}) : (opts.enrollToken ?? null);
              if (fresh === null || opts.coordinatorUrl === undefined) {
                log.warn({ hostId }, "identity: an operator reset this host's identity; start the agent with the one-time enroll token `berth host reset-identity` printed (--enroll-token-file) to bind its key again");
                return false;
              }
              await enrollOnce(fresh, opts.coordinatorUrl, true);
              return true;
            },
            version: AGENT_VERSION,
            hooks: opts.identityHooks ?? envHooks(process.env),
            log,
            now,
          });
    const http: AgentHttp = await startHttp(
      {
        ops: identity?.gatedOps ?? ops,
        identitySwitch: identity,
        store,
        keys,
        sessions,
        identity: () => ({ hostId, name, runtime: runtime.kind, slots, version: AGENT_VERSION }),
        tokenHash: () => store.meta.get(META_TOKEN_HASH),
        unrecorded: () => recovery.unrecorded,
        ...(guard ? { lendCheck: (id: string) => guard.lendCheck(id) } : {}),
        log,
        ...(opts.httpLimits ? { limits: opts.httpLimits } : {}),
        extraRoutes: (app, auth) => {
          registerAllocRoutes(app, auth, {
            holds: store.holds, records: store.volumes, volumes, now,
            setStanding: async (next) => {
              store.transaction(() => raiseStanding(store.meta, next));
              await ops.launchesSettled();
              return readStanding(store.meta);
            },
            sandbox: (allocationId) => sandboxView(store, runtime, allocationId),
          });
          registerImageRoutes(app, auth, images);
        },
      },
      listen,
    );
    cleanups.push(() => http.close());
    ports.push({ host: listen.host, port: http.port, why: "agent API" });

    url = `http://${bracket(advertised)}:${http.port}`;

    // ---- enrollment --------------------------------------------------------
    let stopped = false;
    let wake: (() => void) | null = null;
    cleanups.push(() => {
      stopped = true;
      wake?.();
    });
    const body = (): EnrollRequest => ({ name, ...description() });
    const legacyEnroll = opts.legacyEnroll ?? (process.env.BERTH_TEST_HOOKS === "1" && process.env.BERTH_TEST_LEGACY_ENROLL === "1");
    /**
     * One enrollment with the enroll token: with an identity proof, unless told to enroll the old way.
     * `rebind`: the host's identity was reset by an operator and the token is the reset's one-time
     * token; the enrollment binds this agent's key (it is made whatever the switch record says).
     */
    const enrollOnce = async (raw: string, coordinator: string, rebind = false): Promise<void> => {
      if (!rebind && identity !== null && !identity.authority.mayUseToken()) return;
      const proof = identity !== null && (rebind || !legacyEnroll) ? await proofIfKnown(identity, name, log) : undefined;
      let got;
      try {
        got = await enroll(coordinator, raw, body(), proof);
      } catch (e) {
        if (!rebind && e instanceof EnrollRefusedError && e.code === "host_exists" && hostId !== null && store.meta.get(META_TOKEN_HASH) !== null) {
          // The enroll token only creates hosts: this one exists, and this state directory holds its enrollment.
          log.warn(
            { hostId, name },
            "the coordinator already has this host; keeping the enrollment this state directory holds (the enroll token only creates new hosts). " +
              "The coordinator calls the host at the address it enrolled with: if that changed, an operator runs `berth host reset-identity` and the agent starts with the one-time enroll token it prints",
          );
          return;
        }
        throw e;
      }
      if (hostId !== null && got.hostId !== hostId) {
        throw new EnrollRefusedError(
          409,
          "conflict",
          `the coordinator enrolled this agent as host ${got.hostId}, but its state directory ${opts.stateDir} belongs to host ${hostId}; ` +
            "use a fresh --state-dir for a new host, or ask the coordinator's operator to restore the host",
        );
      }
      store.transaction(() => {
        store.meta.set(META_HOST_ID, got.hostId);
        store.meta.set(META_TOKEN_HASH, hashToken("host-call", got.hostCallToken));
      });
      hostId = got.hostId;
      log.info({ hostId, coordinator: new URL(coordinator).origin, identity: got.identity ?? "legacy", rebind }, "enrolled with the coordinator");
      // The coordinator recorded this host's identity key: it is active from the start.
      if (got.identity === "active" && identity !== null && !rebind) await identity.authority.enrolledActive();
    };

    let enrolled: Promise<void> = Promise.resolve();
    if (opts.coordinatorUrl !== undefined && identity !== null) {
      const coordinator = opts.coordinatorUrl;
      if (!identity.authority.mayUseToken()) {
        // Past the local commit (or enrolled with the key): the enroll token is never used again.
        log.info({ hostId, step: identity.authority.step() }, "identity: this host uses its identity key; the enroll token is not used");
        enrolled = identity.authority.advance();
      } else {
        const raw = enrollToken();
        if (raw === null) {
          if (store.meta.get(META_TOKEN_HASH) === null) {
            throw new Error(
              "no enroll token: give --enroll-token-file FILE or set BERTH_ENROLL_TOKEN (the agent never enrolled from this state directory)",
            );
          }
          log.info({ hostId }, "no enroll token given: keeping the enrollment this state directory already has");
        } else {
          try {
            await enrollOnce(raw, coordinator);
          } catch (e) {
            if (e instanceof EnrollRefusedError) throw e;
            log.warn({ error: errorMessage(e) }, "enrollment failed; retrying in the background");
            enrolled = (async () => {
              let delay = 1000;
              while (!stopped) {
                await new Promise<void>((resolve) => {
                  const t = setTimeout(resolve, delay);
                  wake = () => {
                    clearTimeout(t);
                    resolve();
                  };
                });
                if (stopped || !identity.authority.mayUseToken()) return;
                const again = enrollToken();
                if (again === null) return;
                try {
                  await enrollOnce(again, coordinator);
                  return;
                } catch (e2) {
                  log.warn({ error: errorMessage(e2) }, "enrollment failed; retrying");
                  if (e2 instanceof EnrollRefusedError) return;
                  delay = Math.min(delay * 2, 30_000);
                }
              }
            })();
          }
        }
      }
      // The switch's tick: owed reports, the next step, the credential's renewal.
      const testTick = process.env.BERTH_TEST_HOOKS === "1" ? Number(process.env.BERTH_TEST_IDENTITY_TICK_MS) : NaN;
      const tickMs = opts.identityTickMs ?? (Number.isFinite(testTick) && testTick > 0 ? testTick : 5_000);
      let ticking: Promise<void> | null = null;
      const timer = setInterval(() => {
        ticking ??= identity.tick().finally(() => (ticking = null));
      }, tickMs);
      timer.unref();
      cleanups.push(async () => {
        clearInterval(timer);
        await ticking;
      });
    }

    log.info(
      {
        url,
        ssh: `${ssh.host}:${ssh.port}`,
        hostId,
        runtime: runtime.kind,
        ...runtime.detail,
        machines: store.machines.list().length,
        hostKeyFingerprint: ssh.fingerprint,
      },
      "berth agent ready",
    );

    let stopping: Promise<void> | null = null;
    return {
      url,
      get hostId() {
        return hostId;
      },
      name,
      runtime,
      ssh,
      recovery,
      store,
      keys,
      ops,
      volumes,
      sessions,
      network,
      guard,
      images,
      enrolled,
      identity,
      stop: () => (stopping ??= teardown()),
    };
  } catch (e) {
    await teardown();
    throw e;
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

export function parseHostPort(s: string, what: string): { host: string; port: number } {
  const m = /^(?:\[([^\]]+)\]|([^:]*)):(\d{1,5})$/.exec(s.trim());
  const host = m?.[1] ?? m?.[2];
  const port = Number(m?.[3]);
  if (m === null || host === undefined || host === "" || !Number.isInteger(port) || port > 65535) {
    throw new Error(`invalid ${what} address ${JSON.stringify(s)}; use HOST:PORT, e.g. 127.0.0.1:7400 (port 0 picks a free one)`);
  }
  return { host, port };
}

function isWildcard(host: string): boolean {
  return host === "0.0.0.0" || host === "::" || host === "";
}

function bracket(host: string): string {
  return host.includes(":") ? `[${host}]` : host;
}

function readVersion(): string {
  try {
    const pkg = JSON.parse(readFileSync(new URL("../../../package.json", import.meta.url), "utf8")) as { version?: unknown };
    return typeof pkg.version === "string" ? pkg.version : "unknown";
  } catch {
    return "unknown";
  }
}

/** The allocation's sandbox as the runtime sees it now (GET /v1/agent/holds/{id}/sandbox). */
export async function sandboxView(store: AgentStore, runtime: Runtime, allocationId: string): Promise<SandboxView> {
  const machineId = allocationMachineId(allocationId);
  const m = store.machines.get(machineId);
  const view = (sandbox: SandboxView["sandbox"], why: string | null): SandboxView => ({ allocationId, machineId, sandbox, why });
  if (m === null || (m.state !== "running" && m.state !== "mismatch")) return view("none", m === null ? "no machine of it on this host" : `machine ${m.state}`);
  if (m.state === "mismatch") return view("mismatch", m.mismatch ?? "unknown");
  const now = await runtime.incarnation(machineId);
  if (now === m.incarnation) return view("running", null);
  return view("stopped", now === null
    ? `the sandbox is not running (recorded incarnation ${m.incarnation ?? "none"}): killed from outside, e.g. by its memory limit, or ended`
    : `the runtime runs incarnation ${now}, not the recorded ${m.incarnation ?? "none"}`);
}
