/**
 * Other builds of berth, side by side with this one: `--compare DIR[,DIR…]`
 * names checkouts that were built (`npm run build`) in their own directory
 * (for an older commit: `git worktree add ../old <commit>`, copy or install
 * node_modules there, `npm run build`). Each build's own `berth serve` runs
 * the coordinator and its own `berth token create` makes the tokens, so
 * nothing of this checkout touches the other build's database; only the load
 * (the bench's HTTP clients) is this checkout's.
 *
 * The machine these run on is shared and its load moves; only builds run in
 * turn in one session, and compared by medians, say anything (docs/performance.md).
 */
import { execFile, spawnSync, type ChildProcess } from "node:child_process";
import { promisify } from "node:util";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, join, resolve } from "node:path";
import { randomBytes } from "node:crypto";
import pg from "pg";
import { arg, BIN, PG_URL, processCpuMs, spawnServe, stopChild, withAppName, type Engine } from "./lib.js";

export interface Build {
  /** Short name in tables: the commit (and "this" for the checkout running the bench). */
  label: string;
  root: string;
  bin: string;
}

function commitOf(root: string): string {
  const r = spawnSync("git", ["-C", root, "rev-parse", "--short", "HEAD"], { encoding: "utf8" });
  const dirty = spawnSync("git", ["-C", root, "status", "--porcelain", "--untracked-files=no"], { encoding: "utf8" }).stdout.trim() !== "";
  return r.status === 0 ? r.stdout.trim() + (dirty ? "+" : "") : basename(root);
}

/** This build first, then every `--compare` directory (each must hold a built checkout). */
export function buildsArg(): Build[] {
  const here = resolve(BIN, "../..");
  const builds: Build[] = [{ label: `${commitOf(here)} (this)`, root: here, bin: BIN }];
  const dirs = arg("compare", "").split(",").filter(Boolean);
  for (const d of dirs) {
    const root = resolve(d);
    const bin = join(root, "bin/berth");
    if (!existsSync(join(root, "dist/src/cli/main.js"))) throw new Error(`--compare ${d}: no built checkout there (run npm run build in it)`);
    builds.push({ label: commitOf(root), root, bin });
  }
  return builds;
}

/** Round `r`'s order: each build in turn first, so no build always runs on a warmer or quieter machine. */
export function rotation<T>(xs: readonly T[], r: number): T[] {
  const k = r % xs.length;
  const order = [...xs.slice(k), ...xs.slice(0, k)];
  return r % 2 === 1 ? order.reverse() : order;
}

export interface BuildServe {
  build: Build;
  engine: Engine;
  url: string;
  child: ChildProcess;
  /** A token minted by the build's own CLI on its own store. */
  token(role: "admin" | "member"): Promise<string>;
  /** CPU time (ms) of the `berth serve` process so far. */
  cpuMs(): number;
  /** CPU time (ms) of the PostgreSQL backends serving this coordinator (PostgreSQL only; 0 on SQLite). */
  pgBackendCpuMs(): Promise<number>;
  close(): Promise<void>;
}

/**
 * Starts `build`'s `berth serve` on a fresh SQLite file or PostgreSQL schema.
 * `pgUrl` (PostgreSQL) may be a proxy in front of BERTH_PG_URL; `wrap` runs
 * the server's node under another program (valgrind).
 */
export async function startBuildServe(build: Build, engine: Engine, o: { pgUrl?: string; wrap?: string[] } = {}): Promise<BuildServe> {
  const dir = mkdtempSync(join(tmpdir(), "berth-bench-"));
  const schema = "bench_" + randomBytes(5).toString("hex");
  const app = `berth_bench_${schema}`;
  const env: NodeJS.ProcessEnv =
    engine === "postgres" ? { BERTH_PG_URL: withAppName(o.pgUrl ?? PG_URL!, app), BERTH_PG_SCHEMA: schema } : { BERTH_PG_URL: "", BERTH_PG_SCHEMA: "" };
  const { child, url } = await spawnServe(dir, env, [], build.bin, o.wrap ?? []);
  const admin = engine === "postgres" ? new pg.Client({ connectionString: PG_URL! }) : null;
  // A session the server ends (another test dropping connections) must not end the bench.
  admin?.on("error", () => undefined);
  await admin?.connect();
  const backends = new Map<number, number>();
  return {
    build,
    engine,
    url,
    child,
    async token(role) {
      // Straight to the database (not through a proxy this process serves), without blocking this event loop.
      const tokenEnv = engine === "postgres" ? { BERTH_PG_URL: PG_URL!, BERTH_PG_SCHEMA: schema } : env;
      const r = await promisify(execFile)(process.execPath, [build.bin, "token", "create", "--org", "bench", "--role", role, "--label", "bench", "--state-dir", dir], {
        env: { ...process.env, BERTH_LOG_LEVEL: "warn", ...tokenEnv },
        encoding: "utf8",
      });
      return r.stdout.trim();
    },
    cpuMs: () => processCpuMs(child.pid!),
    async pgBackendCpuMs() {
      if (!admin) return 0;
      // Backends come and go with the coordinator's pool: every one seen is remembered with its last reading.
      const r = await admin.query<{ pid: number }>("SELECT pid FROM pg_stat_activity WHERE application_name = $1", [app]);
      for (const { pid } of r.rows) backends.set(pid, 0);
      let total = 0;
      for (const pid of backends.keys()) {
        try {
          backends.set(pid, processCpuMs(pid));
        } catch {
          /* exited: keep its last reading */
        }
        total += backends.get(pid)!;
      }
      return total;
    },
    async close() {
      await stopChild(child);
      if (admin) {
        await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
        await admin.end();
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

export function median(xs: readonly number[]): number {
  const s = [...xs].filter((x) => Number.isFinite(x)).sort((a, b) => a - b);
  if (s.length === 0) return Number.NaN;
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
}
