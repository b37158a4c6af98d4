/**
 * What `startAgent` (agent.ts) takes and gives: the agent's options and the
 * running agent.
 */
import type { SessionRegistry } from "./contracts.js";
import type { SshAdmissionLimits } from "./ssh/admission.js";
import type { HttpLimits } from "../http/admission.js";
import type { AgentKeys } from "./keys.js";
import type { AgentLog } from "./log.js";
import type { AgentOperations } from "./operations/dispatch.js";
import type { RecoveryReport } from "./recovery.js";
import type { GvisorChoice, RuntimeChoice } from "./runtime/index.js";
import type { ImageCache } from "./images/cache.js";
import type { RegistryOptions } from "./images/registry.js";
import type { Runtime } from "./runtime/types.js";
import type { AgentStore } from "./store/store.js";
import type { Volumes } from "./volumes.js";
import type { MachineNetworks, NetworkOptions } from "./network/manager.js";
import type { NetworkGuard } from "./network/guard.js";
import type { HostSwitch } from "./identity/host-switch.js";
import type { TestHooks } from "./identity/record.js";

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
  memoryMib?: number;
  /** Whether each volume's disk is limited by a mounted image (volume-disk.ts); default auto. */
  diskEnforce?: "required" | "auto" | "off";
  /** Disk offered to allocation volumes, MiB (default: free space of the volumes filesystem minus a reserve). */
  diskMib?: number;
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
