/**
 * The reconciler's tick against fleet size: one coordinator holding 1,000
 * idle ready machines and one holding 100,000 (sizes by `--sizes`), each
 * machine with its hard-TTL rotation deadline an hour or more away (pools of
 * 1,000 machines each, the most a pool holds), and
 * before every tick three deadlines made due (a destroyed machine's
 * retention). Ticks alternate between the coordinators, round by round, so
 * load drifts hit each alike; prints each size's tick time (median, p90) and
 * its ratio to the smallest size (the aim: within 1.5x from 1,000 to
 * 100,000). In-process, reconciler loop off, ticks driven by the bench.
 *
 *   node dist/bench/reconcile-scale.js [--sizes 1000,100000] [--rounds 31] [--engines sqlite,postgres]
 */
import { Api } from "../src/client/http.js";
import { insertMany, machineRow, MACHINE_COLUMNS } from "../test/helpers/bulk.js";
import { arg, dist, enginesArg, ms, printTable, round, startBenchCoordinator, writeResult, type BenchCoordinator, type Engine } from "./lib.js";

const sizes = arg("sizes", "1000,100000").split(",").map(Number);
const rounds = Number(arg("rounds", "31"));
const HOUR = 3_600_000;
const ORG = "bench";
const POOL = "idle"; // pools idle0, idle1, …

interface Fleet {
  size: number;
  c: BenchCoordinator;
  ticks: number[];
  visited: number[];
}

async function fleet(engine: Engine, size: number): Promise<Fleet> {
  const c = await startBenchCoordinator({ engine, mode: "inproc", reconcile: false });
  const admin = new Api(c.url, await c.token("admin", ORG));
  // A pool holds at most 1,000 ready machines: the fleet is spread over ceil(size / 1,000) pools.
  const pools = Math.ceil(size / 1000);
  for (let p = 0; p < pools; p++) {
    await admin.call("POST", `/v1/pools/${POOL}${p}/ensure`, { minReady: 0, maxReady: 1000, compatibilityKey: "bench", provider: "external" });
  }
  await admin.close();
  const now = Date.now();
  const ids = Array.from({ length: size }, (_, i) => `m_idle_${i}`);
  for (let i = 0; i < size; i += 10_000) {
    const part = ids.slice(i, i + 10_000);
    await c.store.transaction(async (tx) => {
      await insertMany(tx, "machines", MACHINE_COLUMNS, part.map((id, j) => machineRow(id, "ready", now, ORG, `${POOL}${Math.floor((i + j) / 1000)}`)));
      await insertMany(tx, "due", ["kind", "ref", "due_at"], part.map((id, j) => ["ttl", id, now + HOUR + i + j]));
    });
  }
  await c.coord!.reconciler.tick(); // the ensure's own fill re-check, and anything else pending
  return { size, c, ticks: [], visited: [] };
}

/** Three retention deadlines due now, as a live coordinator always has a few. */
async function makeDue(f: Fleet, round: number): Promise<void> {
  const now = Date.now();
  const gone = [0, 1, 2].map((k) => `m_gone_${round}_${k}`);
  await f.c.store.transaction(async (tx) => {
    await insertMany(tx, "machines", MACHINE_COLUMNS, gone.map((id) => machineRow(id, "destroyed", now - 3 * HOUR, ORG, `${POOL}0`)));
    await insertMany(tx, "due", ["kind", "ref", "due_at"], gone.map((id) => ["retention", `m:${id}`, now - 1]));
  });
}

async function main(): Promise<void> {
  const out: Record<string, unknown>[] = [];
  for (const engine of enginesArg()) {
    const fleets: Fleet[] = [];
    for (const size of sizes) fleets.push(await fleet(engine, size));
    try {
      for (let r = 0; r < rounds; r++) {
        for (const f of r % 2 === 0 ? fleets : [...fleets].reverse()) {
          await makeDue(f, r);
          const t0 = process.hrtime.bigint();
          const result = await f.c.coord!.reconciler.tick();
          f.ticks.push(ms(t0));
          f.visited.push(result.visited);
        }
      }
    } finally {
      await Promise.all(fleets.map((f) => f.c.close()));
    }
    const base = dist(fleets[0]!.ticks).p50;
    const rows = fleets.map((f) => {
      const d = dist(f.ticks);
      return { engine, idle: f.size, "tick p50 ms": round(d.p50, 2), "tick p99 ms": round(d.p99, 2), "rows visited (median)": dist(f.visited).p50, "× smallest": round(d.p50 / base, 2) };
    });
    printTable(`reconciler tick vs idle fleet size (${engine}, ${rounds} ticks each, alternating)`, rows);
    out.push(...rows);
  }
  console.log("results:", writeResult("reconcile-scale", { sizes, rounds, rows: out }));
}

await main();
