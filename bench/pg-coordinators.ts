/**
 * Keeper borrow/return on PostgreSQL with several `berth serve` processes on
 * one database: does adding coordinators add throughput? Per round, the same
 * fresh schema (64 external machines, one keeper pool) is served by 1 and
 * then by N coordinators (the order alternates between rounds), the clients
 * spread round-robin over them, each client on its own keep-alive
 * connection looping borrow → return. Medians over the rounds.
 *
 * --sample-waits samples pg_stat_activity every 5 ms during each measured
 * window (only the bench's coordinators' sessions, by application_name) and
 * counts, per statement, how often a session was waiting on a lock: where
 * transactions queue behind each other.
 *
 * CPU per cycle is read from /proc for the coordinators, for every
 * PostgreSQL server process and for this process (the clients); their sum
 * against the machine's cores gives the CPU ceiling on cycles/s.
 *
 * Usage: node dist/bench/pg-coordinators.js [--coordinators 1,3] [--clients 32]
 *          [--seconds 5] [--rounds 3] [--machines 64] [--sample-waits] [--pg-pool-size N]
 * Needs BERTH_PG_URL. Writes bench/results/pg-coordinators-<timestamp>.json.
 */
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { cpus, tmpdir } from "node:os";
import { join } from "node:path";
import { randomBytes } from "node:crypto";
import type { ChildProcess } from "node:child_process";
import pg from "pg";
import { Api } from "../src/cli/api.js";
import { PostgresStore } from "../src/store/postgres/postgres-store.js";
import { createToken } from "../src/coordinator/auth.js";
import { arg, dist, keeperPool, ms, PG_URL, pgSkipReason, printTable, processCpuMs, round, spawnServe, stopChild, withAppName, writeResult, type Dist } from "./lib.js";

const levels = arg("coordinators", "1,3").split(",").map(Number);
const clients = Number(arg("clients", "32"));
const seconds = Number(arg("seconds", "5"));
const warmupSeconds = Number(arg("warmup", "1"));
const rounds = Number(arg("rounds", "3"));
const machines = Number(arg("machines", "64"));
/** Connections per coordinator (BERTH_PG_POOL_SIZE); empty: the store's default. */
const poolSize = arg("pg-pool-size", "");

/** CPU time of every PostgreSQL server process on this machine (backends, WAL writer, …), from /proc. */
function postgresCpuMs(): number {
  let total = 0;
  for (const d of readdirSync("/proc")) {
    if (!/^\d+$/.test(d)) continue;
    try {
      if (readFileSync(`/proc/${d}/comm`, "utf8").startsWith("postgres")) total += processCpuMs(Number(d));
    } catch {
      /* exited meanwhile */
    }
  }
  return total;
}
const sampleWaits = process.argv.includes("--sample-waits");

if (!PG_URL) {
  process.stdout.write(`${pgSkipReason()}\n`);
  process.exit(0);
}

interface Run {
  round: number;
  coordinators: number;
  cycles: number;
  cyclesPerSec: number;
  borrow: Dist;
  return: Dist;
  errors: number;
  cpuMsPerCycle: number;
  pgCpuMsPerCycle: number;
  clientCpuMsPerCycle: number;
  /** Lock-wait samples by statement (when --sample-waits). */
  waits: Record<string, number>;
  samples: number;
}

type Borrowed = { borrowId: string; borrowToken: string };

/** Samples lock waits of the sessions named `app` until `stop()`; returns counts per "event: statement". */
function startSampler(app: string): { stop(): Promise<{ waits: Record<string, number>; samples: number }> } {
  const client = new pg.Client({ connectionString: PG_URL! });
  const waits: Record<string, number> = {};
  let samples = 0;
  let running = true;
  const done = (async () => {
    await client.connect();
    while (running) {
      const r = await client.query<{ ev: string; q: string }>(
        "SELECT wait_event_type || '/' || wait_event AS ev, regexp_replace(left(query, 90), '\\s+', ' ', 'g') AS q FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'",
        [app],
      );
      samples++;
      for (const row of r.rows) {
        const k = `${row.ev}: ${row.q}`;
        waits[k] = (waits[k] ?? 0) + 1;
      }
      await new Promise((res) => setTimeout(res, 5));
    }
    await client.end();
  })();
  return {
    async stop() {
      running = false;
      await done;
      return { waits, samples };
    },
  };
}

