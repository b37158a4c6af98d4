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
import { hostname } from "node:os";
import { hashToken } from "../core/tokens.js";
import { checkFloor } from "./identity/floor.js";
import { META_TOKEN_HASH } from "./identity/host-switch.js";
import { silentLog } from "./log.js";
import type { AgentOptions, RunningAgent } from "./agent-options.js";
import { HostEnrollment } from "./host-enrollment.js";
import { checkDiskMode, probeDisk } from "./volume-disk.js";
import { agentOperations, hostSettings, offeredDisk, startAgentGateway, startAgentHttp, startLocal, Teardown } from "./startup.js";
import { AgentStore } from "./store/store.js";

export { DEFAULT_IMAGE_CACHE_MAX, type AgentOptions, type RunningAgent } from "./agent-options.js";
export { parseHostPort, sandboxView } from "./startup.js";

export const AGENT_VERSION = readVersion();

export async function startAgent(opts: AgentOptions): Promise<RunningAgent> {
  const log = opts.log ?? silentLog;
  const now = opts.now ?? Date.now;
  const { listen, sshListen, name, slots, vcpu, memoryMib } = hostSettings(opts);
  // 1. The store takes the state directory's lock.
  const store = AgentStore.open(opts.stateDir);
  const diskMib = offeredDisk(opts);
  // Probed before anything starts: under `required` a host that cannot limit a volume's disk refuses to start, saying why.
  const disk = { mode: opts.diskEnforce ?? "auto", cap: opts.diskEnforce === "off" ? ({ can: false, why: "--disk-enforce off" } as const) : probeDisk() };
  const teardown = new Teardown(log);
  teardown.push(() => store.close());
  try {
    // An agent built before the floor this state directory claimed would use the enroll token again.
    checkFloor(opts.stateDir, AGENT_VERSION);
    checkDiskMode(disk.mode, disk.cap);
    log.info({ diskEnforce: disk.mode, enforced: disk.cap.can, ...(disk.cap.can ? {} : { why: disk.cap.why }), diskMib }, "volume disk limit");
    if (opts.hostCallToken !== undefined) store.meta.set(META_TOKEN_HASH, hashToken("host-call", opts.hostCallToken));
    // 2–4. Runtime, images, keys, networks, recovery, guard.
    const local = await startLocal(opts, store, teardown, log, now);
    const { runtime, keys, network, recovery, guard, images } = local;
    // 5. The SSH gateway.
    const gateway = await startAgentGateway(opts, sshListen, store, local, teardown, log, now);
    const sessions = gateway.sessions;
    // 6. Operations, host identity and the HTTP API.
    const { volumes, ops } = agentOperations(opts.stateDir, store, local, gateway, log, now, disk);
    const advertised = opts.advertiseHost ?? (isWildcard(listen.host) ? hostname() : listen.host);
    const sshHost = opts.advertiseHost ?? (isWildcard(sshListen.host) ? hostname() : sshListen.host);
    const ssh = { host: sshHost, port: gateway.port, hostKey: gateway.hostKey, fingerprint: gateway.fingerprint };
    let url = "";
    const description = () => ({ url, runtime: runtime.kind, runtimeDetail: runtime.detail, capacity: { vcpu, memoryMib, diskMib, slots }, ssh });
    const enrollment = new HostEnrollment({ opts, name, version: AGENT_VERSION, store, keys, sessions, ops, description, log, now });
    const identity = enrollment.identity;
    const describe = () => ({ hostId: enrollment.hostId, name, runtime: runtime.kind, slots, version: AGENT_VERSION });
    const http = await startAgentHttp(opts, listen, { store, local, gateway, volumes, ops, identity, describe }, teardown, log, now);
    url = `http://${bracket(advertised)}:${http.port}`;
    // 7. Enrollment.
    teardown.push(() => enrollment.stop());
    const { enrolled } = await enrollment.start();

    log.info(
      {
        url,
        ssh: `${ssh.host}:${ssh.port}`,
        hostId: enrollment.hostId,
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
        return enrollment.hostId;
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
      stop: () => (stopping ??= teardown.run()),
    };
  } catch (e) {
    await teardown.run();
    throw e;
  }
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
