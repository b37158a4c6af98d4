/** Shared test setup: temp dirs, a coordinator on a real SQLite file or PostgreSQL schema, tokens. */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { randomBytes } from "node:crypto";
import pino from "pino";
import { SqliteStore } from "../../src/store/sqlite/sqlite-store.js";
import { PostgresStore } from "../../src/store/postgres/postgres-store.js";
import type { Store } from "../../src/store/store.js";
import { startCoordinator, type Coordinator, type CoordinatorOptions } from "../../src/coordinator/server.js";
import { createToken, type Role } from "../../src/coordinator/auth.js";
import { Api } from "../../src/cli/api.js";

export function tempDir(prefix = "berth-test-"): { path: string; cleanup(): void } {
  const path = mkdtempSync(join(tmpdir(), prefix));
  return { path, cleanup: () => rmSync(path, { recursive: true, force: true }) };
}

export const PG_URL = process.env.BERTH_TEST_PG_URL ?? null;
export const PG_SKIP = PG_URL ? false : "PostgreSQL tests need BERTH_TEST_PG_URL (set by .ci/run, which starts PostgreSQL 15)";

export type Engine = "sqlite" | "postgres";

export async function openStore(engine: Engine, dir: string): Promise<Store> {
  if (engine === "sqlite") return new SqliteStore({ path: join(dir, "berth.db") });
  const schema = "t_" + randomBytes(6).toString("hex");
  return PostgresStore.open({ connectionString: PG_URL!, schema });
}

export async function dropSchema(store: Store): Promise<void> {
  if (store instanceof PostgresStore) {
    const r = await store.pool.query("SELECT current_schema() AS s");
    const s = (r.rows[0] as { s: string }).s;
    if (s.startsWith("t_")) await store.pool.query(`DROP SCHEMA "${s}" CASCADE`);
  }
}

/** A clock tests move by hand. */
export class TestClock {
  constructor(public t = Date.UTC(2026, 10, 29, 12, 0, 0)) {}
  now = (): number => this.t;
  advance(ms: number): number {
    this.t += ms;
    return this.t;
  }
}

export interface TestCoordinator {
  coord: Coordinator;
  store: Store;
  dir: string;
  clock: TestClock | null;
  api(role?: Role, org?: string): Promise<Api>;
  token(role?: Role, org?: string, expiresAt?: number | null): Promise<{ id: string; token: string }>;
  close(): Promise<void>;
}

export async function startTestCoordinator(
  opts: {
    engine?: Engine;
    clock?: TestClock | null;
    config?: CoordinatorOptions["config"];
    reconcile?: boolean;
    /** The reconciler loop's interval when it runs (default 50 ms; a kick runs it at once). */
    reconcileIntervalMs?: number;
    store?: Store;
    dir?: string;
    providers?: CoordinatorOptions["providers"];
    keepStore?: boolean;
    httpLimits?: CoordinatorOptions["httpLimits"];
  } = {},
): Promise<TestCoordinator> {
  const tmp = opts.dir ? null : tempDir();
  const dir = opts.dir ?? tmp!.path;
  const store = opts.store ?? (await openStore(opts.engine ?? "sqlite", dir));
  const clock = opts.clock === undefined ? null : opts.clock;
  const coord = await startCoordinator({
    store,
    secret: randomBytes(32),
    log: pino({ level: process.env.BERTH_TEST_LOG ?? "silent" }),
    now: clock ? clock.now : undefined,
    config: opts.config,
    reconcile: opts.reconcile ?? true,
    reconcileIntervalMs: opts.reconcileIntervalMs ?? 50,
    providers: opts.providers,
    ...(opts.httpLimits ? { httpLimits: opts.httpLimits } : {}),
  });
  const apis: Api[] = [];
  const token = async (role: Role = "admin", org = "acme", expiresAt: number | null = null) =>
    createToken(store, { org, role, expiresAt, label: null }, clock ? clock.now() : Date.now(), (n) => randomBytes(n));
  return {
    coord,
    store,
    dir,
    clock,
    token,
    async api(role: Role = "admin", org = "acme") {
      const t = await token(role, org);
      const a = new Api(coord.url, t.token);
      apis.push(a);
      return a;
    },
    async close() {
      await Promise.all(apis.map((a) => a.close()));
      await coord.stop();
      if (opts.keepStore) return;
      await dropSchema(store);
      if (!opts.store) await store.close();
      tmp?.cleanup();
    },
  };
}
