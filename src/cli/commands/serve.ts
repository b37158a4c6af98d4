/** `berth serve`: the coordinator, on SQLite (default) or PostgreSQL (BERTH_PG_URL). */
import type { Command } from "commander";
import { join, resolve } from "node:path";
import { mkdirSync, readFileSync } from "node:fs";
import { hashToken } from "../../core/tokens.js";
import { parseBytes } from "../../core/bytes.js";
import { parseSizeSpec, sizeCatalog } from "../../core/allocation-sizes.js";
import { StateDirLock } from "../state-lock.js";
import { durationArg, loadOrCreateSecret, openStoreFromFlags, runCommand } from "../common.js";
import { httpLimitOptions, httpLimitsFrom, type HttpLimitFlags } from "../http-limits.js";

async function startAws(file: string, store: import("../../store/store.js").Store) {
  const { AwsProvider } = await import("../../providers/aws/aws-provider.js");
  const { loadAwsConfig } = await import("../../providers/aws/config.js");
  const { storeLaunchRecords } = await import("../../store/aws-launches.js");
  const { liveMachinesIn, startSweepLoop } = await import("../../providers/aws/sweep.js");
  const provider = new AwsProvider({ config: loadAwsConfig(file), records: storeLaunchRecords(store) });
  return {
    provider,
    sweep: (store: Parameters<typeof liveMachinesIn>[0], log: Parameters<typeof startSweepLoop>[3]) => startSweepLoop(provider, liveMachinesIn(store), 5 * 60_000, log),
  };
}

/** One token from a file (never argv); a missing or malformed file stops the start with a clear message. */
function readSecretLine(file: string, flag: string): string {
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch (e) {
    throw new Error(`${flag} ${file}: cannot read it (${(e as NodeJS.ErrnoException).code ?? "error"})`);
  }
  const token = text.trim();
  if (token.length < 16 || /\s/.test(token)) throw new Error(`${flag} ${file}: the file must hold exactly one token of at least 16 characters`);
  return token;
}

export function parseListen(v: string): { host: string; port: number } {
  const i = v.lastIndexOf(":");
  const host = i > 0 ? v.slice(0, i).replace(/^\[|\]$/g, "") : "127.0.0.1";
  const port = Number(i >= 0 ? v.slice(i + 1) : v);
  if (!Number.isInteger(port) || port < 0 || port > 65535) throw new Error(`--listen ${v}: expected HOST:PORT`);
  return { host, port };
}

/** MiB of a size figure as `--alloc-size` takes it: units as parseBytes reads them, a plain number is MiB. */
function sizeMib(text: string, what: string): number {
  return Math.floor(parseBytes(/^\s*\d+\s*$/.test(text) ? `${text.trim()}M` : text, what) / 2 ** 20);
}

export function register(program: Command): void {
  const serve = program
    .command("serve")
    .description("Run the coordinator: HTTP API, reconciler and operation executor")
    .option("--state-dir <dir>", "directory for the SQLite database and the coordinator secret", ".berth")
    .option("--db <file>", "SQLite database file (default: <state-dir>/berth.db); set BERTH_PG_URL to use PostgreSQL instead")
    .option("--listen <host:port>", "address of the HTTP API", "127.0.0.1:7420")
    .option("--secret-file <file>", "coordinator secret (created 0600 if missing; share it between coordinators on one database)")
    .option("--portable", "enable portable access (per-borrow keys, two-phase acknowledgement); off by default", false)
    .option("--alloc-actor-lease <duration>", "lease of an allocation's launch actor: past it, another coordinator may take the launch over (default 15s)", durationArg("--alloc-actor-lease"))
    .option("--alloc-watch <duration>", "how often each ready allocation's sandbox is asked after on its host (a dead one becomes failed; default 15s)", durationArg("--alloc-watch"))
    .option(
      "--alloc-size <NAME=VCPU,MEMORY,DISK>",
      "an allocation size, e.g. small=2,4G,20G (repeatable; given once, the catalog is exactly these; default small=2,4G,20G and large=4,8G,40G; a plain number is MiB)",
      (v: string, acc: string[]) => [...acc, v],
      [] as string[],
    )
    .option("--metrics-token-file <file>", "require this token (one line, read at start) as 'Authorization: Bearer' on GET /metrics; default: /metrics is open")
    .option("--aws-config <file>", "enable the aws provider with this pool configuration (docs/aws.md); credentials come from the AWS SDK's default chain");
  httpLimitOptions(serve, "HTTP API")
    .addHelpText(
      "after",
      `
Storage: a single SQLite file by default. To run several coordinators, set
BERTH_PG_URL=postgres://… (read from the environment, never argv) on each,
with the same --secret-file.

Example:
  berth serve --state-dir /var/lib/berth --listen 0.0.0.0:7420`,
    )
    .action((o: { stateDir: string; db?: string; listen: string; secretFile?: string; portable: boolean; awsConfig?: string; allocActorLease?: number; allocWatch?: number; allocSize: string[]; metricsTokenFile?: string } & HttpLimitFlags) =>
      runCommand(async () => {
        const httpLimits = httpLimitsFrom(o);
        // Checked before anything starts: a bad size is refused with its reason.
        const sizes = o.allocSize.length > 0 ? [...sizeCatalog(o.allocSize.map((t) => parseSizeSpec(t, sizeMib))).values()] : null;
        const dir = resolve(o.stateDir);
        mkdirSync(dir, { recursive: true, mode: 0o700 });
        // Shared: other berth serves may use this directory's database too, a berth up may not (state-lock.ts).
        const lock = StateDirLock.take(dir, "berth serve");
        const store = await openStoreFromFlags({ ...o, init: true });
        const secret = loadOrCreateSecret(o.secretFile ? resolve(o.secretFile) : join(dir, "coordinator.secret"));
        const { host, port } = parseListen(o.listen);
        const metricsTokenHash = o.metricsTokenFile === undefined ? null : hashToken("api", readSecretLine(resolve(o.metricsTokenFile), "--metrics-token-file"));
        // Loaded only here: every other command starts without the coordinator.
        const { startCoordinator } = await import("../../coordinator/server.js");
        const aws = o.awsConfig ? await startAws(resolve(o.awsConfig), store) : null;
        const c = await startCoordinator({ store, secret, host, port, config: { portable: o.portable, ...(o.allocActorLease !== undefined ? { allocationActorLeaseMs: o.allocActorLease } : {}), ...(o.allocWatch !== undefined ? { allocationWatchMs: o.allocWatch } : {}), ...(sizes ? { allocationSizes: sizes } : {}) }, providers: aws ? [aws.provider] : [], metricsTokenHash, httpLimits });
        const stopSweep = aws ? aws.sweep(store, c.ctx.log) : () => undefined;
        lock.setUrl(c.url);
        c.ctx.log.info({ url: c.url, store: store.dialect, portable: o.portable }, "berth coordinator listening");
        process.stdout.write(`berth coordinator listening on ${c.url} (${store.dialect}${o.portable ? ", portable access enabled" : ""})\n`);
        process.stdout.write(`dashboard at ${c.url}/ui (sign in with an API token: berth token create)\n`);
        await new Promise<void>((resolveStop) => {
          const stop = () => resolveStop();
          process.once("SIGINT", stop);
          process.once("SIGTERM", stop);
        });
        stopSweep();
        await c.stop();
        await store.close();
        lock.release();
        return 0;
      }),
    );
}
