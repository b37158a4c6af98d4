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
 *        node dist/bench/borrow-return.js --compare DIR[,DIR…] [--rounds 3] [--counts] …
 *
 * --compare runs other builds' `berth serve` (bench/builds.ts) in turn with
 * this one, `--rounds` times (the order rotating), and prints each build's
 * medians and their ratios to this build. --counts adds a pass per build
 * that counts, per cycle at one client, the fsyncs and WAL writes of
 * `berth serve` on SQLite (strace attached to it) and the statements,
 * commits and round trips it sends to PostgreSQL (a counting proxy between
 * them, test/helpers/pg-wire.ts). --instructions adds a pass per build that
 * runs its `berth serve` under valgrind's callgrind (--separate-threads) and
 * counts the instructions the server executes per cycle at each client
 * level, on its main thread (the event loop; the idle server's reconciler
 * ticks for the same time taken out) and on all its threads: user space
 * only, and a figure the machine's load does not move.
 *
 * Prints borrow and return p50/p99 (ms), cycles/s and the coordinator's CPU
 * per cycle (and on PostgreSQL its backends' CPU per cycle); writes
 * bench/results/borrow-return-<timestamp>.json.
 */
import { execFile, spawn } from "node:child_process";
import { promisify } from "node:util";
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Api } from "../src/cli/api.js";
import { arg, dist, ms, enginesArg, pgSkipReason, printTable, round, startBenchCoordinator, keeperPool, writeResult, PG_URL, type Engine, type Mode, type Dist } from "./lib.js";
import { buildsArg, median, rotation, startBuildServe, type Build, type BuildServe } from "./builds.js";
import { startPgWireProxy } from "../test/helpers/pg-wire.js";

const seconds = Number(arg("seconds", "5"));
const warmupSeconds = Number(arg("warmup", "1"));
const levels = arg("clients", "1,8,32").split(",").map(Number);
const machines = Number(arg("machines", "64"));
const modes = arg("modes", "serve,inproc").split(",") as Mode[];
const engines = enginesArg();
const comparing = arg("compare", "") !== "";
const rounds = Number(arg("rounds", comparing ? "3" : "1"));
const counting = process.argv.includes("--counts");
const instructions = process.argv.includes("--instructions");
const instructionCycles = Number(arg("instruction-cycles", "400"));

interface Row {
  engine: Engine;
  mode: Mode;
  build: string;
  round: number;
  clients: number;
  cycles: number;
  cyclesPerSec: number;
  borrow: Dist;
  return: Dist;
  errors: number;
  /** Coordinator CPU time per cycle (ms): steadier than latency on a busy machine. */
  serverCpuMsPerCycle: number;
  /** CPU of the PostgreSQL backends serving the coordinator, per cycle (ms); null on SQLite or in-process. */
  pgCpuMsPerCycle: number | null;
}

type Borrowed = { borrowId: string; borrowToken: string };

/** Runs `clients` loops of borrow → return for `secs`; latencies only from after the warm-up. */
async function level(
  apis: Api[],
  clients: number,
  secs: number,
  record: boolean,
  cpuMs: () => number,
  pgCpuMs: () => Promise<number>,
): Promise<Pick<Row, "cycles" | "cyclesPerSec" | "borrow" | "return" | "errors" | "serverCpuMsPerCycle" | "pgCpuMsPerCycle">> {
  const cpu0 = cpuMs();
  const pg0 = await pgCpuMs();
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
  const pgCpu = (await pgCpuMs()) - pg0;
  const per = (x: number) => round(x / Math.max(1, cycles));
  return { cycles, cyclesPerSec: round(cycles / elapsed, 1), borrow: dist(borrowMs), return: dist(returnMs), errors, serverCpuMsPerCycle: per(cpu), pgCpuMsPerCycle: per(pgCpu) };
}

