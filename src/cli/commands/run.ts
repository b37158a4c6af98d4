/**
 * `berth run --pool NAME -- CMD...`: borrow, run the command over SSH with
 * its output streamed, give the machine back. Built on the client library's
 * `run` (src/client/client.ts).
 *
 * Behaves like `ssh HOST CMD`:
 *   - standard input is forwarded when it is not a terminal (pipes, files),
 *     EOF included; `-n` turns that off (`-i` forwards a terminal too);
 *   - SIGINT/SIGTERM/SIGHUP are forwarded to the remote command as SSH
 *     signals; it gets a short grace to end, then the session is closed. A
 *     second signal stops waiting at once. Either way the machine is returned
 *     normally (fenced, scrubbed, reused) and berth exits 130/143/129;
 *   - an empty pool is waited on for up to `--wait` (progress on a terminal
 *     only), then 69.
 *
 * Exit status: the command's own. If the command succeeded but the machine
 * could not be given back, 75 (cleanup failed, reported on its own line). If
 * the borrow's hard deadline arrives first, the command is interrupted,
 * expiry is reported, and the status is 124. Heartbeats run during the
 * command; they never move the deadline.
 */
import type { Command } from "commander";
import { Option } from "commander";
import { fstatSync, mkdirSync, statSync } from "node:fs";
import { isatty } from "node:tty";
import { join } from "node:path";
import { randomBytes } from "node:crypto";
import { BerthClient, type RunResult } from "../../client/client.js";
import type { RemoteCommand } from "../../client/ssh.js";
import { loadConfig, type ClientConfig } from "../../client/config.js";
import { waitProgress } from "../wait-progress.js";
import { borrowDurationArg, describeError, durationArg, EXIT, exitCodeOf, iso, reportError, UsageError } from "../common.js";

export { shellQuote } from "../../client/ssh.js";

export interface RunOptions {
  pool: string;
  access: "keeper" | "portable";
  durationMs?: number;
  drain: boolean;
  quiet: boolean;
  /** Forward standard input: "auto" when it is not a terminal, or always/never. */
  stdin: "auto" | "always" | "never";
  /** How long to wait for a ready machine (ms). */
  waitMs: number;
  /** How long the remote command has to end after a forwarded signal (ms). */
  graceMs?: number;
}

const SIGNAL_EXIT = { SIGINT: 130, SIGTERM: 143, SIGHUP: 129 } as const;
type Forwarded = keyof typeof SIGNAL_EXIT;
export const DEFAULT_WAIT_MS = 5_000;
const DEFAULT_GRACE_MS = 3_000;

/** Standard input is /dev/null (as under cron, CI runners, `< /dev/null`): EOF at once, without opening a stream on it. */
function isDevNull(fd: number): boolean {
  try {
    const st = fstatSync(fd);
    return st.isCharacterDevice() && st.rdev === statSync("/dev/null").rdev;
  } catch {
    return false;
  }
}

/**
 * The signals of a run: before the command starts they abort it (the machine
 * is still returned); once it runs, the first is forwarded and the second
 * stops waiting. `stop` removes the handlers.
 */
function forwardSignals(say: (s: string) => void, graceMs: number): { signal: AbortSignal; got: () => Forwarded | null; onStart: (c: RemoteCommand) => void; stop: () => void } {
  const abort = new AbortController();
  let got: Forwarded | null = null;
  let cmd: RemoteCommand | null = null;
  let grace: NodeJS.Timeout | null = null;
  const onSignal = (sig: Forwarded) => {
    if (got !== null || !cmd) {
      if (got === null) got = sig;
      if (cmd) {
        say(`${sig} again: closing the session`);
        cmd.close();
      } else abort.abort(new Error(`interrupted by ${sig}`));
      return;
    }
    got = sig;
    cmd.signal(sig.slice(3));
    grace = setTimeout(() => cmd?.close(), graceMs);
  };
  const handlers = (["SIGINT", "SIGTERM", "SIGHUP"] as const).map((s) => [s, () => onSignal(s)] as const);
  for (const [s, h] of handlers) process.on(s, h);
  return {
    signal: abort.signal,
    got: () => got,
    onStart: (c) => {
      cmd = c;
      // A signal that arrived while the session was opening is forwarded now.
      if (got !== null) {
        c.signal(got.slice(3));
        grace = setTimeout(() => c.close(), graceMs);
      }
    },
    stop: () => {
      if (grace) clearTimeout(grace);
      for (const [s, h] of handlers) process.off(s, h);
    },
  };
}

