/**
 * Real `berth serve` processes for coordinator tests (crash, several
 * coordinators on one database), and a full dump of every table so a test
 * can say "nothing was written" exactly.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { fileURLToPath } from "node:url";
import { dirname, join, resolve } from "node:path";
import { SqliteStore } from "../../src/store/sqlite/sqlite-store.js";
import { PostgresStore } from "../../src/store/postgres/postgres-store.js";
import type { Store } from "../../src/store/store.js";
import { PG_URL, type Engine } from "./env.js";

/** bin/berth of this checkout (dist/test/helpers -> repo root). */
export const BERTH_BIN = resolve(dirname(fileURLToPath(import.meta.url)), "../../../bin/berth");

export interface ServeProcess {
  child: ChildProcess;
  url: string;
  /** Everything the process wrote to stdout and stderr so far. */
  output(): string;
  /** Resolves once `pattern` appears in the output. */
  waitFor(pattern: RegExp, timeoutMs?: number): Promise<void>;
  kill(signal?: NodeJS.Signals): Promise<void>;
}

/** Where a coordinator keeps its data: a SQLite file, or a PostgreSQL schema. */
export interface StoreLocation {
  engine: Engine;
  dir: string;
  /** PostgreSQL only. */
  schema?: string;
}

export function storeEnv(loc: StoreLocation): Record<string, string> {
  return loc.engine === "postgres" ? { BERTH_PG_URL: PG_URL!, BERTH_PG_SCHEMA: loc.schema! } : {};
}

/** Opens the same store the coordinator processes use. */
export async function openLocation(loc: StoreLocation): Promise<Store> {
  if (loc.engine === "sqlite") return new SqliteStore({ path: join(loc.dir, "berth.db") });
  return PostgresStore.open({ connectionString: PG_URL!, schema: loc.schema! });
}

export async function startServe(loc: StoreLocation, env: Record<string, string> = {}, extraArgs: string[] = []): Promise<ServeProcess> {
  const args = [BERTH_BIN, "serve", "--listen", "127.0.0.1:0", "--state-dir", loc.dir, "--secret-file", join(loc.dir, "coordinator.secret"), ...extraArgs];
  const child = spawn(process.execPath, args, {
    env: { ...process.env, BERTH_PG_URL: "", BERTH_PG_SCHEMA: "", BERTH_LOG_LEVEL: "warn", ...storeEnv(loc), ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  const waiters: Array<() => void> = [];
  const onData = (d: Buffer) => {
    out += d.toString();
    for (const w of [...waiters]) w();
  };
  child.stdout!.on("data", onData);
  child.stderr!.on("data", onData);
  const exited = new Promise<void>((r) => child.once("exit", () => r()));
  const waitFor = (pattern: RegExp, timeoutMs = 20_000) =>
    new Promise<void>((resolveWait, reject) => {
      const check = () => {
        if (pattern.test(out)) {
          cleanup();
          resolveWait();
        }
      };
      const timer = setTimeout(() => {
        cleanup();
        reject(new Error(`timed out waiting for ${pattern} from berth serve:\n${out}`));
      }, timeoutMs);
      const onExit = () => {
        cleanup();
        reject(new Error(`berth serve exited (${child.exitCode ?? child.signalCode}) before ${pattern}:\n${out}`));
      };
      const cleanup = () => {
        clearTimeout(timer);
        const i = waiters.indexOf(check);
        if (i >= 0) waiters.splice(i, 1);
        child.off("exit", onExit);
      };
      waiters.push(check);
      child.once("exit", onExit);
      check();
    });
  const kill = async (signal: NodeJS.Signals = "SIGTERM") => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill(signal);
      const t = setTimeout(() => child.kill("SIGKILL"), 10_000);
      await exited;
      clearTimeout(t);
    }
  };
  try {
    await waitFor(/berth coordinator listening on (http:\/\/\S+)/);
  } catch (e) {
    await kill("SIGKILL");
    throw e;
  }
  const url = /berth coordinator listening on (http:\/\/\S+)/.exec(out)![1]!;
  return { child, url, output: () => out, waitFor, kill };
}

const TABLES = ["api_tokens", "pools", "hosts", "machines", "claims", "borrows", "grants", "due", "operations", "audit", "schema_version", "alloc_owners", "host_accounts", "allocations", "allocation_actors", "allocation_ledger", "ui_sessions"] as const;

/** Every row of every table, in a stable order: equal dumps mean equal stores. */
export async function dumpAll(store: Store): Promise<Record<string, string[]>> {
  const out: Record<string, string[]> = {};
  await store.transaction(async (tx) => {
    for (const t of TABLES) {
      const rows = await tx.all(`SELECT * FROM ${t}`);
      out[t] = rows.map((r) => JSON.stringify(Object.entries(r).sort(([a], [b]) => a.localeCompare(b)))).sort();
    }
  });
  return out;
}
