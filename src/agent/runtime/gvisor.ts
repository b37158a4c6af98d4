/**
 * The `gvisor` runtime: one runsc sandbox per machine (Linux, root).
 *
 * Sandbox: an OCI bundle (gvisor-oci.ts) generated per incarnation under
 * <stateDir>/machines/<id>/bundle-<inc>/, run under a private runsc state root
 * <stateDir>/runsc (so `runsc --root <stateDir>/runsc list` shows exactly this
 * agent's containers):
 *   - root filesystem: the host's `/`, read-only underneath a writable overlay
 *     held in sandbox memory (`--overlay2=root:memory`). Writes to /usr, /etc,
 *     ... vanish when the sandbox stops. The agent's state directory is masked
 *     by an empty tmpfs, so a borrower cannot read the agent's records.
 *   - /workspace: bind mount of <stateDir>/machines/<id>/workspace (read-write,
 *     survives restarts until scrub wipes it); cwd and HOME of every command.
 *   - /tmp: tmpfs (gone on restart). /run/berth/incarnation: the boot id (read-only).
 *   - /run/berth/sftp (a machine of an image only): berth's own SFTP server,
 *     bound read-only from <stateDir>/sftp-kit/<hash> (sftp-kit.ts).
 *   - network: `--network=none` — loopback only, no route out. Borrowers reach
 *     the machine through the agent's SSH gateway, which execs via runsc.
 *   - init: a shell loop that only sleeps and reaps; every borrower command is a
 *     separate `runsc exec`, so it is never in init's process group (pgid 1).
 *   - platform: the fastest this runsc and host offer (kvm, systrap, ptrace;
 *     gvisor-platform.ts), or the one the operator named.
 *   - cgroups: ignored (`--ignore-cgroups`); capacity is enforced by slots, not
 *     by kernel limits, in this version.
 * Commands run as root *inside* the sandbox; the sandbox is the boundary.
 *
 * Incarnation: each start is a new container id `<machine>.<boot-id prefix>`
 * with a fresh boot id (env BERTH_INCARNATION in every command, and the file
 * above). A new container id per start means a fence never waits for
 * `runsc delete` (which takes ~1-2 s here): the old sandbox is SIGKILLed by its
 * exact host pid, proven gone, the new one started, and the old container's
 * state is deleted in the background (destroy waits for it).
 *
 * Exec and leader identity (gvisor-oci.ts, gvisor-identity.ts): `runsc exec --process <spec>` (non-detached, so the
 * client's exit status is the command's). The spec runs a two-line wrapper that
 * prints one identity line — its own in-sandbox /proc/self/stat — on stderr
 * (the merged stream for a PTY) and then execs the command with the same pid.
 * The line is stripped from the output (streams.ts) and cross-checked with the
 * pid runsc itself writes to --internal-pid-file. A `runsc exec` process is a
 * session and group leader inside the sandbox, so leader pid == pgid.
 * Group signals run `kill -SIG -PGID` through `runsc exec` only after checking,
 * inside the sandbox and in the same shell, that the leader still has the
 * recorded start time and group; otherwise nothing is signalled.
 * PTY: the exec client runs under node-pty with `"terminal": true` and no
 * console socket, so the host PTY's slave is the command's stdio. gVisor
 * imports it as a host file, which is no /dev/pts device (`tty`: "not a tty",
 * no job control), so the command runs under berth-pty-relay (pty-relay.c,
 * copied into /run/berth at each start; not counted as a live process): a terminal of the sandbox's own
 * devpts whose session the command leads, with sizes and signals passed on.
 * Without the built relay (no C compiler at build time) the host PTY is used.
 *
 * Durable order: the machine record names the new container before `runsc
 * run`, and its sandbox pid + start time right after; a restarted agent
 * re-attaches only a sandbox whose pid and start time match the record, and
 * otherwise kills/deletes by container id under its private root, never by a
 * bare pid.
 */