/** A fresh receipt path under the client's state directory (the directory made owner-only). */
function runReceiptPath(stateDir: string): string {
  const dir = join(stateDir, "receipts");
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  return join(dir, `run-${randomBytes(6).toString("hex")}.json`);
}

/** The exit status of a run that ended: the command's own, or the signal's, or a cut or a failed return's; each reported. */
function statusOfRun(r: RunResult, got: Forwarded | null, expiresAt: number, receiptPath: string, say: (s: string) => void): number {
  if (r.expired) process.stderr.write(`berth: borrow ${r.borrowId} expired at ${iso(expiresAt)}; the command was interrupted\n`);
  else if (r.cut && got === null) process.stderr.write("berth: the SSH session ended without an exit status (access was cut)\n");
  let status = got !== null ? SIGNAL_EXIT[got] : r.cut && !r.expired ? EXIT.error : r.status;
  if (r.returned) say(`returned ${r.machineId}${r.returned.cleanup ? ` (cleanup: ${r.returned.cleanup})` : ""}`);
  else {
    // The command's own status wins; a cleanup failure is reported on its own line,
    // and decides the exit status only when the command itself succeeded.
    process.stderr.write(`berth: cleanup failed: ${describeError(r.returnError)}; the receipt is kept at ${receiptPath} (retry: berth return --receipt ${receiptPath})\n`);
    if (status === 0) status = EXIT.cleanup;
  }
  return status;
}

/** The exit status of a run that failed before its command ended (a signal's, or the error's), with a failed return reported. */
function statusOfFailure(e: unknown, got: Forwarded | null, receiptPath: string, say: (s: string) => void): number {
  const returnError = (e as { returnError?: unknown }).returnError;
  if (got !== null) {
    say(`${got}: stopped before the command ran`);
    if (returnError) process.stderr.write(`berth: cleanup failed: ${describeError(returnError)}; retry: berth return --receipt ${receiptPath}\n`);
    return SIGNAL_EXIT[got];
  }
  reportError(e);
  if (returnError) process.stderr.write(`berth: cleanup failed: ${describeError(returnError)}; the receipt is kept at ${receiptPath} (retry: berth return --receipt ${receiptPath})\n`);
  return exitCodeOf(e);
}

/** The whole run; resolves with the process exit status. Used by `berth run` and `berth up -- CMD`. */
export async function runOnBorrowed(client: BerthClient, config: Pick<ClientConfig, "stateDir">, argv: string[], o: RunOptions): Promise<number> {
  const say = (s: string) => {
    if (!o.quiet) process.stderr.write(`berth: ${s}\n`);
  };
  const receiptPath = runReceiptPath(config.stateDir);
  const signals = forwardSignals(say, o.graceMs ?? DEFAULT_GRACE_MS);
  const waiting = waitProgress(o.pool, o.waitMs, o.quiet);
  let expiresAt = 0;
  const forwardStdin = o.stdin === "always" || (o.stdin === "auto" && !isatty(0) && !isDevNull(0));
  try {
    const r = await client.run({
      pool: o.pool,
      access: o.access,
      durationMs: o.durationMs,
      drain: o.drain,
      receiptPath,
      waitMs: o.waitMs,
      signal: signals.signal,
      command: argv,
      stdin: forwardStdin ? process.stdin : null,
      stdout: process.stdout,
      stderr: process.stderr,
      onWait: (ms, why) => waiting.onWait(ms, why),
      onBorrowed: (b) => {
        waiting.done();
        expiresAt = b.expiresAt;
        say(`borrowed ${b.machine.id} from ${o.pool} (${o.access}); hard deadline ${iso(b.expiresAt)}`);
      },
      onStart: signals.onStart,
    });
    return statusOfRun(r, signals.got(), expiresAt, receiptPath, say);
  } catch (e) {
    waiting.done();
    return statusOfFailure(e, signals.got(), receiptPath, say);
  } finally {
    signals.stop();
    // Whatever was forwarded, stdin must not keep berth alive after the command ended.
    if (forwardStdin) process.stdin.destroy();
  }
}

