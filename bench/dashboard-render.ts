/**
 * Dashboard page render times with 1,000 machines and 100 hosts (the goal:
 * ≤ 50 ms a page). A pool of 1,000 registered machines on the `external`
 * provider (100 of them lent), 100 enrolled hosts, 50 allocations of one
 * admitted owner. For each page: the HTTP answer as a signed-in browser gets
 * it (session check, change mark, reads, render, transfer), the server's own
 * share of it (its `Server-Timing` header), and, in-process, the reads and the
 * HTML rendering apart.
 *
 * Usage: node dist/bench/dashboard-render.js [--rounds 50] [--engines sqlite,postgres]
 *          [--modes inproc,serve] [--machines 1000] [--hosts 100]
 * Prints p50/p99 (ms) per page; writes bench/results/dashboard-render-<timestamp>.json.
 */
import { randomBytes } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pino from "pino";
import { Api } from "../src/cli/api.js";
import { startCoordinator } from "../src/coordinator/server.js";
import { createToken, type Principal } from "../src/coordinator/auth.js";
import { SqliteStore } from "../src/store/sqlite/sqlite-store.js";
import { PostgresStore } from "../src/store/postgres/postgres-store.js";
import type { Store } from "../src/store/store.js";
import type { View } from "../src/coordinator/ui/layout.js";
import { loadOverview, renderOverview } from "../src/coordinator/ui/pages/overview.js";
import { loadPool, renderPool } from "../src/coordinator/ui/pages/pool.js";
import { loadBorrows, renderBorrows } from "../src/coordinator/ui/pages/borrows.js";
import { loadAllocations, renderAllocations } from "../src/coordinator/ui/pages/allocations.js";
import { arg, dist, enginesArg, keeperPool, ms, PG_URL, pgSkipReason, printTable, processCpuMs, round, spawnServe, stopChild, writeResult, type Engine, type Dist } from "./lib.js";

const rounds = Number(arg("rounds", "50"));
const machines = Number(arg("machines", "1000"));
const hostCount = Number(arg("hosts", "100"));
const modes = arg("modes", "inproc,serve").split(",");
const engines = enginesArg();
const PAGES = ["/ui", "/ui/pools/bench", "/ui/borrows", "/ui/allocations"] as const;

interface Row {
  engine: Engine;
  mode: string;
  page: string;
  bytes: number;
  http: Dist;
  /** The server's own time per answer (its Server-Timing header): session, change mark, reads, rendering. */
  server: Dist;
  /** `serve` mode: the server process's CPU time per answer (ms), steadier than wall time on a busy machine. */
  serverCpuMs: number | null;
  load: Dist | null;
  render: Dist | null;
}

async function seed(url: string, token: (role: "admin" | "member" | "agent") => Promise<{ id: string; token: string }>): Promise<() => void> {
  const admin = await token("admin");
  const api = new Api(url, admin.token);
  const agent = new Api(url, (await token("agent")).token);
  const member = await token("member");
  const memberApi = new Api(url, member.token);
  for (let i = 0; i < hostCount; i += 10) {
    await Promise.all(
      Array.from({ length: Math.min(10, hostCount - i) }, (_, k) =>
        agent.call("POST", "/v1/hosts/enroll", {
          name: `host-${String(i + k).padStart(3, "0")}`,
          url: `http://10.1.${i + k}.1:7000`,
          runtime: "gvisor",
          capacity: { vcpu: 32, memoryMb: 65536, slots: 16 },
          ssh: { host: `10.1.${i + k}.1`, port: 2222, hostKey: "ssh-ed25519 AAAA", fingerprint: "SHA256:x" },
        }),
      ),
    );
  }
  await keeperPool(api, "bench", machines);
  for (let i = 0; i < Math.min(100, machines); i++) await memberApi.call("POST", "/v1/pools/bench/borrow", {});
  await api.call("POST", `/v1/owners/${member.id}/admit`, { vcpu: 1000, memoryMib: 1_000_000, count: 100 });
  for (let i = 0; i < 50; i++) await memberApi.call("POST", "/v1/allocations", { id: `al-${i}`, size: "small", durationMs: 3_600_000 });
  return () => {
    void api.close();
    void agent.close();
    void memberApi.close();
  };
}

async function signIn(url: string, token: string): Promise<string> {
  const r = await fetch(`${url}/ui/sign-in`, { method: "POST", body: new URLSearchParams({ token }), redirect: "manual" });
  const set = r.headers.get("set-cookie");
  if (r.status !== 303 || !set) throw new Error(`sign-in failed: ${r.status}`);
  return set.split(";")[0]!;
}

async function timeHttp(url: string, cookie: string, path: string, cpuMs: (() => number) | null): Promise<{ d: Dist; server: Dist; bytes: number; cpu: number | null }> {
  const out: number[] = [];
  const server: number[] = [];
  let cpu0 = 0;
  let bytes = 0;
  for (let i = 0; i < rounds + 5; i++) {
    const t0 = process.hrtime.bigint();
    const r = await fetch(url + path, { headers: { cookie } });
    const text = await r.text();
    if (r.status !== 200) throw new Error(`${path}: ${r.status}`);
    if (i === 4 && cpuMs) cpu0 = cpuMs();
    if (i >= 5) {
      out.push(ms(t0));
      server.push(Number(/dur=([\d.]+)/.exec(r.headers.get("server-timing") ?? "")?.[1] ?? NaN));
    }
    bytes = text.length;
  }
  return { d: dist(out), server: dist(server), bytes, cpu: cpuMs ? round((cpuMs() - cpu0) / rounds, 2) : null };
}

