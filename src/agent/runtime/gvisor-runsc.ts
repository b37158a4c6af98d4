/**
 * The runsc command line as the gvisor runtime uses it: every call under the
 * agent's private state root (so `runsc --root <root> list` shows exactly this
 * agent's containers), `runsc run` detached with a pid file, the arguments of
 * one `runsc exec`, and finding a container's host processes by their argv.
 * No machine records here; gvisor.ts owns those and their ordering.
 */
import { closeSync, existsSync, mkdirSync, mkdtempSync, openSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { execFile, spawn, spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { tmpdir } from "node:os";
import { delimiter, join } from "node:path";
import { BerthError } from "../../core/errors.js";
import { allPids, isDead, readCmdline, readStat, safeRead } from "./procfs.js";
import { choosePlatform, parsePlatforms, parseRunscVersion, runscWarning, type GvisorPlatform, type PlatformChoice, type RunscInfo } from "./gvisor-platform.js";

export interface RunscResult {
  code: number;
  stdout: string;
  stderr: string;
}

export class Runsc {
  /**
   * @param bin the runsc binary
   * @param root the agent's private runsc state root
   * @param platform gVisor platform for new sandboxes
   */
  constructor(
    readonly bin: string,
    readonly root: string,
    private readonly platform: GvisorPlatform,
  ) {}

  /**
   * The command line of `runsc ARGS` for a container in network namespace
   * `netns` (null: the host's): runsc's control socket is an abstract unix
   * socket, which lives in a network namespace, so every runsc call about a
   * sandbox started inside one must run inside it too (`nsenter --net`, which
   * execs runsc with the same pid).
   */
  command(args: string[], netns: string | null = null): { file: string; args: string[] } {
    if (netns === null) return { file: this.bin, args };
    return { file: "nsenter", args: [`--net=/run/netns/${netns}`, "--", this.bin, ...args] };
  }

  /** `runsc --root <root> ARGS`; never rejects (a failure is a non-zero code). */
  run(args: string[], timeoutMs = 30_000, netns: string | null = null): Promise<RunscResult> {
    const c = this.command(["--root", this.root, ...args], netns);
    return new Promise((resolveP) => {
      execFile(c.file, c.args, { timeout: timeoutMs, maxBuffer: 8 << 20 }, (err, stdout, stderr) => {
        const code = err ? (typeof (err as { code?: unknown }).code === "number" ? ((err as { code: number }).code) : 1) : 0;
        resolveP({ code, stdout: String(stdout), stderr: String(stderr) });
      });
    });
  }

  async list(): Promise<Array<{ id: string; pid: number; status: string }>> {
    const r = await this.run(["list", "--format", "json"]);
    if (r.code !== 0) throw new BerthError("operation_failed", `operation_failed: runsc list failed: ${r.stderr.trim().slice(0, 300)}`);
    const parsed = JSON.parse(r.stdout.trim() || "[]") as Array<{ id: string; pid: number; status: string }> | null;
    return parsed ?? [];
  }

  /**
   * `runsc run --detach` of `bundle` as container `cid`: no network (or, with
   * `netns`, the host network stack of that namespace: `--network=host` inside
   * the machine's own namespace, where the host's nftables rules apply), the
   * root overlay in sandbox memory, cgroups ignored — or, with `limits`,
   * applied from the spec's resources with the sandbox's CPU count taken from
   * the quota (`--cpu-num-from-quota`; runsc then also sizes its memory to the
   * limit). Resolves with the sandbox's host pid; throws with the tail of
   * runsc's log when it fails.
   */
  async runDetached(bundle: string, cid: string, what: string, o: { limits?: boolean; netns?: string | null } = {}): Promise<number> {
    const netns = o.netns ?? null;
    const pidFile = join(bundle, "sandbox.pid");
    const logPath = join(bundle, "runsc.log");
    const logFd = openSync(logPath, "w", 0o600);
    const code = await new Promise<number>((res) => {
      // detached: the gofer stays in runsc's process group; keep it out of the agent's.
      const c = this.command(
        [
          "--root", this.root, netns === null ? "--network=none" : "--network=host", "--overlay2=root:memory", o.limits ? "--cpu-num-from-quota" : "--ignore-cgroups", `--platform=${this.platform}`,
          "run", "--detach", "--pid-file", pidFile, "--bundle", bundle, cid,
        ],
        netns,
      );
      const child = spawn(c.file, c.args, { detached: true, stdio: ["ignore", "ignore", logFd] });
      child.on("exit", (c) => res(c ?? 1));
      child.on("error", () => res(127));
    });
    closeSync(logFd);
    if (code !== 0) {
      const log = safeRead(logPath).trim().split("\n").slice(-3).join(" | ").slice(0, 400);
      throw new BerthError("operation_failed", `operation_failed: runsc run for ${what} exited ${code}: ${log}`);
    }
    return Number(safeRead(pidFile).trim());
  }

  /** Arguments of one non-detached `runsc exec` of a process spec file. */
  execArgs(cid: string, specPath: string, ipidPath: string): string[] {
    return ["--root", this.root, "exec", "--internal-pid-file", ipidPath, "--process", specPath, cid];
  }

  /** Live host processes of container `c`: sandbox, gofer, exec clients (by bundle path, or root and id, in argv). */
  hostProcessesOf(c: { id: string; bundle: string }): Array<{ pid: number; startTime: number }> {
    const out: Array<{ pid: number; startTime: number }> = [];
    for (const pid of allPids()) {
      if (pid === process.pid) continue;
      const argv = readCmdline(pid);
      if (argv.length === 0) continue;
      const joined = argv.join("\0");
      const ours =
        joined.includes(`--bundle=${c.bundle}`) ||
        (argv.includes(c.bundle) && argv.includes("--bundle")) ||
        (joined.includes(this.root) && argv.includes(c.id));
      if (!ours) continue;
      const st = readStat(pid);
      if (st && !isDead(st)) out.push({ pid, startTime: st.startTime });
    }
    return out;
  }
}

/** Absolute path of runsc on PATH (plus /usr/bin, /usr/local/bin), or null. */
export function findRunsc(): string | null {
  const dirs = [...(process.env.PATH ?? "").split(delimiter), "/usr/local/bin", "/usr/bin", "/usr/sbin"];
  for (const d of dirs) {
    if (!d) continue;
    const p = join(d, "runsc");
    if (existsSync(p)) return p;
  }
  return null;
}

/** Whether /dev/kvm exists and this process can open it read-write (what runsc's kvm platform needs). */
export function kvmUsable(): boolean {
  try {
    closeSync(openSync("/dev/kvm", "r+"));
    return true;
  } catch {
    return false;
  }
}

/**
 * What runsc `bin` is (`runsc --version`), which platforms it offers
 * (`runsc flags`), and the platform its sandboxes will use; two short runs of
 * runsc when the agent starts.
 */
export function probeRunsc(bin: string, choice: PlatformChoice): RunscInfo {
  // `runsc flags` prints its list on stderr; both streams are read.
  const run = (args: string[]): string => {
    const r = spawnSync(bin, args, { encoding: "utf8", timeout: 15_000, stdio: ["ignore", "pipe", "pipe"], maxBuffer: 4 << 20 });
    const out = `${r.stdout ?? ""}${r.stderr ?? ""}`;
    if (r.error || r.status !== 0) {
      throw new BerthError("provider_unavailable", `provider_unavailable: could not run ${bin} ${args.join(" ")}: ${(r.error?.message ?? out).trim().slice(0, 200)}`);
    }
    return out;
  };
  const version = parseRunscVersion(run(["--version"]));
  const platforms = parsePlatforms(run(["flags"]));
  const { platform, why } = choosePlatform(platforms, kvmUsable(), choice, () => kvmTrial(bin, version.version));
  return { path: bin, ...version, platforms, platform, platformWhy: why, warning: runscWarning(version, platforms) };
}

/** Where trial outcomes are kept, one file per runsc binary (by path, version, size and time); gone at reboot. */
export const KVM_TRIAL_DIR = "/run/berth/kvm-trial";
/** How long a trial sandbox may take to run /bin/true and end (a working kvm takes well under a second). */
export const KVM_TRIAL_MS = 10_000;

/**
 * Whether a gVisor sandbox on the kvm platform runs and ends on this host:
 * `runsc do /bin/true` under a private root, bounded by `timeoutMs`. Null when
 * it ended with status 0, else why not. Under some nested virtualisation kvm
 * runs the program and the sandbox then never exits, so an openable /dev/kvm
 * alone is not enough. Whatever the trial leaves (its sandbox and gofer name
 * the private root in their argv) is killed. The outcome is kept per runsc
 * binary in `cacheDir`, so only the first agent start after a boot pays for it.
 */
export function kvmTrial(bin: string, version: string, cacheDir = KVM_TRIAL_DIR, timeoutMs = KVM_TRIAL_MS): string | null {
  let file: string | null = null;
  try {
    const st = statSync(bin);
    const key = createHash("sha256").update(`${bin}\0${version}\0${st.size}\0${st.mtimeMs}`).digest("hex").slice(0, 32);
    file = join(cacheDir, `${key}.json`);
    const kept = JSON.parse(readFileSync(file, "utf8")) as { why?: unknown };
    if (kept.why === null || typeof kept.why === "string") return kept.why;
  } catch {
    // no outcome kept yet: run the trial
  }
  const root = mkdtempSync(join(tmpdir(), "berth-kvm-trial-"));
  let why: string | null = null;
  try {
    const r = spawnSync(bin, ["--root", root, "--platform=kvm", "--network=none", "--ignore-cgroups", "do", "/bin/true"], {
      timeout: timeoutMs,
      killSignal: "SIGKILL",
      stdio: ["ignore", "pipe", "pipe"],
      encoding: "utf8",
    });
    const code = (r.error as NodeJS.ErrnoException | undefined)?.code;
    if (code === "ETIMEDOUT") why = `a trial sandbox on kvm (runsc do /bin/true) did not end within ${timeoutMs / 1000} s`;
    else if (r.error) why = `a trial sandbox on kvm did not start: ${r.error.message}`;
    else if (r.status !== 0) why = `a trial sandbox on kvm (runsc do /bin/true) exited ${r.status ?? r.signal}: ${(r.stderr ?? "").trim().split("\n").pop()?.slice(0, 160) ?? ""}`;
  } finally {
    killArgvHolding(root);
    rmSync(root, { recursive: true, force: true });
  }
  if (file) {
    try {
      mkdirSync(cacheDir, { recursive: true, mode: 0o700 });
      writeFileSync(file, JSON.stringify({ bin, version, why, at: new Date().toISOString() }), { mode: 0o600 });
    } catch {
      // not kept: the next agent start tries again
    }
  }
  return why;
}

/** SIGKILL every process whose argv contains `text` (a trial's private runsc root). */
function killArgvHolding(text: string): void {
  for (const pid of allPids()) {
    if (pid === process.pid) continue;
    if (!readCmdline(pid).some((a) => a.includes(text))) continue;
    try {
      process.kill(pid, "SIGKILL");
    } catch {
      // already gone
    }
  }
}
