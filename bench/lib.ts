/**
 * Shared plumbing of the benchmarks: a coordinator either as a real
 * `berth serve` child process (client and server on separate event loops)
 * or in-process, on a fresh SQLite file or a fresh PostgreSQL schema;
 * tokens; a keeper pool of registered external machines; percentiles,
 * a printed table and a JSON result under bench/results/.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir, cpus } from "node:os";
import { join, resolve } from "node:path";
import { randomBytes } from "node:crypto";
import pino from "pino";
import { SqliteStore } from "../src/store/sqlite/sqlite-store.js";
import { PostgresStore } from "../src/store/postgres/postgres-store.js";
import type { Store } from "../src/store/store.js";
import { startCoordinator, type Coordinator } from "../src/coordinator/server.js";
import { createToken, type Role } from "../src/coordinator/auth.js";
import { Api } from "../src/cli/api.js";

export type Engine = "sqlite" | "postgres";
export type Mode = "serve" | "inproc";

export const PG_URL = process.env.BERTH_PG_URL ?? null;
export const BIN = resolve("bin/berth");

/** The --engines list, without PostgreSQL (and saying why) when BERTH_PG_URL is unset. */
export function enginesArg(): Engine[] {
  const engines = arg("engines", "sqlite,postgres").split(",") as Engine[];
  const skip = pgSkipReason();
  if (skip && engines.includes("postgres")) {
    process.stdout.write(`${skip}\n`);
    return engines.filter((e) => e !== "postgres");
  }
  return engines;
}

export function pgSkipReason(): string | null {
  return PG_URL ? null : "PostgreSQL skipped: set BERTH_PG_URL (e.g. postgres://postgres:berth@127.0.0.1:5432/berth_test) to include it";
}

/** A coordinator under test: its URL, a way to mint tokens on its store, and teardown. */
export interface BenchCoordinator {
  url: string;
  engine: Engine;
  mode: Mode;
  dir: string;
  /** The bench's own handle on the same store (tokens, state polls). */
  store: Store;
  /** The coordinator itself when in-process (null for `berth serve`). */
  coord: Coordinator | null;
  token(role?: Role, org?: string): Promise<string>;
  /** CPU time (user + system, ms) the coordinator has used so far: the server process, or this process when in-process. */
  cpuMs(): number;
  close(): Promise<void>;
}

/** CPU time of a process from /proc (Linux), in ms. */
export function processCpuMs(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  // utime and stime are fields 14 and 15 (1-based) of the whole line: 12 and 13 after "pid (comm) ".
  return ((Number(fields[11]) + Number(fields[12])) * 1000) / CLK_TCK;
}
const CLK_TCK = 100;

/** The connection string with `application_name` set: how a bench finds its coordinator's sessions in pg_stat_activity. */
export function withAppName(url: string, name: string): string {
  const u = new URL(url);
  u.searchParams.set("application_name", name);
  return u.toString();
}

async function openBenchStore(engine: Engine, dir: string, schema: string): Promise<Store> {
  if (engine === "sqlite") return new SqliteStore({ path: join(dir, "berth.db") });
  return PostgresStore.open({ connectionString: PG_URL!, schema });
}

/** Starts `berth serve` (of this checkout, or the build whose bin/berth is `bin`) on a free port and waits for its "listening" line. */
export function spawnServe(dir: string, env: NodeJS.ProcessEnv, extra: string[] = [], bin: string = BIN, wrap: string[] = []): Promise<{ child: ChildProcess; url: string }> {
  // BENCH_SERVE_NODE_ARGS (e.g. "--cpu-prof --cpu-prof-dir=/tmp/prof") reaches only the server process.
  const nodeArgs = (process.env.BENCH_SERVE_NODE_ARGS ?? "").split(" ").filter(Boolean);
  // `wrap` (say valgrind and its options) runs node itself, in the same process.
  const argv = [process.execPath, ...nodeArgs, bin, "serve", "--state-dir", dir, "--listen", "127.0.0.1:0", ...extra];
  const child = spawn(wrap[0] ?? argv[0]!, [...wrap.slice(1), ...(wrap.length ? argv : argv.slice(1))], {
    env: { ...process.env, BERTH_LOG_LEVEL: "warn", ...env },
    stdio: ["ignore", "pipe", "inherit"],
  });
  return new Promise((resolveUrl, reject) => {
    let buf = "";
    child.stdout!.on("data", (d: Buffer) => {
      buf += d.toString();
      const m = /listening on (http:\/\/\S+)/.exec(buf);
      if (m) resolveUrl({ child, url: m[1]! });
    });
    child.once("exit", (code) => reject(new Error(`berth serve exited with status ${code} before listening`)));
  });
}

export async function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const gone = new Promise((r) => child.once("exit", r));
  child.kill("SIGTERM");
  const t = setTimeout(() => child.kill("SIGKILL"), 10_000);
  await gone;
  clearTimeout(t);
}

