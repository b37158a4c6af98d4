/**
 * `berth cp [--receipt FILE | ALLOCATION] SRC… DEST`: copy files to or from a
 * borrowed machine (or a ready allocation), scp-like. The machine side is
 * written `:PATH` (relative paths are the machine's workspace). Either every
 * SRC is local and DEST is `:PATH` (upload), or every SRC is `:PATH` and DEST
 * is local (download). Over SFTP on the pinned gateway connection
 * (src/client/files.ts): modes kept, directories with -r, a file is written
 * under a temporary name and renamed only once complete on either side
 * (locally `NAME.partial`), progress on stderr when it is a terminal.
 * SIGINT/SIGTERM/SIGHUP (Ctrl-C) stop the copy, remove the partial files on
 * both sides (MachineFiles.abort) and exit 130/143/129; a second signal
 * exits at once.
 */
import type { Command } from "commander";
import { existsSync, readFileSync, statSync } from "node:fs";
import { basename, join } from "node:path";
import { posix } from "node:path";
import { BerthError } from "../../core/errors.js";
import { MachineFiles, openSftp } from "../../client/files.js";
import { connect, type SshConnection } from "../../client/ssh.js";
import { exitCodeOf, reportError, UsageError } from "../common.js";
import { planFromReceipt } from "./ssh.js";

const SIGNAL_EXIT = { SIGINT: 130, SIGTERM: 143, SIGHUP: 129 } as const;

interface CpOptions {
  receipt?: string;
  recursive: boolean;
  quiet: boolean;
  url?: string;
  tokenFile?: string;
  config?: string;
  keyDir?: string;
}

/** What to copy where: pure, from the arguments alone. */
export type CpPlan = { direction: "up"; sources: string[]; dest: string } | { direction: "down"; sources: string[]; dest: string };

export function cpPlan(args: string[]): CpPlan {
  if (args.length < 2) throw new UsageError("say what to copy where: berth cp SRC… DEST, with :PATH for the machine side");
  const dest = args[args.length - 1]!;
  const sources = args.slice(0, -1);
  const remote = (a: string) => a.startsWith(":");
  if (remote(dest) && sources.every((s) => !remote(s))) return { direction: "up", sources, dest: dest.slice(1) || "." };
  if (!remote(dest) && sources.every(remote)) return { direction: "down", sources: sources.map((s) => s.slice(1) || "."), dest };
  throw new UsageError("copy either local files to :PATH on the machine, or :PATH files from it to a local path (one direction per command)");
}

/** The progress line on a terminal, and `end()`, which closes a line left open (a cut copy) so an error starts on its own line. */
function progress(quiet: boolean): { onProgress?: (done: number, total: number, path: string) => void; end(): void } {
  if (quiet || !process.stderr.isTTY) return { end() {} };
  const started = Date.now();
  let last = 0;
  let open = false;
  return {
    onProgress(done, total, path) {
      const t = Date.now();
      if (t - last < 100 && done < total) return;
      last = t;
      const pct = total > 0 ? Math.floor((done / total) * 100) : 100;
      const mbs = done / 1e6 / Math.max(0.001, (t - started) / 1000);
      open = done < total;
      process.stderr.write(`\r\x1b[K${basename(path)}  ${pct}%  ${(done / 1e6).toFixed(1)} MB  ${mbs.toFixed(1)} MB/s${open ? "" : "\n"}`);
    },
    end() {
      if (open) process.stderr.write("\n");
      open = false;
    },
  };
}

async function run(files: MachineFiles, plan: CpPlan, o: CpOptions, p: ReturnType<typeof progress>): Promise<void> {
  try {
    await copy(files, plan, o, p.onProgress);
  } finally {
    p.end();
  }
}

async function copy(files: MachineFiles, plan: CpPlan, o: CpOptions, onProgress: ((done: number, total: number, path: string) => void) | undefined): Promise<void> {
  const opts = { recursive: o.recursive, ...(onProgress ? { onProgress } : {}) };
  if (plan.direction === "up") {
    const destStat = await files.stat(plan.dest).catch((e: unknown) => {
      if (e instanceof BerthError && e.code === "not_found") return null;
      throw e;
    });
    const intoDir = destStat?.type === "directory";
    if (plan.sources.length > 1 && !intoDir) throw new BerthError("conflict", `conflict: copying ${plan.sources.length} files needs a directory on the machine; :${plan.dest} is ${destStat ? "not one" : "missing"}`);
    for (const s of plan.sources) {
      const target = intoDir ? posix.join(plan.dest, basename(s)) : plan.dest;
      await files.upload(s, target, opts);
    }
    return;
  }
  const intoDir = existsSync(plan.dest) && statSync(plan.dest).isDirectory();
  if (plan.sources.length > 1 && !intoDir) throw new BerthError("conflict", `conflict: copying ${plan.sources.length} files needs a local directory; ${plan.dest} is ${existsSync(plan.dest) ? "not one" : "missing"}`);
  for (const s of plan.sources) {
    const target = intoDir ? join(plan.dest, posix.basename(s) || "workspace") : plan.dest;
    await files.download(s, target, opts);
  }
}