/** One build's coordinator through every client level. */
async function runServe(s: BuildServe, roundNo: number): Promise<Row[]> {
  const admin = new Api(s.url, await s.token("admin"));
  await keeperPool(admin, "bench", machines);
  await admin.close();
  const member = await s.token("member");
  const apis: Api[] = [];
  for (let i = 0; i < Math.max(...levels); i++) apis.push(new Api(s.url, member, { connections: 1 }));
  const rows: Row[] = [];
  try {
    for (const clients of levels) {
      await level(apis, clients, warmupSeconds, false, s.cpuMs, s.pgBackendCpuMs);
      const r = await level(apis, clients, seconds, true, s.cpuMs, s.pgBackendCpuMs);
      rows.push({ engine: s.engine, mode: "serve", build: s.build.label, round: roundNo, clients, ...r, pgCpuMsPerCycle: s.engine === "postgres" ? r.pgCpuMsPerCycle : null });
      process.stderr.write(`round ${roundNo + 1} ${s.build.label} ${s.engine} ${clients} client(s): ${r.cyclesPerSec} cycles/s, borrow p50 ${r.borrow.p50} ms, cpu ${r.serverCpuMsPerCycle} ms/cycle\n`);
    }
  } finally {
    await Promise.all(apis.map((a) => a.close()));
  }
  return rows;
}

interface Counts {
  build: string;
  engine: Engine;
  cycles: number;
  perCycle: Record<string, number>;
}

/** strace attached to a running process, counting the given syscalls until stopped. */
function straceCount(pid: number, syscalls: string[]): { stop(): Promise<Record<string, number>> } {
  const child = spawn("strace", ["-f", "-c", "-U", "calls,name", "-e", `trace=${syscalls.join(",")}`, "-p", String(pid)], { stdio: ["ignore", "ignore", "pipe"] });
  let err = "";
  child.stderr.on("data", (d: Buffer) => (err += d.toString()));
  return {
    async stop() {
      const done = new Promise((r) => child.once("exit", r));
      child.kill("SIGINT");
      await done;
      const out: Record<string, number> = Object.fromEntries(syscalls.map((s) => [s, 0]));
      for (const line of err.split("\n")) {
        const m = /^\s*(\d+)\s+(\w+)\s*$/.exec(line);
        if (m && m[2]! in out) out[m[2]!] = Number(m[1]);
      }
      return out;
    },
  };
}

/** Per cycle at one client: fsyncs and WAL writes (SQLite) or what goes over the wire (PostgreSQL). */
async function countPass(build: Build, engine: Engine, cycles: number): Promise<Counts> {
  const proxy = engine === "postgres" ? await startPgWireProxy(PG_URL!) : null;
  const s = await startBuildServe(build, engine, proxy ? { pgUrl: proxy.url } : {});
  try {
    const admin = new Api(s.url, await s.token("admin"));
    await keeperPool(admin, "bench", 8);
    await admin.close();
    const api = new Api(s.url, await s.token("member"), { connections: 1 });
    const cycle = async () => {
      const b = await api.call<Borrowed>("POST", "/v1/pools/bench/borrow", {});
      await api.call("POST", `/v1/borrows/${b.borrowId}/return`, { token: b.borrowToken });
    };
    for (let i = 0; i < 20; i++) await cycle();
    const trace = proxy ? null : straceCount(s.child.pid!, ["fsync", "fdatasync", "pwrite64", "write"]);
    if (trace) await new Promise((r) => setTimeout(r, 500)); // strace attaches
    proxy?.reset();
    for (let i = 0; i < cycles; i++) await cycle();
    await api.close();
    const per: Record<string, number> = {};
    if (trace) for (const [k, v] of Object.entries(await trace.stop())) per[k] = round(v / cycles, 2);
    if (proxy) {
      const c = proxy.counts();
      Object.assign(per, { statements: round(c.statements / cycles, 2), commits: round(c.commits / cycles, 2), rollbacks: round(c.rollbacks / cycles, 2), "round trips": round(c.roundTrips / cycles, 2) });
    }
    return { build: build.label, engine, cycles, perCycle: per };
  } finally {
    await s.close();
    await proxy?.close();
  }
}

interface Instructions {
  build: string;
  engine: Engine;
  clients: number;
  cycles: number;
  /** Instructions per cycle on the main thread (the event loop: HTTP, auth, validation, store, reply), its idle ticks for the same time taken out. */
  mainPerCycle: number;
  /** Every thread's (V8's compiler and GC threads, libuv's pool), raw. */
  allPerCycle: number;
  /** The idle server's main thread (reconciler ticks), per second. */
  mainIdlePerSecond: number;
}

