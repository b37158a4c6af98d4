/**
 * Portable vs keeper access, side by side in one run, on a real deployment:
 * `berth serve --portable` (SQLite, then PostgreSQL when BERTH_PG_URL is
 * set) + one real `berth agent` on the process runtime, a keeper pool and a
 * portable pool of the same size on the hosts provider.
 *
 * Each client loops: borrow → active → SSH → `echo ok` → return, for 1, 8
 * and 32 concurrent clients, keeper then portable at each level:
 *   borrow → active       keeper: the borrow reply (active at once);
 *                         portable: borrow (pending) + ack, answered once
 *                         the agent confirmed the per-borrow key install
 *   borrow → first byte   + SSH handshake + first output byte of `echo ok`
 * The portable client's Ed25519 key pair is generated before the clock
 * starts (as `berth borrow` would have it ready). A borrow refused with
 * pool_exhausted (every machine busy or being fenced/scrubbed) is retried
 * after 5 ms; the time from the first attempt counts and misses are reported.
 *
 * --control-only leaves out SSH: each cycle is borrow → active → return, so
 * the figures are the control plane's (coordinator, the agent's install and
 * its fence/scrub of returned machines) without 32 SSH handshakes competing
 * for the same cores.
 *
 * Usage: node dist/bench/portable-vs-keeper.js [--seconds 5] [--clients 1,8,32] [--machines 40] [--engines sqlite,postgres] [--control-only]
 */
import { arg, dist, enginesArg, pgSkipReason, printTable, round, writeResult, type Dist, type Engine } from "./lib.js";
import { ensureHostsPool, firstByte, sleep, sshTo, startCluster, type BenchCluster, type Borrowed } from "./cluster.js";
import { Api, ApiError } from "../src/cli/api.js";
import { generateSshKeyPair } from "../src/core/ssh-keys.js";

type Access = "keeper" | "portable";
const seconds = Number(arg("seconds", "5"));
const levels = arg("clients", "1,8,32").split(",").map(Number);
const machines = Number(arg("machines", "40"));
const engines = enginesArg();
/** --control-only: borrow → active → return, no SSH (the control plane alone: what the coordinator and the agent's install cost). */
const controlOnly = process.argv.includes("--control-only");

interface Row {
  engine: Engine;
  access: Access;
  clients: number;
  cycles: number;
  cyclesPerSec: number;
  toActive: Dist;
  toFirstByte: Dist;
  misses: number;
  errors: number;
}

async function cycle(c: BenchCluster, api: Api, access: Access, pool: string): Promise<{ active: number; first: number; misses: number }> {
  const pair = access === "portable" ? generateSshKeyPair("bench-borrow") : null;
  const t0 = performance.now();
  let misses = 0;
  let b: Borrowed;
  for (;;) {
    try {
      b = await api.call<Borrowed>("POST", `/v1/pools/${pool}/borrow`, pair ? { access, publicKey: pair.publicKey } : {});
      break;
    } catch (e) {
      if (!(e instanceof ApiError) || e.code !== "pool_exhausted") throw e;
      misses++;
      await sleep(5);
    }
  }
  if (pair) {
    const r = await api.call<{ state: string; machine: Borrowed["machine"] }>("POST", `/v1/borrows/${b.borrowId}/ack`, { token: b.borrowToken, grantToken: b.grantToken, publicKey: pair.publicKey });
    if (r.state !== "active") throw new Error(`grant ${b.borrowId} is ${r.state} after ack`);
    b = { ...b, machine: r.machine };
  }
  const active = performance.now() - t0;
  if (controlOnly) {
    await api.call("POST", `/v1/borrows/${b.borrowId}/return`, { token: b.borrowToken, ...(b.grantToken ? { grantToken: b.grantToken } : {}) });
    return { active, first: Number.NaN, misses };
  }
  const client = await sshTo(b, pair ? pair.privateKey : c.keeper.privateKey);
  try {
    const first = (await firstByte(client, "echo ok")) - t0;
    return { active, first, misses };
  } finally {
    client.end();
    await api.call("POST", `/v1/borrows/${b.borrowId}/return`, { token: b.borrowToken, ...(b.grantToken ? { grantToken: b.grantToken } : {}) });
  }
}

async function level(c: BenchCluster, apis: Api[], access: Access, clients: number): Promise<Omit<Row, "engine">> {
  const pool = access === "keeper" ? "k" : "p";
  const toActive: number[] = [];
  const toFirst: number[] = [];
  let misses = 0;
  let errors = 0;
  const t0 = performance.now();
  const end = Date.now() + seconds * 1000;
  await Promise.all(
    apis.slice(0, clients).map(async (api) => {
      while (Date.now() < end) {
        try {
          const r = await cycle(c, api, access, pool);
          toActive.push(r.active);
          if (!Number.isNaN(r.first)) toFirst.push(r.first);
          misses += r.misses;
        } catch (e) {
          errors++;
          if (errors <= 3) process.stderr.write(`${access} cycle failed: ${(e as Error).message}\n`);
          await sleep(50);
        }
      }
    }),
  );
  const elapsed = (performance.now() - t0) / 1000;
  return { access, clients, cycles: toActive.length, cyclesPerSec: round(toActive.length / elapsed, 1), toActive: dist(toActive), toFirstByte: dist(toFirst), misses, errors };
}

const rows: Row[] = [];
for (const engine of engines) {
  const c = await startCluster({ engine, runtime: "process", slots: machines * 2, portable: true });
  try {
    await ensureHostsPool(c, "k", "keeper", machines);
    await ensureHostsPool(c, "p", "portable", machines);
    const apis: Api[] = [];
    for (let i = 0; i < Math.max(...levels); i++) apis.push(new Api(c.coord.url, await c.coord.token("member"), { connections: 1 }));
    for (const clients of levels) {
      for (const access of ["keeper", "portable"] as Access[]) {
        const r = await level(c, apis, access, clients);
        rows.push({ engine, ...r });
        process.stderr.write(`${engine} ${access} ${clients} client(s): ${r.cyclesPerSec} cycles/s, active p50 ${r.toActive.p50} ms\n`);
      }
    }
    await Promise.all(apis.map((a) => a.close()));
  } finally {
    await c.close();
  }
}

printTable(
  "portable vs keeper on the process runtime (ms)",
  rows.map((r) => ({
    engine: r.engine,
    clients: r.clients,
    access: r.access,
    "→active p50": r.toActive.p50,
    "→active p99": r.toActive.p99,
    "→first byte p50": r.toFirstByte.p50,
    "→first byte p99": r.toFirstByte.p99,
    "cycles/s": r.cyclesPerSec,
    cycles: r.cycles,
    misses: r.misses,
    errors: r.errors,
  })),
);
const path = writeResult("portable-vs-keeper", { seconds, machines, controlOnly, skipped: engines.includes("postgres") ? null : pgSkipReason(), rows });
process.stdout.write(`\nwrote ${path}\n`);