export function register(program: Command): void {
  program
    .command("run")
    .description("Borrow a machine, run a command on it over SSH, give it back; exits with the command's status")
    .option("--pool <name>", "pool to borrow from (or BERTH_POOL, or the client config's pool: `default` after `berth up`)")
    .addOption(new Option("--pool-access <mode>", "keeper (default) or portable (explicit opt-in)").choices(["keeper", "portable"]).default("keeper"))
    .option("--duration <duration>", "borrow length (keeper: default 30m or half the pool's hard TTL, at most what its machines live; portable: max 30m); the command is interrupted at the deadline", borrowDurationArg())
    .addOption(new Option("--wait <duration>", "wait this long for a ready machine when the pool is empty").argParser(durationArg("--wait")).default(DEFAULT_WAIT_MS, `${DEFAULT_WAIT_MS / 1000}s`))
    .option("--drain", "retire the machine afterwards instead of returning it to the pool", false)
    .option("-n, --no-stdin", "do not forward standard input (the command reads EOF), as ssh -n")
    .option("-i, --stdin", "forward standard input even when it is a terminal")
    .option("-q, --quiet", "print nothing of berth's own", false)
    .option("--url <url>", "coordinator URL (or BERTH_URL)")
    .option("--token-file <file>", "API token file (or BERTH_TOKEN_FILE)")
    .option("--config <file>", "client config file")
    .argument("<command...>", "the command and its arguments (after --)")
    .addHelpText(
      "after",
      `
Standard input is forwarded when it is not a terminal (pipes, files); -n turns it off.
Ctrl-C (SIGINT), SIGTERM and SIGHUP go to the remote command, which gets ${DEFAULT_GRACE_MS / 1000}s to end;
a second one stops waiting. The machine is returned either way; exit 130/143/129.

Exit status: the command's own; 75 if it succeeded but the machine could not be
returned (reported separately); 124 if the borrow's hard deadline interrupted it;
69 if no machine became ready within --wait (default ${DEFAULT_WAIT_MS / 1000}s); 2 for usage errors.

Examples:
  berth run --pool default -- npm test
  echo hi | berth run --pool default -- cat
  berth run --pool agents --pool-access portable --duration 5m -- ./job.sh`,
    )
    .action(async (argv: string[], o: { pool?: string; poolAccess: "keeper" | "portable"; duration?: number; wait: number; drain: boolean; stdin?: boolean; quiet: boolean; url?: string; tokenFile?: string; config?: string }) => {
      let client: BerthClient | null = null;
      let status: number;
      try {
        const config = loadConfig(o);
        const pool = o.pool ?? config.pool;
        if (!pool) throw new UsageError("no pool given; pass --pool NAME, set BERTH_POOL, or add \"pool\" to the client config (`berth pool ls` lists them)");
        client = new BerthClient({ url: config.url, token: config.token, keeperKeyFile: config.keeperKeyFile });
        const stdin = o.stdin === false ? "never" : o.stdin === true ? "always" : "auto";
        status = await runOnBorrowed(client, config, argv, { pool, access: o.poolAccess, durationMs: o.duration, drain: o.drain, quiet: o.quiet, stdin, waitMs: o.wait });
      } catch (e) {
        reportError(e);
        status = exitCodeOf(e);
      }
      await client?.close();
      process.exitCode = status;
    });
}
