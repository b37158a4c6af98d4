/**
 * Shared plumbing of the CLI commands: opening the store for server-side
 * commands, building an API client, printing results, and turning errors
 * into a message and a documented exit code (docs/cli.md):
 *   0 ok · 1 error · 2 usage · 69 unavailable (no ready machine, provider down)
 *   75 cleanup failed after the command itself succeeded (run) · 124 borrow expired during run
 */
import { existsSync, mkdirSync, readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { randomBytes } from "node:crypto";
import { InvalidArgumentError } from "commander";
import { BerthError, isBerthError } from "../core/errors.js";
import { formatDuration, MAX_BORROW_MS, MIN_BORROW_MS, parseDuration } from "../core/durations.js";
import type { Store } from "../store/store.js";
import { Api, ApiError } from "../client/http.js";
import { BerthClient } from "../client/client.js";
import { ConfigError, loadConfig, type ClientConfig, type ConfigFlags } from "../client/config.js";
import { writeFileDurable } from "../io/durable-file.js";
import { debugEnabled, helpPointer } from "./io.js";

export const EXIT = { ok: 0, error: 1, usage: 2, locked: 3, unavailable: 69, cleanup: 75, expired: 124, pipe: 141 } as const;

/** The command was asked for something it cannot be asked (missing target, wrong directory): exit 2, with the help pointer. */
export class UsageError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "UsageError";
  }
}

/** A usage error (ours, or the client's own configuration): exit 2 and a pointer to the command's help. */
export function isUsageError(e: unknown): boolean {
  return e instanceof UsageError || e instanceof ConfigError;
}

export interface StoreFlags {
  stateDir?: string;
  db?: string;
  /** Create the SQLite database when there is none (`berth serve` always may; store commands only with --init). */
  init?: boolean;
}

/** SQLite file under the state dir by default; PostgreSQL when BERTH_PG_URL is set (never a URL in argv: it may hold a password). */
export async function openStoreFromFlags(f: StoreFlags): Promise<Store> {
  // Loaded here, not at the top: client commands never load a database driver.
  const pg = process.env.BERTH_PG_URL;
  if (pg) {
    const { PostgresStore } = await import("../store/postgres/postgres-store.js");
    return PostgresStore.open({ connectionString: pg, schema: process.env.BERTH_PG_SCHEMA || undefined, poolSize: pgPoolSize(process.env.BERTH_PG_POOL_SIZE) });
  }
  const dir = resolve(f.stateDir ?? ".berth");
  const path = f.db ? resolve(f.db) : join(dir, "berth.db");
  // A store command in the wrong directory must not leave a new, empty coordinator behind.
  if (!f.init && !existsSync(path)) {
    throw new UsageError(
      `no coordinator database at ${path}; run this where \`berth serve\` or \`berth up\` keeps its state (--state-dir DIR or --db FILE; PostgreSQL: BERTH_PG_URL), or pass --init to create a new one there`,
    );
  }
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const { SqliteStore } = await import("../store/sqlite/sqlite-store.js");
  return new SqliteStore({ path });
}

/** BERTH_PG_POOL_SIZE: connections per coordinator (default 16); several coordinators on one server share its cores. */
export function pgPoolSize(v: string | undefined): number | undefined {
  if (v === undefined || v === "") return undefined;
  const n = Number(v);
  if (!Number.isInteger(n) || n < 1 || n > 1000) throw new BerthError("invalid_request", `invalid_request: BERTH_PG_POOL_SIZE must be a whole number from 1 to 1000 (got ${JSON.stringify(v)})`);
  return n;
}

/** The coordinator secret: read, or created whole with mode 0600. Several coordinators on one database share one file. */
export function loadOrCreateSecret(path: string): Buffer {
  if (existsSync(path)) {
    const text = readFileSync(path, "utf8").trim();
    const buf = Buffer.from(text, "base64");
    if (buf.length < 32) throw new BerthError("invalid_request", `invalid_request: secret file ${path} is damaged (expected 32+ bytes of base64)`);
    return buf;
  }
  const buf = randomBytes(32);
  writeFileDurable(path, buf.toString("base64") + "\n", 0o600);
  return buf;
}