async function loop(apis: Api[], secs: number, record: boolean): Promise<{ cycles: number; elapsed: number; borrowMs: number[]; returnMs: number[]; errors: number }> {
  const borrowMs: number[] = [];
  const returnMs: number[] = [];
  let errors = 0;
  let cycles = 0;
  const t0 = process.hrtime.bigint();
  const end = Date.now() + secs * 1000;
  await Promise.all(
    apis.map(async (api) => {
      while (Date.now() < end) {
        try {
          const s1 = process.hrtime.bigint();
          const b = await api.call<Borrowed>("POST", "/v1/pools/bench/borrow", {});
          const d1 = ms(s1);
          const s2 = process.hrtime.bigint();
          await api.call("POST", `/v1/borrows/${b.borrowId}/return`, { token: b.borrowToken });
          if (record) {
            borrowMs.push(d1);
            returnMs.push(ms(s2));
          }
          cycles++;
        } catch (e) {
          errors++;
          if (errors <= 3) process.stderr.write(`cycle failed: ${(e as Error).message}\n`);
        }
      }
    }),
  );
  return { cycles, elapsed: ms(t0) / 1000, borrowMs, returnMs, errors };
}

async function measure(roundNo: number, n: number): Promise<Run> {
  const schema = "bench_" + randomBytes(5).toString("hex");
  const app = `berth_bench_${schema}`;
  const store = await PostgresStore.open({ connectionString: PG_URL!, schema });
  const dirs: string[] = [];
  const children: ChildProcess[] = [];
  try {
    for (let i = 0; i < n; i++) {
      const dir = mkdtempSync(join(tmpdir(), "berth-bench-"));
      dirs.push(dir);
      const { child, url } = await spawnServe(dir, { BERTH_PG_URL: withAppName(PG_URL!, app), BERTH_PG_SCHEMA: schema, ...(poolSize ? { BERTH_PG_POOL_SIZE: poolSize } : {}) });
      children.push(Object.assign(child, { benchUrl: url }));
    }
    const urls = children.map((c) => (c as ChildProcess & { benchUrl: string }).benchUrl);
    const token = async (role: "admin" | "member") => (await createToken(store, { org: "bench", role, expiresAt: null, label: "bench" }, Date.now(), (k) => randomBytes(k))).token;
    const admin = new Api(urls[0]!, await token("admin"));
    await keeperPool(admin, "bench", machines);
    await admin.close();
    const apis: Api[] = [];
    for (let i = 0; i < clients; i++) apis.push(new Api(urls[i % n]!, await token("member"), { connections: 1 }));
    const cpu = () => children.reduce((s, c) => s + processCpuMs(c.pid!), 0);
    const self = () => { const u = process.cpuUsage(); return (u.user + u.system) / 1000; };
    await loop(apis, warmupSeconds, false);
    const cpu0 = cpu();
    const pg0 = postgresCpuMs();
    const self0 = self();
    const sampler = sampleWaits ? startSampler(app) : null;
    const r = await loop(apis, seconds, true);
    const sampled = sampler ? await sampler.stop() : { waits: {}, samples: 0 };
    const cpuUsed = cpu() - cpu0;
    const pgUsed = postgresCpuMs() - pg0;
    const selfUsed = self() - self0;
    await Promise.all(apis.map((a) => a.close()));
    return {
      round: roundNo,
      coordinators: n,
      cycles: r.cycles,
      cyclesPerSec: round(r.cycles / r.elapsed, 1),
      borrow: dist(r.borrowMs),
      return: dist(r.returnMs),
      errors: r.errors,
      cpuMsPerCycle: round(cpuUsed / Math.max(1, r.cycles)),
      pgCpuMsPerCycle: round(pgUsed / Math.max(1, r.cycles)),
      clientCpuMsPerCycle: round(selfUsed / Math.max(1, r.cycles)),
      ...sampled,
    };
  } finally {
    for (const c of children) await stopChild(c);
    await store.pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    await store.close();
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
  }
}

