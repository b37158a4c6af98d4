/**
 * `berth ssh --receipt FILE [-- CMD...]`: a real terminal on a borrowed machine;
 * `berth ssh ALLOCATION [-- CMD...]`: the same on a ready allocation (ssh-alloc.ts).
 *
 * The data plane goes straight to the machine's gateway (ssh2 client, host key
 * pinned from the receipt). Terminal contract, on the local side (terminal-session.ts):
 *   - raw mode while the session runs, restored on every way out: the remote
 *     shell exits, the connection closes or fails, SIGTERM/SIGHUP/SIGINT to
 *     berth, an exception, process exit;
 *   - the window size is sent with the PTY request and again on every SIGWINCH;
 *   - Ctrl-Z suspends berth itself, locally: the terminal is restored first,
 *     then berth stops itself (SIGSTOP); on SIGCONT it re-enters raw mode and
 *     sends the current window size. Nothing is signalled in the machine
 *     (a remote job is suspended with the remote shell's own means, e.g. `kill -TSTP`);
 *   - Ctrl-C and every other byte go to the remote terminal unchanged, whose
 *     line discipline turns them into signals for the remote foreground job;
 *   - berth exits with the remote shell's exit status (128 + n for a signal;
 *     255 when the connection ended without one, e.g. access was cut).
 * Without a local terminal (stdin or stdout not a TTY) no PTY is requested and
 * bytes are piped both ways.
 *
 * `--print` prints the equivalent system `ssh` command line instead: the key
 * file, the port, and a known_hosts file written next to the receipt holding
 * exactly the pinned host key, with strict host key checking.
 *
 * While the session is open, the borrow is heartbeated when the client config
 * is available (heartbeats never move the hard deadline).
 */
import type { Command } from "commander";
import { readFileSync } from "node:fs";
import { resolve } from "node:path";
import { BerthError } from "../../core/errors.js";
import { BerthClient } from "../../client/client.js";
import { Borrow } from "../../client/borrow.js";
import { loadConfig, type ConfigFlags } from "../../client/config.js";
import { connect, shellQuote } from "../../client/ssh.js";
import { readReceipt, type Receipt } from "../receipt.js";
import { systemSshCommand } from "../ssh-command.js";
import { interactive } from "../terminal-session.js";
import { describeError, exitCodeOf, iso, reportError, UsageError } from "../common.js";

/** Everything needed to reach the borrowed machine. */
export interface SshPlan {
  receipt: Receipt;
  receiptPath: string;
  host: string;
  port: number;
  user: string;
  /** "ssh-ed25519 AAAA…" (type and key only). */
  hostKey: string;
  keyFile: string;
  /** The coordinator, for heartbeats; null when no client config could be loaded. */
  api: BerthClient | null;
}

/** Read and check the receipt; pick the private key (portable: the receipt's, keeper: the client config's). */
export function planFromReceipt(path: string, flags: ConfigFlags, now = Date.now()): SshPlan {
  const receiptPath = resolve(path);
  const r = readReceipt(receiptPath);
  if (r.state === "pending") throw new BerthError("borrow_not_active", `borrow_not_active: borrow ${r.borrowId} is not acknowledged yet; run: berth ack --receipt ${path}`);
  if (r.state === "returned") throw new BerthError("borrow_not_active", `borrow_not_active: borrow ${r.borrowId} was returned; borrow again`);
  if (r.state === "expired" || now >= r.expiresAt) throw new BerthError("borrow_expired", `borrow_expired: borrow ${r.borrowId} expired at ${iso(r.expiresAt)}; borrow again`);
  const s = r.machine.ssh;
  if (!s.host || !s.port || !s.hostKey) {
    throw new BerthError("invalid_request", `invalid_request: the receipt of borrow ${r.borrowId} names no SSH endpoint with a pinned host key; refusing to connect`);
  }
  const hostKey = s.hostKey.trim().split(/\s+/).slice(0, 2).join(" ");
  if (!/^ssh-[a-z0-9-]+ [A-Za-z0-9+/=]+$/.test(hostKey)) throw new BerthError("invalid_request", `invalid_request: the receipt's host key is not an OpenSSH public key line`);
  let config: ReturnType<typeof loadConfig> | null = null;
  let configError: unknown = null;
  try {
    config = loadConfig({ ...flags, url: flags.url ?? r.url });
  } catch (e) {
    configError = e;
  }
  let keyFile: string | null;
  if (r.access === "portable") keyFile = r.keyFile;
  else {
    if (!config) throw configError instanceof Error ? configError : new BerthError("invalid_request", "invalid_request: no client config");
    keyFile = config.keeperKeyFile;
    if (!keyFile) throw new BerthError("invalid_request", "invalid_request: keeper borrows use the client config's keeperKeyFile, and it is not set; `berth up` writes one, or add it to the config");
  }
  if (!keyFile) throw new BerthError("invalid_request", `invalid_request: the receipt of borrow ${r.borrowId} names no key file`);
  return { receipt: r, receiptPath, host: s.host, port: s.port, user: s.user ?? r.machine.id, hostKey, keyFile, api: config ? new BerthClient({ url: config.url, token: config.token }) : null };
}

