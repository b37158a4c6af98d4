/** Manual borrows: `berth borrow`, `berth ack`, `berth heartbeat`, `berth return`. Tokens live in the 0600 receipt, never in argv. */
import type { Command } from "commander";
import { Option } from "commander";
import { resolve } from "node:path";
import { Borrow } from "../../client/borrow.js";
import { readReceipt, type Receipt } from "../receipt.js";
import { berthClientFrom, borrowDurationArg, durationArg, iso, printJson, runCommand } from "../common.js";
import { systemSshCommand } from "../ssh-command.js";
import { shellQuote } from "../../client/ssh.js";
import { BerthError } from "../../core/errors.js";
import { waitProgress } from "../wait-progress.js";

/** What a bare `berth borrow --wait` waits. */
const DEFAULT_BORROW_WAIT = "5m";

function clientOpts(c: Command): Command {
  return c.option("--url <url>", "coordinator URL (or BERTH_URL)").option("--token-file <file>", "API token file (or BERTH_TOKEN_FILE)").option("--config <file>", "client config file").option("--json", "print JSON", false);
}

/**
 * The ssh line for a borrow, which works as printed: the host key is pinned in a known_hosts
 * file next to the receipt (written now), the key is the borrow's (portable) or the keeper's.
 */
export function sshHint(r: Receipt, receiptPath: string, keeperKeyFile: string | null): string {
  const s = r.machine.ssh;
  const alt = `or: berth ssh --receipt ${receiptPath}`;
  const keyFile = r.access === "portable" ? r.keyFile : keeperKeyFile;
  if (!s.host || !s.port || !s.hostKey) return alt.replace(/^or: /, "");
  if (!keyFile) return `${alt} (no keeper key in the client config: the system ssh needs one)`;
  const argv = systemSshCommand({ host: s.host, port: s.port, user: s.user ?? r.machine.id, hostKey: s.hostKey, keyFile, receiptPath }, []);
  return `${shellQuote(argv)}\n     (${alt})`;
}

function describe(r: Receipt, label: string): string {
  const access = r.access === "portable" ? (r.state === "pending" ? "PENDING (not usable until `berth ack`)" : r.state.toUpperCase()) : r.state.toUpperCase();
  return `${label} ${r.borrowId} on machine ${r.machine.id} (generation ${r.machine.generation})\n  access        ${r.access}: ${access}\n  hard deadline ${iso(r.expiresAt)} (fixed; heartbeats never extend it)\n  heartbeat     every ${Math.round(r.heartbeatMs / 1000)}s\n`;
}

export function register(program: Command): void {
  registerBorrow(program);
  registerAck(program);
  registerHeartbeat(program);
  registerReturn(program);
}

/** `berth borrow`: borrow a machine from a pool and write its receipt. */
function registerBorrow(program: Command): void {
  clientOpts(
    program
      .command("borrow")
      .description("Borrow a machine from a pool and write a receipt (0600) holding its tokens")
      .argument("<pool>", "pool name")
      .requiredOption("--receipt <file>", "where to write the receipt")
      .addOption(new Option("--access <mode>", "keeper, or portable (explicit opt-in: per-borrow key, two-phase ack)").choices(["keeper", "portable"]).default("keeper"))
      .addOption(
        new Option("--wait [duration]", `when the pool has no ready machine, wait for one this long (bare --wait: ${DEFAULT_BORROW_WAIT}), saying why on stderr; then exit 69 (pool_exhausted)`)
          .argParser(durationArg("--wait"))
          .preset(DEFAULT_BORROW_WAIT),
      )
      .option("--duration <duration>", "how long the borrow lasts. keeper: default 30m (or half the pool's hard TTL if shorter), at most what its machines live; portable: max 30m, capped by the machine's TTL and your token", borrowDurationArg()),
  ).action((pool: string, o: { receipt: string; access: "keeper" | "portable"; duration?: number; wait?: number; json: boolean; url?: string; tokenFile?: string; config?: string }) =>
    runCommand(async () => {
      const waitMs = o.wait ?? 0;
      const { client, config } = berthClientFrom(o);
      const waiting = waitProgress(pool, waitMs, false);
      try {
        const r = (await client.borrow({ pool, access: o.access, durationMs: o.duration, receiptPath: resolve(o.receipt), waitMs, onWait: (ms, why) => waiting.onWait(ms, why) })).receipt;
        waiting.done();
        if (o.json) printJson({ borrowId: r.borrowId, access: r.access, state: r.state, machine: r.machine, expiresAt: r.expiresAt, receipt: resolve(o.receipt) });
        else {
          process.stdout.write(describe(r, "borrowed"));
          process.stdout.write(r.access === "portable" ? `next: berth ack --receipt ${o.receipt}\n` : `ssh: ${sshHint(r, resolve(o.receipt), config.keeperKeyFile)}\n`);
        }
        return 0;
      } finally {
        waiting.done();
        await client.close();
      }
    }),
  );
}

