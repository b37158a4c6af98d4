/**
 * Keeper borrow/return cycles over HTTP: 1, 8 and 32 concurrent clients,
 * each on its own keep-alive connection, looping borrow → return against a
 * keeper pool of 64 registered external machines (so no client ever waits
 * for capacity). Runs on SQLite and on PostgreSQL (BERTH_PG_URL), with the
 * coordinator as a real `berth serve` process and, for comparison,
 * in-process (client and server sharing one event loop).
 *
 * Usage: node dist/bench/borrow-return.js [--seconds 5] [--clients 1,8,32]
 *          [--engines sqlite,postgres] [--modes serve,inproc] [--machines 64]
 * Prints borrow and return p50/p99 (ms) and cycles/s; writes
 * bench/results/borrow-return-<timestamp>.json.
 */
import { Api } from "../src/cli/api.js";
import { arg, dist, ms, enginesArg, pgSkipReason, printTable, round, startBenchCoordinator, keeperPool, writeResult, type Engine, type Mode, type Dist } from "./lib.js";

const seconds = Number(arg("seconds", "5"));
const warmupSeconds = Number(arg("warmup", "1"));
const levels = arg("clients", "1,8,32").split(",").map(Number);
const machines = Number(arg("machines", "64"));
const modes = arg("modes", "serve,inproc").split(",") as Mode[];
const engines = enginesArg();

interface Row {
  engine: Engine;
  mode: Mode;
  clients: number;
  cycles: number;
  cyclesPerSec: number;
  borrow: Dist;
  return: Dist;
  errors: number;
  /** Coordinator CPU time per cycle (ms): steadier than latency on a busy machine. */
  serverCpuMsPerCycle: number;
}

type Borrowed = { borrowId: string; borrowToken: string };

/** Runs `clients` loops of borrow → return for `secs`; latencies only from after the warm-up. */
async function level(apis: Api[], clients: number, secs: number, record: boolean, cpuMs: () => number): Promise<Omit<Row, "engine" | "mode" | "clients">> {
  const cpu0 = cpuMs();
  const borrowMs: number[] = [];
  const returnMs: number[] = [];
  let errors = 0;
  let cycles = 0;
  const t0 = process.hrtime.bigint();
  const end = Date.now() + secs * 1000;
  await Promise.all(
    apis.slice(0, clients).map(async (api) => {
      while (Date.now() < end) {
        try {
          const s1 = process.hrtime.bigint();
          const b = await api.call<Borrowed>("POST", "/v1/pools/bench/borrow", {});
          const d1 = ms(s1);
          const s2 = process.hrtime.bigint();
          await api.call("POST", `/v1/borrows/${b.borrowId}/return`, { token: b.borrowToken });
          const d2 = ms(s2);
          if (record) {
            borrowMs.push(d1);
            returnMs.push(d2);
          }
          cycles++;
        } catch (e) {
          errors++;
          if (errors <= 3) process.stderr.write(`cycle failed: ${(e as Error).message}\n`);
        }
      }
    }),
  );
  const elapsed = ms(t0) / 1000;
  const cpu = cpuMs() - cpu0;
  return { cycles, cyclesPerSec: round(cycles / elapsed, 1), borrow: dist(borrowMs), return: dist(returnMs), errors, serverCpuMsPerCycle: round(cpu / Math.max(1, cycles)) };
}

const rows: Row[] = [];
for (const engine of engines) {
  for (const mode of modes) {
    const c = await startBenchCoordinator({ engine, mode });
    try {
      const admin = new Api(c.url, await c.token("admin"));
      await keeperPool(admin, "bench", machines);
      await admin.close();
      const apis: Api[] = [];
      const maxClients = Math.max(...levels);
      for (let i = 0; i < maxClients; i++) apis.push(new Api(c.url, await c.token("member"), { connections: 1 }));
      for (const clients of levels) {
        await level(apis, clients, warmupSeconds, false, () => c.cpuMs());
        const r = await level(apis, clients, seconds, true, () => c.cpuMs());
        rows.push({ engine, mode, clients, ...r });
        process.stderr.write(`${engine} ${mode} ${clients} client(s): ${r.cyclesPerSec} cycles/s\n`);
      }
      await Promise.all(apis.map((a) => a.close()));
    } finally {
      await c.close();
    }
  }
}

printTable(
  "keeper borrow/return over HTTP (latencies in ms)",
  rows.map((r) => ({
    engine: r.engine,
    coordinator: r.mode === "serve" ? "berth serve" : "in-process",
    clients: r.clients,
    "borrow p50": r.borrow.p50,
    "borrow p99": r.borrow.p99,
    "return p50": r.return.p50,
    "return p99": r.return.p99,
    "cycles/s": r.cyclesPerSec,
    "cpu ms/cycle": r.serverCpuMsPerCycle,
    cycles: r.cycles,
    errors: r.errors,
  })),
);
const path = writeResult("borrow-return", { seconds, warmupSeconds, machines, skipped: engines.includes("postgres") ? null : pgSkipReason(), rows });
process.stdout.write(`\nwrote ${path}\n`);