export function clientFrom(flags: ConfigFlags): { api: Api; config: ClientConfig } {
  const config = loadConfig(flags);
  return { api: new Api(config.url, config.token), config };
}

/** The client library's client, configured as the CLI is (flags, environment, client.json). */
export function berthClientFrom(flags: ConfigFlags): { client: BerthClient; config: ClientConfig } {
  const config = loadConfig(flags);
  return { client: new BerthClient({ url: config.url, token: config.token, keeperKeyFile: config.keeperKeyFile }), config };
}

export function exitCodeOf(e: unknown): number {
  if (isUsageError(e)) return EXIT.usage;
  const code = e instanceof ApiError || isBerthError(e) ? e.code : null;
  if (code === "pool_exhausted" || code === "provider_unavailable" || code === "store_busy" || code === "no_capacity") return EXIT.unavailable;
  if ((e as { code?: string }).code === "ECONNREFUSED") return EXIT.unavailable;
  if ((e as { code?: string }).code === "state_dir_locked") return EXIT.locked;
  return EXIT.error;
}

export function describeError(e: unknown): string {
  if (e instanceof ApiError || isBerthError(e)) return e.message;
  const err = e as NodeJS.ErrnoException;
  if (err.code === "ECONNREFUSED") return `cannot reach the coordinator (${err.message}); is \`berth serve\` or \`berth up\` running?`;
  return err instanceof Error ? err.message : String(e);
}

/** The refusal as berth prints it: one line (with --debug, the stack of an unexpected error too); a usage error adds the help pointer. */
export function reportError(e: unknown): void {
  process.stderr.write(`berth: ${describeError(e)}\n`);
  if (isUsageError(e)) process.stderr.write(helpPointer() + "\n");
  else if (debugEnabled() && e instanceof Error && !(e instanceof ApiError) && !isBerthError(e) && e.stack) process.stderr.write(e.stack + "\n");
}

/** Runs a command body; prints refusals as `berth: <message>` and exits with the documented code. */
export async function runCommand(fn: () => Promise<number | void>): Promise<void> {
  try {
    const code = await fn();
    process.exitCode = code ?? 0;
  } catch (e) {
    reportError(e);
    process.exitCode = exitCodeOf(e);
  }
}

export function printJson(v: unknown): void {
  process.stdout.write(JSON.stringify(v, null, 2) + "\n");
}

/** A plain aligned table for people. */
export function printTable(headers: string[], rows: (string | number | null)[][]): void {
  const cells = [headers, ...rows.map((r) => r.map((c) => (c === null ? "-" : String(c))))];
  const widths = headers.map((_, i) => Math.max(...cells.map((r) => r[i]!.length)));
  for (const r of cells) process.stdout.write(r.map((c, i) => (i === r.length - 1 ? c : c.padEnd(widths[i]!))).join("  ") + "\n");
}

export function iso(ms: number | null | undefined): string {
  return ms === null || ms === undefined ? "-" : new Date(ms).toISOString().replace(/\.\d{3}Z$/, "Z");
}

export function intArg(name: string, min: number, max: number) {
  return (v: string): number => {
    const n = Number(v);
    if (!Number.isInteger(n) || n < min || n > max) throw new InvalidArgumentError(`${name} must be an integer from ${min} to ${max}`);
    return n;
  };
}

export function durationArg(name: string) {
  return (v: string): number => {
    try {
      return parseDuration(v, name);
    } catch (e) {
      throw new InvalidArgumentError((e as Error).message.replace(/^invalid_request: /, ""));
    }
  };
}

/** A borrow's --duration: a duration from 1s to 24h (a usage error naming the limit, before anything is sent). */
export function borrowDurationArg(name = "--duration") {
  const parse = durationArg(name);
  return (v: string): number => {
    const ms = parse(v);
    if (ms > MAX_BORROW_MS) throw new InvalidArgumentError(`${name} ${v}: a borrow lasts at most ${MAX_BORROW_MS / 3_600_000}h`);
    if (ms < MIN_BORROW_MS) throw new InvalidArgumentError(`${name} ${v}: a borrow lasts at least ${formatDuration(MIN_BORROW_MS)}`);
    return ms;
  };
}