export async function startBenchCoordinator(o: { engine: Engine; mode: Mode; portable?: boolean; reconcileIntervalMs?: number; reconcile?: boolean }): Promise<BenchCoordinator> {
  const dir = mkdtempSync(join(tmpdir(), "berth-bench-"));
  const schema = "bench_" + randomBytes(5).toString("hex");
  let child: ChildProcess | null = null;
  let coord: Coordinator | null = null;
  let url: string;
  let store: Store;
  if (o.mode === "serve") {
    const env: NodeJS.ProcessEnv = o.engine === "postgres" ? { BERTH_PG_URL: PG_URL!, BERTH_PG_SCHEMA: schema } : { BERTH_PG_URL: "" };
    ({ child, url } = await spawnServe(dir, env, o.portable ? ["--portable"] : []));
    store = await openBenchStore(o.engine, dir, schema);
  } else {
    store = await openBenchStore(o.engine, dir, schema);
    coord = await startCoordinator({
      store,
      secret: randomBytes(32),
      log: pino({ level: "warn" }),
      config: { portable: o.portable ?? false },
      reconcileIntervalMs: o.reconcileIntervalMs,
      reconcile: o.reconcile,
    });
    url = coord.url;
  }
  return {
    url,
    engine: o.engine,
    mode: o.mode,
    dir,
    store,
    coord,
    cpuMs() {
      if (child) return processCpuMs(child.pid!);
      const u = process.cpuUsage();
      return (u.user + u.system) / 1000;
    },
    async token(role: Role = "admin", org = "bench") {
      return (await createToken(store, { org, role, expiresAt: null, label: "bench" }, Date.now(), (n) => randomBytes(n))).token;
    },
    async close() {
      if (child) await stopChild(child);
      if (coord) await coord.stop();
      if (store instanceof PostgresStore) await store.pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
      await store.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** A keeper pool on the external provider with `machines` registered, ready machines. */
export async function keeperPool(admin: Api, pool: string, machines: number): Promise<void> {
  const e = await admin.call<{ claims: { token: string }[] }>("POST", `/v1/pools/${pool}/ensure`, {
    minReady: machines,
    maxReady: machines,
    compatibilityKey: "bench",
    provider: "external",
  });
  if (e.claims.length !== machines) throw new Error(`expected ${machines} fill claims, got ${e.claims.length}`);
  await Promise.all(
    e.claims.map((c, i) =>
      admin.call("POST", `/v1/pools/${pool}/machines`, { claimToken: c.token, resourceId: `vm-${i}`, ssh: { host: "10.0.0.1", port: 22, user: "bench" } }),
    ),
  );
}

export function percentile(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return NaN;
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[i]!;
}

export interface Dist {
  n: number;
  p50: number;
  p99: number;
  max: number;
  mean: number;
}

export function dist(values: readonly number[]): Dist {
  const s = [...values].sort((a, b) => a - b);
  const sum = s.reduce((a, b) => a + b, 0);
  return { n: s.length, p50: round(percentile(s, 50)), p99: round(percentile(s, 99)), max: round(s[s.length - 1] ?? NaN), mean: round(sum / (s.length || 1)) };
}

export function round(x: number, digits = 3): number {
  const f = 10 ** digits;
  return Math.round(x * f) / f;
}

export function printTable(title: string, rows: Record<string, string | number>[]): void {
  if (rows.length === 0) return;
  const cols = Object.keys(rows[0]!);
  const width = cols.map((c) => Math.max(c.length, ...rows.map((r) => String(r[c] ?? "").length)));
  const line = (cells: string[]) => cells.map((c, i) => c.padStart(width[i]!)).join("  ");
  process.stdout.write(`\n${title}\n${line(cols)}\n${line(width.map((w) => "-".repeat(w)))}\n`);
  for (const r of rows) process.stdout.write(line(cols.map((c) => String(r[c] ?? ""))) + "\n");
}

/** Writes bench/results/<name>-<timestamp>.json with the machine it ran on. */
export function writeResult(name: string, data: unknown): string {
  const dir = resolve("bench/results");
  mkdirSync(dir, { recursive: true });
  const stamp = new Date().toISOString().replace(/[:.]/g, "-");
  const path = join(dir, `${name}-${stamp}.json`);
  const env = { node: process.version, cpus: cpus().length, cpu: cpus()[0]?.model ?? "unknown", platform: process.platform };
  writeFileSync(path, JSON.stringify({ name, at: new Date().toISOString(), env, ...(data as object) }, null, 2) + "\n");
  return path;
}

/** `--flag value` from argv, else the default. */
export function arg(name: string, dflt: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 && process.argv[i + 1] !== undefined ? process.argv[i + 1]! : dflt;
}

export function ms(start: bigint): number {
  return Number(process.hrtime.bigint() - start) / 1e6;
}