/** The instructions callgrind counted since the last dump (or zeroing) of `pid`: main thread and all threads, from a fresh dump. */
async function callgrindDump(dir: string, pid: number): Promise<{ main: number; all: number }> {
  const before = new Set(readdirSync(dir));
  await promisify(execFile)("callgrind_control", ["-d", String(pid)]);
  for (let i = 0; i < 600; i++) {
    // With --separate-threads=yes each dump is one file per thread: cg.<pid>.<n>-<thread>.
    const fresh = readdirSync(dir).filter((f) => !before.has(f) && f.startsWith(`cg.${pid}.`));
    const totals = fresh.map((f) => ({ f, m: /^(?:totals|summary):\s*(\d+)/m.exec(readFileSync(join(dir, f), "utf8")) }));
    if (fresh.length > 0 && totals.every((t) => t.m)) {
      // Give callgrind a moment to write every thread's file of this dump, then read them all.
      await new Promise((r) => setTimeout(r, 300));
      const all = readdirSync(dir).filter((f) => !before.has(f) && f.startsWith(`cg.${pid}.`));
      let main = 0;
      let sum = 0;
      for (const f of all) {
        const n = Number(/^(?:totals|summary):\s*(\d+)/m.exec(readFileSync(join(dir, f), "utf8"))?.[1] ?? 0);
        sum += n;
        if (f.endsWith("-01")) main += n;
      }
      return { main, all: sum };
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error("callgrind wrote no dump");
}

/** Instructions per cycle of `berth serve` under callgrind, at each client level. */
async function instructionPass(build: Build, engine: Engine): Promise<Instructions[]> {
  const dir = mkdtempSync(join(tmpdir(), "berth-callgrind-"));
  const s = await startBuildServe(build, engine, { wrap: ["valgrind", "-q", "--tool=callgrind", "--separate-threads=yes", `--callgrind-out-file=${join(dir, "cg.%p")}`] });
  const out: Instructions[] = [];
  try {
    const admin = new Api(s.url, await s.token("admin"));
    await keeperPool(admin, "bench", machines);
    await admin.close();
    const member = await s.token("member");
    const apis: Api[] = [];
    for (let i = 0; i < Math.max(...levels); i++) apis.push(new Api(s.url, member, { connections: 1 }));
    const cycles = async (clients: number, n: number) => {
      let left = n;
      await Promise.all(
        apis.slice(0, clients).map(async (api) => {
          while (left > 0) {
            left--;
            const b = await api.call<Borrowed>("POST", "/v1/pools/bench/borrow", {});
            await api.call("POST", `/v1/borrows/${b.borrowId}/return`, { token: b.borrowToken });
          }
        }),
      );
    };
    const pid = s.child.pid!;
    try {
      for (const clients of levels) await cycles(clients, Math.max(50, instructionCycles / 2)); // JIT warm at every level
      await callgrindDump(dir, pid);
      let t = Date.now();
      await new Promise((r) => setTimeout(r, 3000));
      const mainIdlePerSecond = (await callgrindDump(dir, pid)).main / ((Date.now() - t) / 1000);
      for (const clients of levels) {
        await callgrindDump(dir, pid);
        t = Date.now();
        await cycles(clients, instructionCycles);
        const total = await callgrindDump(dir, pid);
        const mainPerCycle = Math.round((total.main - mainIdlePerSecond * ((Date.now() - t) / 1000)) / instructionCycles);
        const allPerCycle = Math.round(total.all / instructionCycles);
        out.push({ build: build.label, engine, clients, cycles: instructionCycles, mainPerCycle, allPerCycle, mainIdlePerSecond: Math.round(mainIdlePerSecond) });
        process.stderr.write(`instructions ${build.label} ${engine} ${clients} client(s): main thread ${mainPerCycle}, all threads ${allPerCycle} per cycle\n`);
      }
    } finally {
      await Promise.all(apis.map((a) => a.close()));
    }
  } finally {
    await s.close();
    // BENCH_CALLGRIND_KEEP: leave the dumps (one per thread per dump) for callgrind_annotate.
    if (process.env.BENCH_CALLGRIND_KEEP) process.stderr.write(`callgrind dumps of ${build.label} kept in ${dir}\n`);
    else rmSync(dir, { recursive: true, force: true });
  }
  return out;
}

const rows: Row[] = [];
const counts: Counts[] = [];
const instructionRows: Instructions[] = [];
if (comparing) {
  const builds = buildsArg();
  for (const engine of engines) {
    for (let r = 0; r < rounds; r++) {
      for (const build of rotation(builds, r)) {
        const s = await startBuildServe(build, engine);
        try {
          rows.push(...(await runServe(s, r)));
        } finally {
          await s.close();
        }
      }
    }
    if (counting) for (const build of builds) counts.push(await countPass(build, engine, 100));
    if (instructions) for (const build of builds) instructionRows.push(...(await instructionPass(build, engine)));
  }
  const summary: Array<Record<string, string | number>> = [];
  const self = builds[0]!.label;
  const med = (e: Engine, b: string, c: number, f: (r: Row) => number | null) => median(rows.filter((r) => r.engine === e && r.build === b && r.clients === c).map((r) => f(r) ?? Number.NaN));
  for (const engine of engines) {
    for (const clients of levels) {
      const base = { cps: med(engine, self, clients, (r) => r.cyclesPerSec), b50: med(engine, self, clients, (r) => r.borrow.p50), cpu: med(engine, self, clients, (r) => r.serverCpuMsPerCycle), pg: med(engine, self, clients, (r) => r.pgCpuMsPerCycle) };
      for (const b of builds) {
        const m = { cps: med(engine, b.label, clients, (r) => r.cyclesPerSec), b50: med(engine, b.label, clients, (r) => r.borrow.p50), r50: med(engine, b.label, clients, (r) => r.return.p50), cpu: med(engine, b.label, clients, (r) => r.serverCpuMsPerCycle), pg: med(engine, b.label, clients, (r) => r.pgCpuMsPerCycle) };
        summary.push({
          engine,
          clients,
          build: b.label,
          "cycles/s": round(m.cps, 1),
          "borrow p50": round(m.b50),
          "return p50": round(m.r50),
          "cpu ms/cycle": round(m.cpu),
          ...(engine === "postgres" ? { "pg cpu ms/cycle": round(m.pg) } : {}),
          "cycles/s ÷ this": round(m.cps / base.cps, 2),
          "borrow p50 ÷ this": round(m.b50 / base.b50, 2),
          "cpu ÷ this": round(m.cpu / base.cpu, 2),
          ...(engine === "postgres" ? { "pg cpu ÷ this": round(m.pg / base.pg, 2) } : {}),
        });
      }
    }
  }
  for (const engine of rounds > 0 ? engines : []) {
    printTable(`${engine}: medians of ${rounds} alternating rounds of ${seconds} s, berth serve, latencies in ms`, summary.filter((s) => s.engine === engine));
  }
  for (const engine of engines) {
    const cs = counts.filter((c) => c.engine === engine);
    if (cs.length) printTable(`${engine}: per keeper borrow + return at one client (${cs[0]!.cycles} cycles)`, cs.map((c) => ({ build: c.build, ...c.perCycle })));
    const is = instructionRows.filter((c) => c.engine === engine);
    const base = (clients: number) => is.find((c) => c.clients === clients && c.build === builds[0]!.label);
    if (is.length) {
      printTable(
        `${engine}: instructions of berth serve per keeper borrow + return (callgrind, ${is[0]!.cycles} cycles per level)`,
        is.map((c) => ({
          build: c.build,
          clients: c.clients,
          "main thread/cycle": c.mainPerCycle,
          "main ÷ this": round(c.mainPerCycle / (base(c.clients)?.mainPerCycle ?? Number.NaN), 3),
          "all threads/cycle": c.allPerCycle,
          "all ÷ this": round(c.allPerCycle / (base(c.clients)?.allPerCycle ?? Number.NaN), 3),
          "main idle/s": c.mainIdlePerSecond,
        })),
      );
    }
  }
} else {
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
          await level(apis, clients, warmupSeconds, false, () => c.cpuMs(), async () => 0);
          const r = await level(apis, clients, seconds, true, () => c.cpuMs(), async () => 0);
          rows.push({ engine, mode, build: "this", round: 0, clients, ...r, pgCpuMsPerCycle: null });
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
}
const path = writeResult("borrow-return", { seconds, warmupSeconds, machines, rounds, skipped: engines.includes("postgres") ? null : pgSkipReason(), rows, counts, instructions: instructionRows });
process.stdout.write(`\nwrote ${path}\n`);