/** `berth ack`: acknowledge a portable borrow (installs its key). */
function registerAck(program: Command): void {
  clientOpts(program.command("ack").description("Acknowledge a portable borrow: installs its key; access is active only after this").requiredOption("--receipt <file>", "the borrow's receipt")).action(
    (o: { receipt: string; json: boolean; url?: string; tokenFile?: string; config?: string }) =>
      runCommand(async () => {
        const path = resolve(o.receipt);
        const receipt = readReceipt(path);
        if (receipt.access !== "portable") throw new BerthError("invalid_request", "invalid_request: only portable borrows are acknowledged; keeper borrows are usable at once");
        const { client } = berthClientFrom({ ...o, url: o.url ?? receipt.url });
        try {
          const r = (await client.ack(new Borrow(receipt, path))).receipt;
          if (o.json) printJson({ borrowId: r.borrowId, state: r.state, expiresAt: r.expiresAt, machine: r.machine });
          else process.stdout.write(describe(r, "acknowledged") + `ssh: ${sshHint(r, path, null)}\n`);
          return 0;
        } finally {
          await client.close();
        }
      }),
  );
}

/** `berth heartbeat`: prove the borrower is alive. */
function registerHeartbeat(program: Command): void {
  clientOpts(program.command("heartbeat").description("Prove the borrower is alive (never extends the hard deadline)").requiredOption("--receipt <file>", "the borrow's receipt")).action(
    (o: { receipt: string; json: boolean; url?: string; tokenFile?: string; config?: string }) =>
      runCommand(async () => {
        const receipt = readReceipt(resolve(o.receipt));
        const { client } = berthClientFrom({ ...o, url: o.url ?? receipt.url });
        try {
          const r = await client.heartbeat(new Borrow(receipt, resolve(o.receipt)));
          if (o.json) printJson(r);
          else process.stdout.write(`heartbeat ok: next by ${iso(r.heartbeatDeadline)}; hard deadline ${iso(r.expiresAt)}\n`);
          return 0;
        } finally {
          await client.close();
        }
      }),
  );
}

/** `berth return`: give the machine back. */
function registerReturn(program: Command): void {
  clientOpts(
    program
      .command("return")
      .description("Give a borrowed machine back; it is fenced and scrubbed before anyone borrows it again")
      .requiredOption("--receipt <file>", "the borrow's receipt")
      .option("--drain", "retire the machine instead of returning it to the pool", false),
  ).action((o: { receipt: string; drain: boolean; json: boolean; url?: string; tokenFile?: string; config?: string }) =>
    runCommand(async () => {
      const path = resolve(o.receipt);
      const receipt = readReceipt(path);
      const { client } = berthClientFrom({ ...o, url: o.url ?? receipt.url });
      try {
        // Idempotent: a return repeated (say after a lost reply) answers where the first one went.
        const r = await client.return(new Borrow(receipt, path), { drain: o.drain, keepReceipt: true });
        if (o.json) printJson({ borrowId: receipt.borrowId, ...r });
        else {
          process.stdout.write(`returned ${receipt.borrowId}: ${r.state}${r.cleanup ? ` (cleanup: ${r.cleanup})` : ""}\n`);
          if (r.repeated) process.stderr.write(`berth: note: borrow ${receipt.borrowId} had already been returned; this is where that return went\n`);
        }
        return 0;
      } finally {
        await client.close();
      }
    }),
  );
}
