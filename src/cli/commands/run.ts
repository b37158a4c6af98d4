/**
 * `berth run --pool NAME -- CMD...`: borrow, run the command over SSH with
 * its output streamed, give the machine back.
 *
 * Exit status: the command's own. If the command succeeded but the machine
 * could not be given back, 75 (cleanup failed, reported on its own line). If
 * the borrow's hard deadline arrives first, the command is interrupted,
 * expiry is reported, and the status is 124. Heartbeats run during the
 * command; they never move the deadline.
 */
import type { Command } from "commander";
import { Option } from "commander";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { randomBytes } from "node:crypto";
import { ack, borrow, giveBack, heartbeat, privateKeyFor } from "../borrowing.js";
import { clientFrom, describeError, durationArg, EXIT, exitCodeOf, iso } from "../common.js";
import { connect, execStreaming } from "../ssh-client.js";
import type { Receipt } from "../receipt.js";
import type { Api } from "../api.js";
import type { ClientConfig } from "../config.js";

export function shellQuote(argv: string[]): string {
  return argv.map((a) => (/^[A-Za-z0-9_./:=@%+-]+$/.test(a) ? a : `'${a.replace(/'/g, `'\\''`)}'`)).join(" ");
}

export interface RunOptions {
  pool: string;
  access: "keeper" | "portable";
  durationMs?: number;
  drain: boolean;
  quiet: boolean;
  stdin: boolean;
}

/** The whole run; resolves with the process exit status. Used by `berth run` and `berth up -- CMD`. */
export async function runOnBorrowed(api: Api, config: ClientConfig, argv: string[], o: RunOptions): Promise<number> {
  const say = (s: string) => {
    if (!o.quiet) process.stderr.write(`berth: ${s}\n`);
  };
  const dir = join(config.stateDir, "receipts");
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const receiptPath = join(dir, `run-${randomBytes(6).toString("hex")}.json`);
  const t0 = performance.now();
  let receipt: Receipt = await borrow(api, { url: config.url, pool: o.pool, access: o.access, durationMs: o.durationMs, receiptPath });
  let status: number = EXIT.error;
  let expired = false;
  let commandError: unknown = null;
  let hb: NodeJS.Timeout | null = null;
  let deadline: NodeJS.Timeout | null = null;
  try {
    receipt = await ack(api, receipt, receiptPath);
    say(`borrowed ${receipt.machine.id} from ${o.pool} (${o.access}); hard deadline ${iso(receipt.expiresAt)}`);
    const client = await connect({
      host: receipt.machine.ssh.host ?? "127.0.0.1",
      port: receipt.machine.ssh.port ?? 22,
      user: receipt.machine.ssh.user ?? receipt.machine.id,
      hostKey: receipt.machine.ssh.hostKey ?? "",
      privateKey: privateKeyFor(receipt, config.keeperKeyFile),
    });
    const r0 = receipt;
    hb = setInterval(() => {
      heartbeat(api, r0).catch((e: unknown) => say(`heartbeat refused: ${describeError(e)}`));
    }, Math.max(1000, Math.floor(receipt.heartbeatMs / 3)));
    // The hard deadline is enforced here too (the agent cuts access at the same instant).
    deadline = setTimeout(() => {
      expired = true;
      client.end();
    }, Math.max(0, receipt.expiresAt - Date.now()));
    let firstByte: number | null = null;
    const result = await execStreaming(client, shellQuote(argv), {
      stdout: process.stdout,
      stderr: process.stderr,
      stdin: o.stdin ? process.stdin : null,
      onFirstByte: () => {
        firstByte = performance.now() - t0;
      },
    });
    client.end();
    if (firstByte !== null) api.call("POST", `/v1/borrows/${receipt.borrowId}/report`, { token: receipt.borrowToken, firstCommandMs: firstByte }).catch(() => undefined);
    if (expired || (result.cut && Date.now() >= receipt.expiresAt)) {
      expired = true;
      status = EXIT.expired;
    } else if (result.code !== null) status = result.code;
    else if (result.signal !== null) status = 128 + signalNumber(result.signal);
    else {
      commandError = new Error("the SSH session ended without an exit status (access was cut)");
      status = EXIT.error;
    }
  } catch (e) {
    commandError = e;
    status = exitCodeOf(e);
  } finally {
    if (hb) clearInterval(hb);
    if (deadline) clearTimeout(deadline);
  }
  if (commandError) process.stderr.write(`berth: ${describeError(commandError)}\n`);
  if (expired) process.stderr.write(`berth: borrow ${receipt.borrowId} expired at ${iso(receipt.expiresAt)}; the command was interrupted\n`);
  try {
    const back = await giveBack(api, receipt, receiptPath, o.drain ? "drain" : "ready");
    say(`returned ${receipt.machine.id}${back.cleanup ? ` (cleanup: ${back.cleanup})` : ""}`);
    (await import("../receipt.js")).removeQuietly(receiptPath);
  } catch (e) {
    // The command's own status wins; a cleanup failure is reported on its own line,
    // and decides the exit status only when the command itself succeeded.
    process.stderr.write(`berth: cleanup failed: ${describeError(e)}; the receipt is kept at ${receiptPath} (retry: berth return --receipt ${receiptPath})\n`);
    if (status === 0) status = EXIT.cleanup;
  }
  return status;
}

const SIGNALS: Record<string, number> = { HUP: 1, INT: 2, QUIT: 3, ILL: 4, ABRT: 6, FPE: 8, KILL: 9, SEGV: 11, PIPE: 13, ALRM: 14, TERM: 15 };
function signalNumber(name: string): number {
  return SIGNALS[name.replace(/^SIG/, "")] ?? 1;
}

export function register(program: Command): void {
  program
    .command("run")
    .description("Borrow a machine, run a command on it over SSH, give it back; exits with the command's status")
    .requiredOption("--pool <name>", "pool to borrow from")
    .addOption(new Option("--pool-access <mode>", "keeper (default) or portable (explicit opt-in)").choices(["keeper", "portable"]).default("keeper"))
    .option("--duration <duration>", "portable: borrow length (max 30m); the command is interrupted at the deadline", durationArg("--duration"))
    .option("--drain", "retire the machine afterwards instead of returning it to the pool", false)
    .option("-i, --stdin", "forward standard input to the command", false)
    .option("-q, --quiet", "print nothing of berth's own", false)
    .option("--url <url>", "coordinator URL (or BERTH_URL)")
    .option("--token-file <file>", "API token file (or BERTH_TOKEN_FILE)")
    .option("--config <file>", "client config file")
    .argument("<command...>", "the command and its arguments (after --)")
    .addHelpText(
      "after",
      `
Exit status: the command's own; 75 if it succeeded but the machine could not be
returned (reported separately); 124 if the borrow's hard deadline interrupted it;
69 if no machine was available; 2 for usage errors.

Examples:
  berth run --pool default -- npm test
  berth run --pool agents --pool-access portable --duration 5m -- ./job.sh`,
    )
    .action(async (argv: string[], o: { pool: string; poolAccess: "keeper" | "portable"; duration?: number; drain: boolean; stdin: boolean; quiet: boolean; url?: string; tokenFile?: string; config?: string }) => {
      let api: Api | null = null;
      try {
        const c = clientFrom(o);
        api = c.api;
        process.exitCode = await runOnBorrowed(c.api, c.config, argv, { pool: o.pool, access: o.poolAccess, durationMs: o.duration, drain: o.drain, quiet: o.quiet, stdin: o.stdin });
      } catch (e) {
        process.stderr.write(`berth: ${describeError(e)}\n`);
        process.exitCode = exitCodeOf(e);
      } finally {
        await api?.close();
      }
    });
}