const runs: Run[] = [];
for (let r = 0; r < rounds; r++) {
  const order = r % 2 === 0 ? levels : [...levels].reverse();
  for (const n of order) {
    const run = await measure(r, n);
    runs.push(run);
    process.stderr.write(`round ${r + 1}: ${n} coordinator(s), ${clients} clients: ${run.cyclesPerSec} cycles/s, borrow p50 ${run.borrow.p50} ms${sampleWaits ? `, ${Object.values(run.waits).reduce((a, b) => a + b, 0)} lock-wait samples` : ""}\n`);
  }
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
}

const summary = levels.map((n) => {
  const rs = runs.filter((r) => r.coordinators === n);
  const waits: Record<string, number> = {};
  for (const r of rs) for (const [k, v] of Object.entries(r.waits)) waits[k] = (waits[k] ?? 0) + v;
  return {
    coordinators: n,
    cyclesPerSec: median(rs.map((r) => r.cyclesPerSec)),
    borrowP50: median(rs.map((r) => r.borrow.p50)),
    borrowP99: median(rs.map((r) => r.borrow.p99)),
    returnP50: median(rs.map((r) => r.return.p50)),
    returnP99: median(rs.map((r) => r.return.p99)),
    cpuMsPerCycle: median(rs.map((r) => r.cpuMsPerCycle)),
    pgCpuMsPerCycle: median(rs.map((r) => r.pgCpuMsPerCycle)),
    clientCpuMsPerCycle: median(rs.map((r) => r.clientCpuMsPerCycle)),
    errors: rs.reduce((s, r) => s + r.errors, 0),
    lockWaitSamples: Object.values(waits).reduce((a, b) => a + b, 0),
    samples: rs.reduce((s, r) => s + r.samples, 0),
    waits,
  };
});

printTable(
  `keeper borrow/return on PostgreSQL, ${clients} clients, medians of ${rounds} alternating rounds (ms)`,
  summary.map((s) => ({
    coordinators: s.coordinators,
    "cycles/s": s.cyclesPerSec,
    "borrow p50": s.borrowP50,
    "borrow p99": s.borrowP99,
    "return p50": s.returnP50,
    "return p99": s.returnP99,
    "cpu ms/cycle": s.cpuMsPerCycle,
    "postgres cpu ms/cycle": s.pgCpuMsPerCycle,
    "clients cpu ms/cycle": s.clientCpuMsPerCycle,
    // Cycles/s the machine's cores could give if they did nothing but this: the CPU bound.
    "cpu ceiling cycles/s": round((cpus().length * 1000) / Math.max(0.001, s.cpuMsPerCycle + s.pgCpuMsPerCycle + s.clientCpuMsPerCycle), 0),
    errors: s.errors,
    ...(sampleWaits ? { "lock-wait samples": `${s.lockWaitSamples}/${s.samples}` } : {}),
  })),
);
if (sampleWaits) {
  for (const s of summary) {
    process.stdout.write(`\nlock waits, ${s.coordinators} coordinator(s) (samples of sessions waiting, all rounds):\n`);
    const top = Object.entries(s.waits).sort((a, b) => b[1] - a[1]).slice(0, 8);
    if (top.length === 0) process.stdout.write("  none\n");
    for (const [k, v] of top) process.stdout.write(`  ${String(v).padStart(6)}  ${k}\n`);
  }
}
const path = writeResult("pg-coordinators", { clients, seconds, warmupSeconds, rounds, machines, runs, summary });
process.stdout.write(`\nwrote ${path}\n`);