import { chmodSync, chownSync, copyFileSync, existsSync, mkdirSync, rmSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { createHash } from "node:crypto";
import { BerthError } from "../../core/errors.js";
import { wipeDirectory } from "./durable.js";
import { isDead, matches, readStat, signalExact, sleep, waitUntil } from "./procfs.js";
import { COUNT_SCRIPT, SIGNAL_SCRIPT, sandboxSpec } from "./gvisor-oci.js";
import { awaitExecIdentity } from "./gvisor-identity.js";
import { Runsc, findRunsc, probeRunsc } from "./gvisor-runsc.js";
import type { PlatformChoice, RunscInfo } from "./gvisor-platform.js";
import { gvisorExecHandle } from "./gvisor-handle.js";
import type { CreateOptions, ExecHandle, ExecRequest, FenceProof, ProcessIdentity, Runtime, RuntimeDetail, RuntimeMachine } from "./types.js";
import { forwardingOff } from "./types.js";
import { newIncarnation, validatePty } from "./common.js";
import { GvisorRecords, imagesInUseIn, type ContainerRecord, type GvisorMachineRecord } from "./gvisor-records.js";
import { spawnExecClient } from "./gvisor-exec.js";
import { KeyedLock } from "../keyed-lock.js";
import { ensureSftpKit } from "./sftp-kit.js";

/** The static relay built by scripts/build-pty-relay.mjs (absent where it could not be built). */
const PTY_RELAY = fileURLToPath(new URL("../../../berth-pty-relay", import.meta.url));
export interface GvisorRuntimeOptions {
  stateDir: string;
  /** runsc binary; default: found on PATH. */
  runsc?: string;
  /** gVisor platform; default "auto": the fastest this runsc and host offer (gvisor-platform.ts). */
  platform?: PlatformChoice;
}

export class GvisorRuntime implements Runtime {
  readonly kind = "gvisor" as const;
  /** The runsc release, its platforms and the one new sandboxes use. */
  readonly runscInfo: RunscInfo;
  private readonly stateDir: string;
  private readonly records: GvisorRecords;
  private readonly runsc: Runsc;
  private readonly lock = new KeyedLock();
  /** Background deletion of retired containers, per machine. */
  private readonly garbage = new Map<string, Promise<void>>();
  /** Exec clients per machine (to reap them when their sandbox is stopped). */
  private readonly clients = new Map<string, Set<ProcessIdentity>>();
  /**
   * Machines whose sandbox was (re)started by this process and has run no
   * command since: its writable layer is fresh, so a scrub only needs to wipe
   * the workspace. Kept in memory only: after an agent restart every scrub
   * restarts the sandbox again.
   */
  private readonly untouched = new Set<string>();
  /** berth's own SFTP server for images without one (sftp-kit.ts), gathered at the first start of an image's machine. */
  private sftpKit: Promise<string | null> | null = null;

  constructor(opts: GvisorRuntimeOptions) {
    this.stateDir = resolve(opts.stateDir);
    this.records = new GvisorRecords(join(this.stateDir, "machines"));
    const runscRoot = join(this.stateDir, "runsc");
    mkdirSync(this.records.machinesDir, { recursive: true, mode: 0o700 });
    mkdirSync(runscRoot, { recursive: true, mode: 0o700 });
    const bin = opts.runsc ?? findRunsc();
    if (!bin) throw new BerthError("provider_unavailable", "provider_unavailable: runsc is not installed; install the runsc package or use --runtime process");
    this.runscInfo = probeRunsc(bin, opts.platform ?? "auto");
    this.runsc = new Runsc(bin, runscRoot, this.runscInfo.platform);
  }

  get detail(): RuntimeDetail {
    const i = this.runscInfo;
    return { runsc: { version: i.version, platform: i.platform }, ...(i.warning ? { warning: i.warning } : {}) };
  }

  // ---- records -------------------------------------------------------------

  private view(rec: GvisorMachineRecord): RuntimeMachine {
    const c = rec.container as ContainerRecord;
    return {
      machineId: rec.machineId,
      incarnation: rec.incarnation as string,
      workspace: join(this.records.dir(rec.machineId), "workspace"),
      identity: { runtime: "gvisor", container: c.id, sandboxPid: c.sandboxPid, sandboxStart: c.sandboxStart, ...(rec.image ? { image: rec.image.ref, imageId: rec.image.id ?? "dir" } : {}) },
    };
  }

  private containerPrefix(machineId: string): string {
    return machineId.length <= 48 ? machineId : "h" + createHash("sha256").update(machineId).digest("hex").slice(0, 24);
  }

  private isRunning(c: ContainerRecord | null): c is ContainerRecord {
    return c !== null && c.sandboxPid > 0 && matches({ pid: c.sandboxPid, startTime: c.sandboxStart });
  }

  /** Start a new incarnation. The record names the container before runsc runs (intent). */
  private async start(rec: GvisorMachineRecord): Promise<GvisorMachineRecord> {
    const inc = newIncarnation();
    const cid = `${this.containerPrefix(rec.machineId)}.${inc.slice(0, 12)}`;
    const bundle = join(this.records.dir(rec.machineId), `bundle-${inc.slice(0, 12)}`);
    mkdirSync(bundle, { recursive: true, mode: 0o700 });
    // /run/berth inside: readable by an image's non-root user too (it holds only the boot id).
    mkdirSync(join(bundle, "run"), { mode: 0o755 });
    mkdirSync(join(this.records.dir(rec.machineId), "workspace"), { recursive: true, mode: 0o700 });
    writeFileSync(join(bundle, "run", "incarnation"), inc + "\n", { mode: 0o644 });
    if (existsSync(PTY_RELAY)) {
      copyFileSync(PTY_RELAY, join(bundle, "run", "berth-pty-relay"));
      chmodSync(join(bundle, "run", "berth-pty-relay"), 0o755);
    }
    const res = rec.resources ? { ...rec.resources, cgroupsPath: `/berth/${cid}` } : undefined;
    const net = rec.network;
    const image = rec.image;
    if (image && image.user.uid !== 0) {
      // The image's user owns its workspace (inside, /workspace), as root owns it otherwise.
      chownSync(join(this.records.dir(rec.machineId), "workspace"), image.user.uid, image.user.gid);
    }
    // A machine of an image gets berth's SFTP server beneath /run/berth (used only where the image has none).
    const kit = image ? await (this.sftpKit ??= ensureSftpKit(this.stateDir).catch(() => null)) : null;
    if (kit) mkdirSync(join(bundle, "run", "sftp"), { mode: 0o755 });
    const spec = sandboxSpec({
      machineId: rec.machineId, incarnation: inc, workspace: join(this.records.dir(rec.machineId), "workspace"), runDir: join(bundle, "run"), stateDir: this.stateDir,
      ...(image ? { root: image.rootfs } : {}),
      ...(kit ? { sftpKit: kit } : {}),
      ...(res ? { resources: res } : {}),
      ...(net ? { network: { hosts: net.hosts, resolvConf: net.resolvConf } } : {}),
    });
    writeFileSync(join(bundle, "config.json"), JSON.stringify(spec), { mode: 0o600 });
    const netnsInode = net ? { netnsInode: net.inode } : {};
    const intent: GvisorMachineRecord = { ...rec, incarnation: inc, container: { id: cid, bundle, sandboxPid: 0, sandboxStart: 0, ...netnsInode } };
    this.records.save(intent);

    const pid = await this.runsc.runDetached(bundle, cid, `machine ${rec.machineId}`, { limits: res !== undefined, netns: net?.netns ?? null });
    const st = Number.isInteger(pid) && pid > 0 ? readStat(pid) : null;
    if (!st || isDead(st)) throw new BerthError("operation_failed", `operation_failed: sandbox of machine ${rec.machineId} is not running after runsc run`);
    const started: GvisorMachineRecord = { ...intent, container: { id: cid, bundle, sandboxPid: pid, sandboxStart: st.startTime, ...netnsInode } };
    this.records.save(started);
    return started;
  }

  /**
   * Stop the current sandbox and prove it gone: sandbox pid (exact identity)
   * dead, no host process of the container left, exec clients reaped.
   * Leaves the record with no container; schedules deletion of runsc state.
   */
  private async stop(rec: GvisorMachineRecord): Promise<{ rec: GvisorMachineRecord; evidence: string }> {
    const c = rec.container;
    if (!c) return { rec, evidence: "no sandbox was running" };
    let how: string;
    if (c.sandboxPid > 0) {
      const killed = signalExact({ pid: c.sandboxPid, startTime: c.sandboxStart }, "SIGKILL");
      how = killed ? `sandbox pid ${c.sandboxPid} killed` : `sandbox pid ${c.sandboxPid} already gone`;
      const gone = await waitUntil(() => !matches({ pid: c.sandboxPid, startTime: c.sandboxStart }), 10_000, 2);
      if (!gone) throw new BerthError("operation_failed", `operation_failed: sandbox ${c.id} (pid ${c.sandboxPid}) survived SIGKILL; quarantine machine ${rec.machineId}`);
    } else {
      // Only an intent was recorded (crash during runsc run): runsc's own state
      // under our private root names the container; let runsc kill it.
      const r = await this.runsc.run(["delete", "--force", c.id], 30_000, this.netnsOf(rec));
      how = `container ${c.id} from an interrupted start deleted (runsc exit ${r.code})`;
    }
    // Everything else of the container (gofer, exec clients, signal helpers).
    let others = 0;
    for (let round = 0; ; round++) {
      const live = this.runsc.hostProcessesOf(c);
      if (live.length === 0) break;
      if (round >= 50) {
        throw new BerthError("operation_failed", `operation_failed: ${live.length} host processes of sandbox ${c.id} survived SIGKILL; quarantine machine ${rec.machineId}`);
      }
      for (const p of live) if (signalExact(p, "SIGKILL")) others++;
      await sleep(Math.min(2 + round * 2, 20));
    }
    const clients = this.clients.get(rec.machineId);
    if (clients) {
      for (const id of clients) signalExact(id, "SIGKILL");
      await waitUntil(() => [...clients].every((id) => !matches(id)), 5_000, 2);
    }
    const stopped: GvisorMachineRecord = { ...rec, container: null };
    this.records.save(stopped);
    this.collect(rec.machineId, c, this.netnsOf(rec));
    return { rec: stopped, evidence: `${how}; ${others} other host processes of ${c.id} killed; 0 remain` };
  }

  /** Delete a retired container's runsc state and bundle in the background. */
  private collect(machineId: string, c: ContainerRecord, netns: string | null): void {
    const prev = this.garbage.get(machineId) ?? Promise.resolve();
    const next = prev.then(async () => {
      await this.runsc.run(["delete", "--force", c.id], 30_000, netns);
      rmSync(c.bundle, { recursive: true, force: true });
    });
    this.garbage.set(machineId, next.catch(() => undefined));
  }

  // ---- the contract --------------------------------------------------------

  /** The network namespace runsc calls about this machine run in (null: the host's). */
  private netnsOf(rec: GvisorMachineRecord | null): string | null {
    const ns = rec?.network?.netns ?? null;
    // A namespace already removed (destroy after a crash) has no sandbox left to reach.
    return ns !== null && existsSync(`/run/netns/${ns}`) ? ns : null;
  }

  create(machineId: string, opts: CreateOptions = {}): Promise<RuntimeMachine> {
    const dir = this.records.dir(machineId);
    return this.lock.run(machineId, async () => {
      let rec = this.records.get(machineId);
      const sameNet = (r: GvisorMachineRecord): boolean => (r.container?.netnsInode ?? null) === (opts.network?.inode ?? null);
      const sameImage = (r: GvisorMachineRecord): boolean => (r.image?.rootfs ?? null) === (opts.image?.rootfs ?? null);
      if (rec && (rec.forwarding !== opts.forwarding || rec.files !== opts.files)) {
        const { forwarding: _old, files: _oldFiles, ...rest } = rec;
        rec = { ...rest, ...(opts.forwarding ? { forwarding: opts.forwarding } : {}), ...(opts.files ? { files: opts.files } : {}) };
        this.records.save(rec);
      }
      if (rec && this.isRunning(rec.container) && sameNet(rec) && sameImage(rec)) return this.view(rec);
      if (!rec) {
        mkdirSync(join(dir, "workspace"), { recursive: true, mode: 0o700 });
        rec = {
          v: 1, machineId, createdAt: new Date().toISOString(), incarnation: null, container: null,
          ...(opts.resources ? { resources: opts.resources } : {}),
          ...(opts.network ? { network: opts.network } : {}),
          ...(opts.image ? { image: opts.image } : {}),
          ...(opts.forwarding ? { forwarding: opts.forwarding } : {}),
          ...(opts.files ? { files: opts.files } : {}),
        };
        this.records.save(rec);
      } else if (rec.container) {
        // Recorded but not running as recorded (or in another network
        // namespace than the machine's): clean what is left, then start fresh.
        rec = (await this.stop(rec)).rec;
      }
      if (opts.network || rec.network || opts.image || rec.image) {
        const { network: _old, image: _oldImage, ...rest } = rec;
        rec = { ...rest, ...(opts.network ? { network: opts.network } : {}), ...(opts.image ? { image: opts.image } : {}) };
        this.records.save(rec);
      }
      return this.view(await this.start(rec));
    });
  }

  async filesScope(machineId: string): Promise<"machine" | "workspace"> {
    return this.records.must(machineId).files === "workspace" ? "workspace" : "machine";
  }

  async forwardRefusal(machineId: string): Promise<string | null> {
    // The sandbox has its own network stack (loopback only, or its own namespace with a policy).
    if (this.records.must(machineId).forwarding === "off") return forwardingOff(machineId);
    return null;
  }

  exec(machineId: string, req: ExecRequest): Promise<ExecHandle> {
    return this.lock
      .run(machineId, async () => {
        const rec = this.records.must(machineId);
        const c = rec.container;
        if (!this.isRunning(c)) {
          throw new BerthError("conflict", `conflict: machine ${machineId} has no running sandbox; fence or create it again`);
        }
        this.untouched.delete(machineId);
        if (req.pty) validatePty(req.pty.cols, req.pty.rows);
        const { client, plumbing, p, line, specPath, ipidPath, relayed } = spawnExecClient(this.runsc, join(this.records.dir(machineId), "exec"), rec, c, req, this.netnsOf(rec));
        let set = this.clients.get(machineId);
        if (!set) this.clients.set(machineId, (set = new Set()));
        set.add(client);
        void plumbing.exited.then(() => set.delete(client));
        return { rec, c, client, plumbing, p, line, specPath, ipidPath, relayed };
      })
      .then(async ({ rec, c, client, plumbing, p, line, specPath, ipidPath, relayed }) => {
        // Outside the lock: the identity handshake (gvisor-identity.ts).
        const leader = await awaitExecIdentity({
          machineId,
          client,
          line,
          exited: plumbing.exited,
          ipidPath,
          settled: () => rmSync(specPath, { force: true }),
        });
        return gvisorExecHandle({
          incarnation: rec.incarnation as string,
          client,
          leader,
          plumbing,
          pty: p,
          relayed,
          signalLeaderGroup: (signal) => this.signalLeaderGroup(machineId, c.id, leader, signal),
        });
      });
  }

  /** kill -SIG -PGID inside the sandbox, only if the leader is still exactly `leader` in the same container. */
  /** `signal` "0": only check (the group exists and its leader matches); nothing is sent. */
  private async signalLeaderGroup(machineId: string, cid: string, leader: ProcessIdentity, signal: NodeJS.Signals | "0"): Promise<boolean> {
    const rec = this.records.get(machineId);
    if (!rec || !rec.container || rec.container.id !== cid || !this.isRunning(rec.container)) return false;
    if (leader.pid !== leader.pgid || leader.pgid <= 1) return false;
    const name = signal.replace(/^SIG/, "");
    if (!/^[A-Z0-9]+$/.test(name)) throw new BerthError("invalid_request", `invalid_request: unknown signal ${signal}`);
    const r = await this.runsc.run(["exec", cid, "/bin/sh", "-c", SIGNAL_SCRIPT, "berth-signal", String(leader.pid), String(leader.startTime), String(leader.pgid), name], 10_000, this.netnsOf(rec));
    if (r.code === 0) return true;
    if (r.code === 3 || r.code === 4) return false;
    // The sandbox went away in the meantime: nothing of the group can remain.
    if (!this.isRunning(this.records.get(machineId)?.container ?? null)) return false;
    throw new BerthError("operation_failed", `operation_failed: signalling group ${leader.pgid} in machine ${machineId} failed (exit ${r.code}): ${r.stderr.trim().slice(0, 200)}`);
  }

  private async restart(machineId: string, wipe: boolean): Promise<FenceProof> {
    const rec = this.records.must(machineId);
    const before = rec.incarnation;
    const { rec: stopped, evidence } = await this.stop(rec);
    let wiped = "";
    if (wipe) {
      const ws = join(this.records.dir(machineId), "workspace");
      mkdirSync(ws, { recursive: true, mode: 0o700 });
      wiped = `; workspace wiped (${wipeDirectory(ws)} entries), writable layer discarded`;
    }
    const started = await this.start(stopped);
    this.untouched.add(machineId);
    return {
      incarnation: started.incarnation as string,
      remaining: 0,
      evidence: `sandbox restarted: incarnation ${before ?? "none"} -> ${started.incarnation}; ${evidence}${wiped}`,
    };
  }

  fence(machineId: string): Promise<FenceProof> {
    return this.lock.run(machineId, () => this.restart(machineId, false));
  }

  /**
   * The writable layer lives in sandbox memory, so scrub is a restart with a
   * wiped workspace (and therefore also a fence) — unless the sandbox was
   * restarted by this process (a fence) and has run no command since: then its
   * writable layer is already fresh and only the workspace is wiped.
   */
  scrub(machineId: string): Promise<void> {
    return this.lock.run(machineId, async () => {
      const rec = this.records.must(machineId);
      if (this.untouched.has(machineId) && this.isRunning(rec.container)) {
        const ws = join(this.records.dir(machineId), "workspace");
        mkdirSync(ws, { recursive: true, mode: 0o700 });
        wipeDirectory(ws);
        return;
      }
      await this.restart(machineId, true);
    });
  }

  fenceAndScrub(machineId: string): Promise<FenceProof> {
    return this.lock.run(machineId, () => this.restart(machineId, true));
  }

  destroy(machineId: string): Promise<void> {
    const dir = this.records.dir(machineId);
    return this.lock.run(machineId, async () => {
      const rec = this.records.get(machineId);
      if (rec) await this.stop(rec);
      await this.garbage.get(machineId);
      this.garbage.delete(machineId);
      // Anything runsc still knows of this machine (e.g. left by a crashed agent).
      const prefix = this.containerPrefix(machineId) + ".";
      for (const ct of await this.runsc.list()) {
        if (!ct.id.startsWith(prefix)) continue;
        const r = await this.runsc.run(["delete", "--force", ct.id], 30_000, this.netnsOf(rec));
        if (r.code !== 0) throw new BerthError("operation_failed", `operation_failed: runsc delete ${ct.id} failed: ${r.stderr.trim().slice(0, 300)}`);
      }
      const left = (await this.runsc.list()).filter((ct) => ct.id.startsWith(prefix));
      if (left.length > 0) throw new BerthError("operation_failed", `operation_failed: runsc still lists ${left.map((l) => l.id).join(", ")} after destroy`);
      rmSync(dir, { recursive: true, force: true, maxRetries: 3 });
      if (existsSync(dir)) throw new BerthError("operation_failed", `operation_failed: ${dir} still exists after destroy`);
      this.clients.delete(machineId);
      this.untouched.delete(machineId);
    });
  }

  async inspect(machineId: string): Promise<{ exists: boolean; incarnation: string | null; liveProcesses: number }> {
    const rec = this.records.get(machineId);
    if (!rec) return { exists: false, incarnation: null, liveProcesses: 0 };
    if (!this.isRunning(rec.container)) return { exists: true, incarnation: null, liveProcesses: 0 };
    const r = await this.runsc.run(["exec", rec.container.id, "/bin/sh", "-c", COUNT_SCRIPT], 10_000, this.netnsOf(rec));
    const n = Number(r.stdout.trim());
    if (r.code !== 0 || !Number.isInteger(n)) {
      throw new BerthError("operation_failed", `operation_failed: could not count processes in machine ${machineId}: ${r.stderr.trim().slice(0, 200)}`);
    }
    return { exists: true, incarnation: rec.incarnation, liveProcesses: n };
  }

  async incarnation(machineId: string): Promise<string | null> {
    const rec = this.records.get(machineId);
    return rec && this.isRunning(rec.container) ? rec.incarnation : null;
  }

  async list(): Promise<string[]> {
    return this.records.list();
  }

  /** Machines per cached image id (what the image cache must keep). */
  imagesInUse(): Map<string, number> {
    return imagesInUseIn(this.stateDir);
  }

  /** Containers under this agent's runsc root (for tests and recovery reports). */
  async containers(): Promise<string[]> {
    return (await this.runsc.list()).map((c) => c.id);
  }
}

export { findRunsc };