export function register(program: Command): void {
  program
    .command("cp")
    .description("Copy files to or from a borrowed machine over SFTP (:PATH is the machine side; relative to its workspace)")
    .argument("[args...]", "[ALLOCATION] SRC… DEST")
    .option("--receipt <file>", "the borrow's receipt (from `berth borrow`)")
    .option("-r, --recursive", "copy directories with everything under them", false)
    .option("-q, --quiet", "no progress on stderr", false)
    .option("--url <url>", "coordinator URL (or BERTH_URL; default: the receipt's)")
    .option("--token-file <file>", "API token file (or BERTH_TOKEN_FILE)")
    .option("--config <file>", "client config file (keeper borrows: its keeperKeyFile is the key)")
    .option("--key-dir <dir>", "where berth alloc create wrote the allocation's key (or BERTH_KEY_DIR)")
    .addHelpText(
      "after",
      `
Modes are kept. A file is written under a temporary name and renamed once it is
complete (locally NAME.partial), so a cut copy (the borrow returned or expired,
the connection lost) leaves nothing under the target name. Ctrl-C stops the
copy and removes its partial file on both sides.
Exit status: 0 copied; 1 refused or failed (the message starts with its code:
not_found, forbidden, conflict, disk_full, sftp_unavailable, transfer_cut, …);
2 usage; 130/143/129 interrupted by SIGINT/SIGTERM/SIGHUP.

Examples:
  berth cp --receipt b.json ./build.tar.gz :
  berth cp --receipt b.json -r ./src :src
  berth cp --receipt b.json :results/report.xml .
  berth cp my-workspace -r :logs ./logs`,
    )
    .action(copyFiles);
}

/** The copy: stopped cleanly by a signal; the machine found; connected; copied; berth exits with the status. */
async function copyFiles(args: string[], o: CpOptions): Promise<void> {
  let status = 0;
  let conn: SshConnection | null = null;
  let closeApi: (() => Promise<void>) | null = null;
  let files: MachineFiles | null = null;
  const p = progress(o.quiet);
  let stopping = false;
  const stop = (sig: keyof typeof SIGNAL_EXIT) => {
    if (stopping) process.exit(SIGNAL_EXIT[sig]);
    stopping = true;
    p.end();
    void (async () => {
      const left = (await files?.abort().catch(() => ["(unknown)"])) ?? [];
      process.stderr.write(
        left.length === 0
          ? `berth: interrupted by ${sig}; the copy was stopped and its partial files removed\n`
          : `berth: interrupted by ${sig}; the copy was stopped, but could not remove: ${left.join(", ")}\n`,
      );
      conn?.end();
      process.exit(SIGNAL_EXIT[sig]);
    })();
  };
  for (const sig of Object.keys(SIGNAL_EXIT) as (keyof typeof SIGNAL_EXIT)[]) process.on(sig, () => stop(sig));
  try {
    const found = await cpTarget(args, o);
    closeApi = found.closeApi;
    const { target, rest } = found;
    const plan = cpPlan(rest);
    conn = await connect({ host: target.host, port: target.port, user: target.user, hostKey: target.hostKey, privateKey: readKey(target.keyFile) });
    files = new MachineFiles(await openSftp(conn));
    try {
      await run(files, plan, o, p);
    } finally {
      files.close();
    }
  } catch (e) {
    // Interrupted: the signal handler removes the partial files, reports and exits.
    if (stopping) return;
    reportError(e);
    status = exitCodeOf(e);
  }
  conn?.end();
  await closeApi?.().catch(() => undefined);
  process.exit(status);
}

/** The machine to copy with: the receipt's, or the allocation named first (then the rest are the paths). */
async function cpTarget(args: string[], o: CpOptions): Promise<{ target: { host: string; port: number; user: string; hostKey: string; keyFile: string }; rest: string[]; closeApi: (() => Promise<void>) | null }> {
  if (o.receipt) {
    const plan = planFromReceipt(o.receipt, o);
    return { target: plan, rest: args, closeApi: () => plan.api?.close() ?? Promise.resolve() };
  }
  if (args.length < 3) throw new UsageError("say which machine: berth cp --receipt FILE SRC… DEST, or berth cp ALLOCATION SRC… DEST");
  const { planFromAllocation } = await import("./ssh-alloc.js");
  return { target: await planFromAllocation(args[0]!, o), rest: args.slice(1), closeApi: null };
}

function readKey(file: string): string {
  try {
    return readFileSync(file, "utf8");
  } catch (e) {
    throw new BerthError("invalid_request", `invalid_request: cannot read the private key ${file}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
  }
}