async function timeSplit<T>(load: () => Promise<T>, render: (d: T) => { text: string }): Promise<{ load: Dist; render: Dist }> {
  const l: number[] = [];
  const r: number[] = [];
  for (let i = 0; i < rounds + 5; i++) {
    const t0 = process.hrtime.bigint();
    const d = await load();
    const t1 = process.hrtime.bigint();
    // Encoded to bytes, as the answer is: templates concatenate, and the flattening happens here.
    Buffer.from(render(d).text, "utf8");
    if (i >= 5) {
      l.push(Number(t1 - t0) / 1e6);
      r.push(ms(t1));
    }
  }
  return { load: dist(l), render: dist(r) };
}

async function openStore(engine: Engine, dir: string, schema: string): Promise<Store> {
  return engine === "sqlite" ? new SqliteStore({ path: join(dir, "berth.db") }) : PostgresStore.open({ connectionString: PG_URL!, schema });
}

async function run(engine: Engine, mode: string): Promise<Row[]> {
  const dir = mkdtempSync(join(tmpdir(), "berth-bench-ui-"));
  const schema = "bench_" + randomBytes(5).toString("hex");
  const rows: Row[] = [];
  let child: Awaited<ReturnType<typeof spawnServe>>["child"] | null = null;
  let stopCoord: (() => Promise<void>) | null = null;
  let url: string;
  let store: Store;
  let coordCtx: Awaited<ReturnType<typeof startCoordinator>>["ctx"] | null = null;
  if (mode === "serve") {
    ({ child, url } = await spawnServe(dir, engine === "postgres" ? { BERTH_PG_URL: PG_URL!, BERTH_PG_SCHEMA: schema } : { BERTH_PG_URL: "" }));
    store = await openStore(engine, dir, schema);
  } else {
    store = await openStore(engine, dir, schema);
    const c = await startCoordinator({ store, secret: randomBytes(32), log: pino({ level: "warn" }), reconcile: false });
    url = c.url;
    coordCtx = c.ctx;
    stopCoord = () => c.stop();
  }
  const token = (role: "admin" | "member" | "agent") => createToken(store, { org: "bench", role, expiresAt: null, label: "bench" }, Date.now(), (n) => randomBytes(n));
  try {
    const done = await seed(url, token);
    const admin = await token("admin");
    const cookie = await signIn(url, admin.token);
    const p: Principal = { tokenId: admin.id, org: "bench", role: "admin", expiresAt: null };
    const v: View = { principal: p, csrf: "0".repeat(64), now: Date.now(), here: "/ui" };
    for (const page of PAGES) {
      const h = await timeHttp(url, cookie, page, child ? () => processCpuMs(child!.pid!) : null);
      let split: { load: Dist; render: Dist } | null = null;
      if (coordCtx) {
        const ctx = coordCtx;
        if (page === "/ui") split = await timeSplit(() => loadOverview(store, p), (d) => renderOverview(v, d));
        if (page === "/ui/pools/bench") split = await timeSplit(() => loadPool(store, ctx.metrics, p, "bench", "1h", Date.now()), (d) => renderPool(v, d));
        if (page === "/ui/borrows") split = await timeSplit(() => loadBorrows(store, p), (d) => renderBorrows(v, d));
        if (page === "/ui/allocations") split = await timeSplit(() => loadAllocations(ctx, p, { metrics: ctx.metrics, window: "1h", now: Date.now() }), (d) => renderAllocations(v, d));
      }
      rows.push({ engine, mode, page, bytes: h.bytes, http: h.d, server: h.server, serverCpuMs: h.cpu, load: split?.load ?? null, render: split?.render ?? null });
    }
    done();
  } finally {
    if (child) await stopChild(child);
    if (stopCoord) await stopCoord();
    if (store instanceof PostgresStore) await store.pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    await store.close();
    rmSync(dir, { recursive: true, force: true });
  }
  return rows;
}

const all: Row[] = [];
for (const engine of engines) {
  if (engine === "postgres" && pgSkipReason()) {
    process.stdout.write(`postgres skipped: ${pgSkipReason()}\n`);
    continue;
  }
  for (const mode of modes) all.push(...(await run(engine, mode)));
}
printTable(`dashboard pages, ${machines} machines (100 lent), ${hostCount} hosts, 50 allocations; ${rounds} rounds each (ms)`, all.map((r) => ({
  engine: r.engine,
  mode: r.mode,
  page: r.page,
  kB: Math.round(r.bytes / 1024),
  "server p50": r.server.p50,
  "server p99": r.server.p99,
  "server cpu": r.serverCpuMs ?? "",
  "http p50": r.http.p50,
  "http p99": r.http.p99,
  "load p50": r.load?.p50 ?? "",
  "render p50": r.render?.p50 ?? "",
  "render p99": r.render?.p99 ?? "",
})));
process.stdout.write(`\nwrote ${writeResult("dashboard-render", { rounds, machines, hosts: hostCount, rows: all })}\n`);
