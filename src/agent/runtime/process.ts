/**
 * The `process` runtime: a machine is a directory, a command is a plain child
 * process.
 *
 * NO ISOLATION. A command runs as the agent's own user with the agent's view of
 * the host: it can read anything the agent can read, reach the network, and
 * see or signal other processes of that user. Use it on a laptop, in tests, or
 * for trusted CI on a host dedicated to that purpose. It is not a sandbox.
 *
 * Layout: <stateDir>/machines/<id>/machine.json (the record) and
 * <stateDir>/machines/<id>/workspace (cwd and HOME of every command).
 *
 * What makes a process "of the machine" (used by fence, destroy and inspect):
 *   1. its environment carries BERTH_MACHINE=<id> and a BERTH_INCARNATION this
 *      runtime issued for the machine (every command starts with both; children
 *      inherit them, including ones that leave the group with setsid/nohup/&);
 *   2. when the agent runs as root on a writable cgroup v2 hierarchy: membership
 *      of the machine's cgroup (children cannot leave it without privilege, even
 *      with a cleaned environment), emptied with cgroup.kill;
 *   3. a descendant of a process found by 1 or 2 at the time of the scan;
 *   4. the process group of a command this agent started, while its leader is
 *      still exactly the recorded process.
 * A process that clears its environment AND escapes both the cgroup and its
 * parent chain (possible only without cgroup support) is not found: on such a
 * host the fence is best effort for cooperative borrowers, as PRODUCT.md's
 * trust model says.
 *
 * Fence: SIGKILL everything found, rescan, repeat (bounded); it succeeds only
 * when a scan finds nothing, then records a new incarnation. Every kill re-checks
 * the process's start time first (procfs.ts), so a recycled pid is never hit.
 *
 * Crash: the record is written (durably) before any process of a new
 * incarnation can start, so a restarted agent's fence still finds every
 * process by marker or cgroup; the in-memory group list (4) is lost, which is
 * why it is only a supplement.
 */