export { knownHostsLine, systemSshCommand } from "../ssh-command.js";

/** Heartbeat the borrow while the session runs; returns a stop function. Refusals are reported once. */
function keepAlive(plan: SshPlan): () => void {
  const api = plan.api;
  if (!api) return () => {};
  let warned = false;
  const t = setInterval(() => {
    api.heartbeat(new Borrow(plan.receipt, plan.receiptPath)).catch((e: unknown) => {
      if (warned) return;
      warned = true;
      process.stderr.write(`\r\nberth: heartbeat refused: ${describeError(e)}\r\n`);
    });
  }, Math.max(1000, Math.floor(plan.receipt.heartbeatMs / 3)));
  t.unref();
  return () => clearInterval(t);
}

export function register(program: Command): void {
  program
    .command("ssh")
    .description("Open a terminal on a borrowed machine (or run one command with a PTY); exits with the remote status")
    .argument("[target...]", "ALLOCATION, or after `--` a command to run with a PTY")
    .option("--receipt <file>", "the borrow's receipt (from `berth borrow`)")
    .option("--print", "print the equivalent system `ssh` command line (writes a pinned known_hosts file next to the receipt)", false)
    .option("--url <url>", "coordinator URL (or BERTH_URL; default: the receipt's)")
    .option("--token-file <file>", "API token file (or BERTH_TOKEN_FILE)")
    .option("--config <file>", "client config file (keeper borrows: its keeperKeyFile is the key)")
    .option("--key-dir <dir>", "where berth alloc create wrote the allocation's key (or BERTH_KEY_DIR)")
    .addHelpText(
      "after",
      `
Ctrl-Z suspends berth itself (the terminal is restored first; \`fg\` resumes it and
resends the window size). Ctrl-C goes to the remote terminal.
Exit status: the remote shell's or command's; 255 if the session ended without one;
2 for usage errors.

Examples:
  berth ssh my-workspace
  berth ssh my-workspace -- make test
  $(berth ssh --print my-workspace)
  berth ssh --receipt b.json
  berth ssh --receipt b.json -- top
  $(berth ssh --print --receipt b.json)`,
    )
    .action(async (target: string[], o: { receipt?: string; print: boolean; url?: string; tokenFile?: string; config?: string; keyDir?: string }) => {
      let status: number;
      let plan: SshPlan | null = null;
      try {
        if (!o.receipt) {
          if (target.length === 0) throw new UsageError("say what to connect to: berth ssh ALLOCATION, or berth ssh --receipt FILE");
          const { planFromAllocation } = await import("./ssh-alloc.js");
          const ap = await planFromAllocation(target[0]!, o);
          const command = target.slice(1);
          if (o.print) {
            process.stdout.write(shellQuote(systemSshCommand(ap, command)) + "\n");
            process.exit(0);
          }
          const client = await connect({ host: ap.host, port: ap.port, user: ap.user, hostKey: ap.hostKey, privateKey: readKey(ap.keyFile) });
          process.exit(await interactive(client, command.length > 0 ? shellQuote(command) : null, {}));
        }
        plan = planFromReceipt(o.receipt, o);
        if (o.print) {
          process.stdout.write(shellQuote(systemSshCommand(plan, target)) + "\n");
          status = 0;
        } else {
          const client = await connect({ host: plan.host, port: plan.port, user: plan.user, hostKey: plan.hostKey, privateKey: readKey(plan.keyFile) });
          const stop = keepAlive(plan);
          try {
            status = await interactive(client, target.length > 0 ? shellQuote(target) : null, {});
          } finally {
            stop();
          }
        }
      } catch (e) {
        reportError(e);
        status = exitCodeOf(e);
      }
      await plan?.api?.close().catch(() => undefined);
      // stdin may still hold a TTY handle open; the session is over, so exit now.
      process.exit(status);
    });
}

function readKey(file: string): string {
  try {
    return readFileSync(file, "utf8");
  } catch (e) {
    throw new BerthError("invalid_request", `invalid_request: cannot read the private key ${file}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
  }
}
