/**
 * The runtime contract: what the host agent needs from a sandbox technology.
 * Two implementations pass one contract suite (test/agent/runtime-contract):
 *   - process: a machine is a directory; commands are plain child processes.
 *     No isolation at all; for a laptop, a test, or trusted CI.
 *   - gvisor: one runsc sandbox per machine; read-only base root, a writable
 *     layer thrown away by scrub, a workspace directory, no network.
 *
 * Every method is idempotent on the machine id, so an agent operation retried
 * with the same operation id (after a crash or a lost reply) never acts twice.
 */
import type { Readable, Writable } from "node:stream";

export type RuntimeKind = "process" | "gvisor";

/** What a host reports of its runtime beside the kind (enrollment, `berth host ls`, the dashboard). */
export interface RuntimeDetail {
  /** gvisor: the runsc release and the platform its sandboxes use. */
  runsc?: { version: string; platform: string };
  /** One line naming what does not work with this runtime here (an old runsc), if anything. */
  warning?: string;
}

/** What the agent records about a started machine, enough to recognise it exactly after a restart. */
export interface RuntimeMachine {
  machineId: string;
  /** A fresh boot id on every start and every fence; readable inside the machine (BERTH_INCARNATION). */
  incarnation: string;
  /** Host path of the machine's workspace directory (HOME / cwd inside it). */
  workspace: string;
  /** Runtime-specific exact identity (e.g. runsc container id + sandbox pid + start time). */
  identity: Record<string, string | number>;
}

export interface PtyRequest {
  cols: number;
  rows: number;
  term: string;
}

export interface ExecRequest {
  /** null runs the machine's login shell. */
  argv: string[] | null;
  /** Extra environment, already filtered through the agent's allowlist. */
  env: Record<string, string>;
  pty?: PtyRequest;
}

/** Exact identity of a process: pid + kernel start time (clock ticks since boot) + process group. */
export interface ProcessIdentity {
  pid: number;
  startTime: number;
  pgid: number;
}

export interface ExecHandle {
  /** The machine incarnation the command runs in; a fence ends it. */
  incarnation: string;
  /** Host identity of the process the agent spawned (the child itself, or the `runsc exec` client). */
  client: ProcessIdentity;
  /** Identity of the command's group leader as seen by the runtime (in-sandbox pid for gvisor). */
  leader: ProcessIdentity;
  /** Without a PTY: the three pipes. With a PTY: stdout carries the merged stream, stderr is empty. */
  stdin: Writable;
  stdout: Readable;
  stderr: Readable;
  /** Set the PTY size on the master, then SIGWINCH to the group (PTY sessions only). */
  resize(cols: number, rows: number): void;
  /** Signal the command's exact process group; refused (returns false) if the leader identity no longer matches. */
  signalGroup(signal: NodeJS.Signals): Promise<boolean>;
  /**
   * A terminal signal (SSH INT/QUIT/TSTP) delivered as the keyboard would: with a PTY, to the
   * terminal's foreground process group (with job control that is the foreground job, not the
   * shell's group); without a PTY, to the command's own group. Refused (false) when the leader
   * identity no longer matches; a group that cannot be verified as the foreground group of the
   * leader's terminal is never signalled.
   */
  signalForeground(signal: NodeJS.Signals): Promise<boolean>;
  /**
   * Kill the exec client (the host process the agent spawned) if it is still the
   * exact recorded process; false if it is already gone. Part of session release
   * after the group was signalled.
   */
  killClient(signal?: NodeJS.Signals): boolean;
  /** Resolves once with the exit status, after the client is reaped. */
  exited: Promise<{ code: number | null; signal: string | null }>;
  /** Stop reading output (backpressure) / resume. */
  pause(): void;
  resume(): void;
}

/**
 * An image a machine boots from (src/agent/images/cache.ts): a root
 * directory, read-only underneath the sandbox's writable memory overlay, and
 * what its config says commands run with.
 */
export interface BootImage {
  /** The cache's id (the config digest's hex); null for a root directory used as it is (`dir:`). */
  id: string | null;
  /** The reference, in its canonical spelling. */
  ref: string;
  /** The manifest (or index) digest it was pulled by, where it has one. */
  digest: string | null;
  /** Host path of the root filesystem. */
  rootfs: string;
  /** The image's Env; PATH and HOME from it replace the runtime's defaults. */
  env: Record<string, string>;
  /** cwd of every command (null: /workspace). */
  workingDir: string | null;
  user: { uid: number; gid: number; additionalGids: number[]; name: string; home: string | null };
  /** The login shell inside (/bin/bash where the image has it, else /bin/sh). */
  shell: string;
}

