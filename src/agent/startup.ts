/**
 * The steps of `startAgent` (agent.ts), in its start-up order: the host's
 * settings, the local parts (runtime, image cache, key authority, machine
 * networks, the recovery sweep and the network guard), the SSH gateway, the
 * operations, and the HTTP API. Enrollment is host-enrollment.ts.
 *
 * Each step registers what undoes it with the agent's `Teardown`, so a start
 * that fails half way, or a stop, undoes exactly what was started, last first.
 */
import { existsSync, statfsSync } from "node:fs";
import { availableParallelism, hostname, totalmem } from "node:os";
import { join } from "node:path";
import { parseId } from "../core/ids.js";
import { defaultHostCapacity, defaultHostDisk } from "../core/host-capacity.js";
import { allocationMachineId } from "../core/allocation-access.js";
import { DEFAULT_IMAGE_CACHE_MAX, type AgentOptions } from "./agent-options.js";
import { META_TOKEN_HASH, type HostSwitch } from "./identity/host-switch.js";
import { startGateway, type Gateway } from "./ssh/gateway.js";
import { startHttp, type AgentHttp, type AgentIdentity } from "./http.js";
import { AgentKeys } from "./keys.js";
import { errorMessage, type AgentLog } from "./log.js";
import { AgentOperations } from "./operations/dispatch.js";
import { recover, type RecoveryReport } from "./recovery.js";
import { createRuntime, GvisorRuntime } from "./runtime/index.js";
import { ImageCache } from "./images/cache.js";
import { registerImageRoutes } from "./images/http.js";
import type { Runtime } from "./runtime/types.js";
import type { AgentStore } from "./store/store.js";
import { raiseStanding, readStanding } from "./standing.js";
import { registerAllocRoutes, type SandboxView } from "./alloc-http.js";
import { enforcementOf } from "./runtime/limits.js";
import { Volumes } from "./volumes.js";
import type { DiskCapability, DiskEnforceMode } from "./volume-disk.js";
import { MachineNetworks } from "./network/manager.js";
import { networkAvailability } from "./network/host.js";
import { DEFAULT_CHECK_INTERVAL_MS, NetworkGuard } from "./network/guard.js";
import { coordinatorServices } from "./network/coordinator.js";

type Address = { host: string; port: number };

/** What stopping undoes, last started first; a step that fails is logged and the others still run. */
export class Teardown {
  readonly #steps: Array<() => Promise<void> | void> = [];
  constructor(private readonly log: AgentLog) {}

  push(step: () => Promise<void> | void): void {
    this.#steps.push(step);
  }

  async run(): Promise<void> {
    for (const c of this.#steps.reverse()) {
      try {
        await c();
      } catch (e) {
        this.log.warn({ error: errorMessage(e) }, "agent shutdown step failed");
      }
    }
    this.#steps.length = 0;
  }
}

/** The host as the agent offers it: its addresses, its name and its capacity. */
export function hostSettings(opts: AgentOptions): { listen: Address; sshListen: Address; name: string; slots: number; vcpu: number; memoryMib: number } {
  const listen = parseHostPort(opts.listen ?? "127.0.0.1:0", "listen");
  const sshListen = parseHostPort(opts.sshListen ?? "127.0.0.1:0", "ssh listen");
  // The coordinator knows a host by this name (an id: re-enrolling under it keeps the host).
  const name = parseId(opts.name ?? (hostname().replace(/[^A-Za-z0-9_-]/g, "-").slice(0, 128) || "host"), "host name");
  // The host's real capacity minus a stated reserve, unless told otherwise (core/host-capacity.ts).
  const real = defaultHostCapacity(availableParallelism(), totalmem());
  return { listen, sshListen, name, slots: opts.slots ?? 4, vcpu: opts.vcpu ?? real.vcpu, memoryMib: opts.memoryMib ?? real.memoryMib };
}

/**
 * The disk this host offers to allocation volumes (MiB): `--disk`, or the
 * space free on the filesystem of its volumes directory minus a stated
 * reserve (core/host-capacity.ts). Read once the state directory exists.
 */
export function offeredDisk(opts: AgentOptions): number {
  if (opts.diskMib !== undefined) return opts.diskMib;
  const volumes = join(opts.stateDir, "volumes");
  const fs = statfsSync(existsSync(volumes) ? volumes : opts.stateDir);
  return defaultHostDisk(fs.bavail * fs.bsize, fs.blocks * fs.bsize);
}

export function parseHostPort(s: string, what: string): Address {
  const m = /^(?:\[([^\]]+)\]|([^:]*)):(\d{1,5})$/.exec(s.trim());
  const host = m?.[1] ?? m?.[2];
  const port = Number(m?.[3]);
  if (m === null || host === undefined || host === "" || !Number.isInteger(port) || port > 65535) {
    throw new Error(`invalid ${what} address ${JSON.stringify(s)}; use HOST:PORT, e.g. 127.0.0.1:7400 (port 0 picks a free one)`);
  }
  return { host, port };
}

export interface LocalParts {
  runtime: Runtime;
  images: ImageCache | null;
  keys: AgentKeys;
  network: MachineNetworks | { unavailable: string };
  /** The agent's own ports, which machine networks keep machines from: filled in as its listeners start. */
  ports: Array<{ host: string; port: number; why: string }>;
  recovery: RecoveryReport;
  guard: NetworkGuard | null;
}