import { chownSync, existsSync, mkdirSync, readdirSync, rmSync, rmdirSync, statSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { userInfo } from "node:os";
import { BerthError } from "../../core/errors.js";
import { isId, parseId } from "../../core/ids.js";
import { readRecord, wipeDirectory, writeRecord } from "./durable.js";
import { readStat, signalExact, signalGroupExact, sleep, type ProcStat } from "./procfs.js";
import { execHandle, spawnExec } from "./process-exec.js";
import type { CreateOptions, ExecHandle, ExecRequest, FenceProof, ProcessIdentity, Runtime, RuntimeMachine } from "./types.js";
import { forwardingOff } from "./types.js";
import { cleanEnv, loginShell, newIncarnation } from "./common.js";
import { KeyedLock } from "../keyed-lock.js";
import { findCgroupBase, machineProcesses, readCgroupProcs } from "./process-scan.js";

interface ProcessMachineRecord {
  v: 1;
  machineId: string;
  incarnation: string;
  /** Incarnations issued for this machine (newest first, bounded): the marker values fence looks for. */
  incarnations: string[];
  /** Absolute path of the machine's cgroup v2 directory, or null when unavailable. */
  cgroup: string | null;
  createdAt: string;
  /** The machine's network namespace (network policy `egress`); absent: the host's network. */
  netns?: string;
  /**
   * With a namespace: the machine's own unprivileged uid/gid (no passwd entry).
   * Every command runs as it, with no capabilities and no_new_privs, and sees
   * only its own processes (see exec).
   */
  runAs?: { uid: number; gid: number };
  /** "off": its pool refuses forwards (CreateOptions.forwarding); absent: allowed. */
  forwarding?: "off";
  /** "workspace": its pool confines SFTP to the workspace (CreateOptions.files); absent: the machine's view. */
  files?: "workspace";
}

interface Tracked {
  client: ProcessIdentity;
  leader: ProcessIdentity;
}

const FENCE_ROUNDS = 100;

/**
 * Under a network policy, inside the mount namespace `ip netns exec` made for
 * the command (its mounts never reach the host), still root:
 *   - a /proc of its own with hidepid=invisible: the command sees only the
 *     processes of its own uid (the machine's);
 *   - a tmpfs over the agent's state directory (other machines, the agent's
 *     records), or over its highest ancestor others cannot traverse
 *     (hiddenRoot), with only this machine's workspace bound back at its path
 *     (`mount -c`: "." is the spawn's cwd, the workspace, not a path looked up
 *     again under the tmpfs);
 * then setpriv: the machine's uid/gid, no supplementary groups, every
 * capability set empty (bounding set too) and no_new_privs (setuid binaries
 * give nothing back), and exec of the command with the same pid.
 * An unprivileged uid cannot setns() (no CAP_SYS_ADMIN), touch nftables or
 * routes (no CAP_NET_ADMIN), signal or ptrace the agent or another machine
 * (another uid), nor write a root-owned file.
 */
const CONFINE = [
  'sd=$1 ws=$2 uid=$3 gid=$4; shift 4',
  'mount -t proc -o hidepid=invisible,nosuid,nodev,noexec proc /proc || exit 126',
  'mount -t tmpfs -o mode=0755,size=64k,nosuid,nodev berth-state "$sd" && mkdir -p "$ws" && mount -c --bind . "$ws" && cd "$ws" || exit 126',
  'exec setpriv --reuid="$uid" --regid="$gid" --clear-groups --inh-caps=-all --ambient-caps=-all --bounding-set=-all --no-new-privs -- "$@"',
].join("\n");
const KEEP_INCARNATIONS = 16;

export interface ProcessRuntimeOptions {
  stateDir: string;
  /** "auto" (default): use a cgroup per machine when root and cgroup v2 is writable. */
  cgroup?: "auto" | "off";
}

export class ProcessRuntime implements Runtime {
  readonly kind = "process" as const;
  readonly detail = {};
  private readonly stateDir: string;
  private readonly machinesDir: string;
  private readonly cgroupBase: string | null;
  private readonly lock = new KeyedLock();
  private readonly tracked = new Map<string, Set<Tracked>>();

  constructor(opts: ProcessRuntimeOptions) {
    this.stateDir = resolve(opts.stateDir);
    this.machinesDir = join(this.stateDir, "machines");
    mkdirSync(this.machinesDir, { recursive: true, mode: 0o700 });
    this.cgroupBase = opts.cgroup === "off" ? null : findCgroupBase(this.stateDir);
  }

  private dir(id: string): string {
    return join(this.machinesDir, parseId(id, "machine id"));
  }

  private record(id: string): ProcessMachineRecord | null {
    return readRecord<ProcessMachineRecord>(join(this.dir(id), "machine.json"));
  }

  private mustRecord(id: string): ProcessMachineRecord {
    const rec = this.record(id);
    if (!rec) throw new BerthError("not_found", `not_found: machine ${id} does not exist on this host; create it first`);
    return rec;
  }

  private view(rec: ProcessMachineRecord): RuntimeMachine {
    return {
      machineId: rec.machineId,
      incarnation: rec.incarnation,
      workspace: join(this.dir(rec.machineId), "workspace"),
      identity: { runtime: "process", cgroup: rec.cgroup ?? "none", createdAt: rec.createdAt, ...(rec.netns ? { netns: rec.netns } : {}) },
    };
  }

  create(machineId: string, opts: CreateOptions = {}): Promise<RuntimeMachine> {
    if (opts.image) return Promise.reject(processRefusesImages(opts.image.ref));
    const dir = this.dir(machineId);
    return this.lock.run(machineId, async () => {
      const existing = this.record(machineId);
      if (existing) {
        mkdirSync(join(dir, "workspace"), { recursive: true, mode: 0o700 });
        if ((existing.netns ?? null) !== (opts.network?.netns ?? null)) {
          throw new BerthError("conflict", `conflict: machine ${machineId} exists with network namespace ${existing.netns ?? "none"}; destroy it to change its network`);
        }
        if (existing.forwarding !== opts.forwarding || existing.files !== opts.files) {
          const { forwarding: _old, files: _oldFiles, ...rest } = existing;
          writeRecord(join(dir, "machine.json"), { ...rest, ...(opts.forwarding ? { forwarding: opts.forwarding } : {}), ...(opts.files ? { files: opts.files } : {}) });
        }
        return this.view(existing);
      }
      mkdirSync(join(dir, "workspace"), { recursive: true, mode: 0o700 });
      let cgroup: string | null = null;
      if (this.cgroupBase) {
        const cg = join(this.cgroupBase, machineId);
        try {
          mkdirSync(cg, { recursive: true });
          cgroup = cg;
        } catch {
          cgroup = null; // fall back to marker-only fencing; the record says so
        }
      }
      const inc = newIncarnation();
      const runAs = opts.network ? { uid: opts.network.uid, gid: opts.network.uid } : null;
      if (runAs) chownSync(join(dir, "workspace"), runAs.uid, runAs.gid);
      const rec: ProcessMachineRecord = {
        v: 1,
        machineId,
        incarnation: inc,
        incarnations: [inc],
        cgroup,
        createdAt: new Date().toISOString(),
        ...(opts.network ? { netns: opts.network.netns } : {}),
        ...(runAs ? { runAs } : {}),
        ...(opts.forwarding ? { forwarding: opts.forwarding } : {}),
        ...(opts.files ? { files: opts.files } : {}),
      };
      writeRecord(join(dir, "machine.json"), rec);
      return this.view(rec);
    });
  }

  async filesScope(machineId: string): Promise<"machine" | "workspace"> {
    return this.mustRecord(machineId).files === "workspace" ? "workspace" : "machine";
  }

  async forwardRefusal(machineId: string): Promise<string | null> {
    const rec = this.mustRecord(machineId);
    if (rec.forwarding === "off") return forwardingOff(machineId);
    if (rec.netns) return null;
    return `machine ${machineId} runs on the process runtime without a network namespace, so its localhost is the host's own; forwards need a network policy (docs/network.md) or the gvisor runtime`;
  }

  exec(machineId: string, req: ExecRequest): Promise<ExecHandle> {
    // The spawn happens under the machine lock so a concurrent fence can never
    // miss a process started with an incarnation it is about to retire.
    return this.lock.run(machineId, async () => {
      const rec = this.mustRecord(machineId);
      const { workspace, env, args } = this.execArgs(machineId, rec, req);
      const { plumbing, pid, resize } = spawnExec(machineId, args, workspace, env, req.pty ?? null);
      // Same tick as the spawn: the child cannot have been reaped yet, so its
      // /proc entry (possibly a zombie) still carries its true start time.
      const st = readStat(pid);
      const leader: ProcessIdentity = st ? { pid, startTime: st.startTime, pgid: pid } : { pid, startTime: -1, pgid: pid };
      const tracked: Tracked = { client: leader, leader };
      let set = this.tracked.get(machineId);
      if (!set) this.tracked.set(machineId, (set = new Set()));
      set.add(tracked);
      void plumbing.exited.then(() => set.delete(tracked));
      return execHandle(rec.incarnation, leader, plumbing, resize);
    });
  }

  /** The command's workspace, environment and the /bin/sh arguments that start it in the machine. */
  private execArgs(machineId: string, rec: ProcessMachineRecord, req: ExecRequest): { workspace: string; env: Record<string, string>; args: string[] } {
    const workspace = join(this.dir(machineId), "workspace");
    const shell = loginShell();
    const env = cleanEnv(req.env, {
      PATH: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
      HOME: workspace,
      USER: safeUser(),
      SHELL: shell,
      TERM: req.pty ? req.pty.term || "xterm" : "dumb",
      BERTH_MACHINE: machineId,
      BERTH_INCARNATION: rec.incarnation,
    });
    const argv = req.argv && req.argv.length > 0 ? req.argv : [shell, "-l"];
    // A tiny wrapper joins the machine's cgroup (when there is one), enters
    // the machine's network namespace (when it has one; `ip netns exec` also
    // binds /etc/netns/<ns>/{hosts,resolv.conf}), and execs the command with
    // the same pid (so "command not found" is a normal exit 127 from the
    // shell, not a spawn error).
    const join_ = rec.cgroup ? 'echo $$ > "$0" || exit 126; ' : "";
    if (rec.netns && !rec.runAs) {
      throw new BerthError("conflict", `conflict: machine ${machineId} was created without a uid of its own for its network policy; destroy it and provision it again`);
    }
    const enter = rec.netns ? 'ns=$1 confine=$2; shift 2; exec ip netns exec "$ns" /bin/sh -c "$confine" berth-confine "$@"' : 'exec "$@"';
    const confine = rec.runAs ? [CONFINE, hiddenRoot(this.stateDir), workspace, String(rec.runAs.uid), String(rec.runAs.gid)] : [];
    const args = ["-c", join_ + enter, rec.cgroup ? join(rec.cgroup, "cgroup.procs") : "berth-exec", ...(rec.netns ? [rec.netns] : []), ...confine, ...argv];
    return { workspace, env, args };
  }

  /** Every live process of the machine (process-scan.ts). */
  private scan(rec: ProcessMachineRecord): ProcStat[] {
    return machineProcesses(rec, [...(this.tracked.get(rec.machineId) ?? [])].map((t) => t.leader));
  }

  /** Kill every process of the machine until a scan finds none (bounded). Returns evidence text. */
  private async killAll(rec: ProcessMachineRecord): Promise<string> {
    let killed = 0;
    let rounds = 0;
    for (const t of this.tracked.get(rec.machineId) ?? []) {
      if (signalGroupExact(t.leader, "SIGKILL")) killed++;
    }
    if (rec.cgroup) {
      killed += readCgroupProcs(rec.cgroup).length;
      try {
        writeFileSync(join(rec.cgroup, "cgroup.kill"), "1");
      } catch {
        /* cgroup.kill missing (kernel < 5.14): the scan below kills member by member */
      }
    }
    for (;;) {
      const live = this.scan(rec);
      if (live.length === 0) break;
      rounds++;
      if (rounds > FENCE_ROUNDS) {
        const sample = live.slice(0, 5).map((s) => `${s.pid}(${s.comm})`).join(", ");
        throw new BerthError(
          "operation_failed",
          `operation_failed: fence of machine ${rec.machineId} gave up after ${FENCE_ROUNDS} rounds; ${live.length} processes remain (${sample}); quarantine the machine`,
        );
      }
      for (const st of live) if (signalExact({ pid: st.pid, startTime: st.startTime }, "SIGKILL")) killed++;
      await sleep(Math.min(2 * rounds, 20));
    }
    const cg = rec.cgroup ? `, cgroup ${rec.cgroup} empty` : ", no cgroup (marker scan only)";
    return `${killed} processes killed (${rounds} rescan rounds); 0 processes remain with BERTH_MACHINE=${rec.machineId} and a known incarnation${cg}`;
  }

  private async fenceLocked(machineId: string): Promise<FenceProof> {
    const rec = this.mustRecord(machineId);
    const evidence = await this.killAll(rec);
    const inc = newIncarnation();
    const next: ProcessMachineRecord = {
      ...rec,
      incarnation: inc,
      incarnations: [inc, ...rec.incarnations].slice(0, KEEP_INCARNATIONS),
    };
    writeRecord(join(this.dir(machineId), "machine.json"), next);
    return { incarnation: inc, remaining: 0, evidence: `${evidence}; incarnation ${rec.incarnation} -> ${inc}` };
  }

  fence(machineId: string): Promise<FenceProof> {
    return this.lock.run(machineId, () => this.fenceLocked(machineId));
  }

  scrub(machineId: string): Promise<void> {
    return this.lock.run(machineId, async () => {
      this.mustRecord(machineId);
      const ws = join(this.dir(machineId), "workspace");
      mkdirSync(ws, { recursive: true, mode: 0o700 });
      wipeDirectory(ws);
    });
  }

  fenceAndScrub(machineId: string): Promise<FenceProof> {
    return this.lock.run(machineId, async () => {
      const proof = await this.fenceLocked(machineId);
      const ws = join(this.dir(machineId), "workspace");
      mkdirSync(ws, { recursive: true, mode: 0o700 });
      const n = wipeDirectory(ws);
      return { ...proof, evidence: `${proof.evidence}; workspace wiped (${n} entries)` };
    });
  }

  destroy(machineId: string): Promise<void> {
    const dir = this.dir(machineId);
    return this.lock.run(machineId, async () => {
      const rec = this.record(machineId);
      if (rec) {
        await this.killAll(rec);
        if (rec.cgroup && existsSync(rec.cgroup)) {
          try {
            rmdirSync(rec.cgroup);
          } catch (e) {
            throw new BerthError("operation_failed", `operation_failed: cgroup ${rec.cgroup} of machine ${machineId} could not be removed (${(e as Error).message})`);
          }
        }
        if (this.cgroupBase) {
          try {
            rmdirSync(this.cgroupBase); // only succeeds once no machine cgroup is left
          } catch {
            /* other machines still live here */
          }
        }
      }
      rmSync(dir, { recursive: true, force: true, maxRetries: 3 });
      if (existsSync(dir)) throw new BerthError("operation_failed", `operation_failed: ${dir} still exists after destroy`);
      this.tracked.delete(machineId);
    });
  }

  async inspect(machineId: string): Promise<{ exists: boolean; incarnation: string | null; liveProcesses: number }> {
    const rec = this.record(machineId);
    if (!rec) return { exists: false, incarnation: null, liveProcesses: 0 };
    return { exists: true, incarnation: rec.incarnation, liveProcesses: this.scan(rec).length };
  }

  async incarnation(machineId: string): Promise<string | null> {
    return this.record(machineId)?.incarnation ?? null;
  }

  async list(): Promise<string[]> {
    return readdirSync(this.machinesDir).filter((n) => isId(n) && existsSync(join(this.machinesDir, n, "machine.json"))).sort();
  }
}

/**
 * Where the confined command's tmpfs goes: the state directory, or its
 * highest ancestor others cannot traverse (a 0700 temporary or home
 * directory), so the workspace bound back inside it is reachable by the
 * machine's uid along a path of 0755 tmpfs directories. Whatever it hides was
 * closed to that uid anyway.
 */
function hiddenRoot(stateDir: string): string {
  let top = stateDir;
  for (let d = dirname(stateDir); d !== dirname(d); d = dirname(d)) {
    if ((statSync(d).mode & 0o001) === 0) top = d;
  }
  return top;
}

function safeUser(): string {
  try {
    return userInfo().username;
  } catch {
    return String(process.getuid?.() ?? "user");
  }
}

/** The process runtime has no root of its own to swap: an image needs gvisor. */
export function processRefusesImages(ref: string): BerthError {
  return new BerthError(
    "provider_unavailable",
    `provider_unavailable: this host runs the process runtime, which cannot boot images (${ref}): its commands run in the host's own root. Boot images on a gvisor host (berth agent --runtime gvisor: runsc and root)`,
  );
}