/**
 * How a machine is created: with `network`, every process of it runs in that
 * network namespace; with `resources` (allocations: the size's exact grant),
 * vCPU and memory are enforced (gvisor: cgroup limits and the sandbox's CPU
 * count and memory size; process: not enforced).
 */
/** Why a forward to a machine of a pool with `--forwarding off` is refused. */
export function forwardingOff(machineId: string): string {
  return `machine ${machineId} belongs to a pool with forwarding off (berth pool ensure --forwarding off); forwards to its ports are refused`;
}

export interface CreateOptions {
  resources?: { vcpu: number; memoryMib: number };
  /** "off": the pool refuses forwards to this machine's ports (forwardRefusal says so). Kept in the record; absent: allowed. */
  forwarding?: "off";
  /** "workspace": the pool confines SFTP to the machine's workspace (filesScope says so). Kept in the record; absent: the machine's whole view. */
  files?: "workspace";
  /** The image the machine boots (gvisor only; absent: the host's root). Kept for every restart. */
  image?: BootImage;
  network?: {
    /** Name of the namespace under /run/netns. */
    netns: string;
    /** Its inode when set up: a sandbox started in another namespace of the same name is restarted. */
    inode: string;
    /** The machine's own unprivileged uid (= gid) on this host: the process runtime runs every command as it. */
    uid: number;
    /** Files bound over /etc/hosts and /etc/resolv.conf (gvisor; the process runtime uses `ip netns exec`'s /etc/netns). */
    hosts: string;
    resolvConf: string;
  };
}

export interface FenceProof {
  /** The new incarnation after the fence. */
  incarnation: string;
  /** How absence was proven, e.g. "sandbox restarted: incarnation A -> B" or "3 groups reaped, 0 processes remain". */
  evidence: string;
  /**
   * Processes of the fenced incarnation left: a fence proves there are none or
   * throws (process: rescans the machine's host processes until none is left;
   * gvisor: the old sandbox killed by its exact identity and no host process of
   * its container left — a count inside the fresh sandbox would prove nothing).
   */
  remaining: 0;
}

export interface Runtime {
  readonly kind: RuntimeKind;
  /** Reported with the kind when the agent enrolls. */
  readonly detail: RuntimeDetail;
  /** Create (or find, if it already exists with the same id) and start the machine; `opts` are kept for every restart. */
  create(machineId: string, opts?: CreateOptions): Promise<RuntimeMachine>;
  /** Run a command inside a started machine. */
  exec(machineId: string, req: ExecRequest): Promise<ExecHandle>;
  /** Kill every process of the machine and prove none remain; returns the new incarnation. */
  fence(machineId: string): Promise<FenceProof>;
  /**
   * Throw away everything a borrower wrote (workspace and writable layer); the machine stays started.
   * Call after fence (process: a live process could write again; gvisor: scrub restarts the sandbox,
   * so it is also a fence, but report the fence proof via fenceAndScrub).
   */
  scrub(machineId: string): Promise<void>;
  /**
   * fence + scrub as one step — what a returned machine needs before `ready`.
   * gvisor does it with a single restart (the cheapest path); process fences then wipes.
   */
  fenceAndScrub(machineId: string): Promise<FenceProof>;
  /** Stop and remove the machine; resolves only once its absence is verified. Idempotent. */
  destroy(machineId: string): Promise<void>;
  /** What the runtime sees of a machine now. */
  inspect(machineId: string): Promise<{ exists: boolean; incarnation: string | null; liveProcesses: number }>;
  /**
   * The machine's current incarnation (null: absent or not running), from the runtime's own
   * record, without counting processes: what a session records before it execs, on every
   * SSH exec, where inspect's process count (a /proc scan, or a `runsc exec`) is not needed.
   */
  incarnation(machineId: string): Promise<string | null>;
  /** Every machine the runtime can see on this host under this agent's state directory (for recovery sweeps). */
  list(): Promise<string[]>;
  /**
   * Whether a connection to the machine's own loopback can be made from inside it without
   * reaching the host's: null when it can (gvisor: the sandbox's own network stack; process
   * with a network namespace: inside it), else why not (process without one: its loopback is the host's).
   */
  forwardRefusal(machineId: string): Promise<string | null>;
  /** Where the machine's SFTP sessions may reach: "workspace" when its pool confines them (CreateOptions.files), else "machine". */
  filesScope(machineId: string): Promise<"machine" | "workspace">;
}