/** Steps 2–4: the runtime and its image cache, the key authority, machine networks, the recovery sweep, the network guard. */
export async function startLocal(opts: AgentOptions, store: AgentStore, teardown: Teardown, log: AgentLog, now: () => number): Promise<LocalParts> {
  const runtime = createRuntime(opts.runtime ?? "auto", opts.stateDir, opts.gvisor);
  if (runtime.kind === "process") {
    log.warn({ runtime: runtime.kind }, "runtime: process (plain child processes in a directory, NO isolation)");
  }
  if (runtime.detail.warning) log.warn({ runtime: runtime.kind, runsc: runtime.detail.runsc }, runtime.detail.warning);
  if (runtime instanceof GvisorRuntime) log.info({ platform: runtime.runscInfo.platform, why: runtime.runscInfo.platformWhy }, `gvisor platform ${runtime.runscInfo.platform}: ${runtime.runscInfo.platformWhy}`);
  // Images boot on gvisor only; what an interrupted pull left is removed first.
  const images = runtime instanceof GvisorRuntime
    ? new ImageCache({ stateDir: opts.stateDir, maxBytes: opts.images?.maxBytes ?? DEFAULT_IMAGE_CACHE_MAX, registry: opts.images?.registry ?? {}, inUse: () => runtime.imagesInUse(), log, now })
    : null;
  if (images) {
    const swept = images.sweep();
    if (swept > 0) log.info({ swept }, "image cache: removed what interrupted pulls left");
  }
  const keys = new AgentKeys({ store, now, log });
  teardown.push(() => keys.close());
  // Machine networks: the agent's own ports are known once its listeners run.
  const ports: LocalParts["ports"] = [];
  const coordinator = opts.coordinatorUrl !== undefined ? await coordinatorServices(opts.coordinatorUrl) : [];
  const avail = opts.network === false ? { ok: false as const, why: "disabled on this agent" } : networkAvailability();
  const network: MachineNetworks | { unavailable: string } = avail.ok
    ? new MachineNetworks({ records: store.networks, stateDir: opts.stateDir, log, now, agentPorts: () => ports, coordinator: () => coordinator }, opts.network || {})
    : { unavailable: avail.why };
  if (network instanceof MachineNetworks) teardown.push(() => network.close());
  const recovery = await recover({ store, runtime, keys, now, log, network: network instanceof MachineNetworks ? network : null });
  const guard = network instanceof MachineNetworks ? new NetworkGuard({ network, store, keys, runtime, log, now }, { maxEvidenceAgeMs: opts.networkCheck?.maxEvidenceAgeMs }) : null;
  if (guard) {
    guard.start(opts.networkCheck?.intervalMs ?? DEFAULT_CHECK_INTERVAL_MS);
    teardown.push(() => guard.stop());
  }
  return { runtime, images, keys, network, ports, recovery, guard };
}

/** Step 5: the SSH gateway (its own session recovery first). */
export async function startAgentGateway(opts: AgentOptions, sshListen: Address, store: AgentStore, local: LocalParts, teardown: Teardown, log: AgentLog, now: () => number): Promise<Gateway> {
  const gateway = await startGateway({
    hostKeyPath: join(opts.stateDir, "ssh_host_ed25519_key"),
    listen: sshListen,
    keys: local.keys,
    runtime: local.runtime,
    now,
    log,
    sessionStore: store.sessions,
    ...(opts.sshAdmission ? { admission: opts.sshAdmission } : {}),
  });
  teardown.push(() => gateway.close());
  local.ports.push({ host: sshListen.host, port: gateway.port, why: "agent SSH gateway" });
  return gateway;
}

/** Step 6, first half: the allocation volumes (recovered) and the operations the coordinator runs. */
export function agentOperations(
  stateDir: string,
  store: AgentStore,
  local: LocalParts,
  gateway: Gateway,
  log: AgentLog,
  now: () => number,
  disk: { mode: DiskEnforceMode; cap: DiskCapability },
): { volumes: Volumes; ops: AgentOperations } {
  const { runtime, keys, network, images, guard } = local;
  const volumes = new Volumes({ stateDir, records: store.volumes, now, log, disk });
  volumes.recover();
  const ops = new AgentOperations({
    store, keys, runtime, sessions: gateway.sessions, network, volumes, images, now, log,
    ...(guard ? { lendCheck: (id: string) => guard.lendCheck(id), retire: (id: string, v: Parameters<NetworkGuard["retire"]>[1]) => guard.retire(id, v) } : {}),
    workspacePath: (machineId) => join(stateDir, "machines", machineId, "workspace"),
    enforcement: (vcpu, memoryMib) => enforcementOf(runtime, vcpu, memoryMib),
  });
  return { volumes, ops };
}

/** Step 6, second half: the HTTP API (operations gated by host identity when there is one; the allocation and image routes). */
export async function startAgentHttp(
  opts: AgentOptions,
  listen: Address,
  parts: { store: AgentStore; local: LocalParts; gateway: Gateway; volumes: Volumes; ops: AgentOperations; identity: HostSwitch | null; describe: () => AgentIdentity },
  teardown: Teardown,
  log: AgentLog,
  now: () => number,
): Promise<AgentHttp> {
  const { store, local, volumes, ops, identity } = parts;
  const { runtime, keys, recovery, guard, images } = local;
  const http = await startHttp(
    {
      ops: identity?.gatedOps ?? ops,
      identitySwitch: identity,
      store,
      keys,
      sessions: parts.gateway.sessions,
      identity: parts.describe,
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
  teardown.push(() => http.close());
  local.ports.push({ host: listen.host, port: http.port, why: "agent API" });
  return http;
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
