/**
 * Allocation placement and create throughput.
 *
 * 1. Placement decision time (pure `place`): 1,000 host accounts whose usage
 *    holds 10,000 live allocations, binpack and spread, `--decisions` runs.
 * 2. Creates through the store (`createAllocation`: owner lock, placement
 *    over the org's host accounts, host lock, insert, ledger) against
 *    `--hosts` host accounts, by `--clients` concurrent callers, each its own
 *    owner, on SQLite and PostgreSQL; on PostgreSQL also with `--stores`
 *    separate store instances (connection pools) sharing the schema, as
 *    several coordinators would. In-process: no HTTP.
 *
 *   node dist/bench/alloc-placement.js --decisions 2000 --hosts 1000 --creates 2000 --clients 16 --stores 3
 */
import { randomBytes } from "node:crypto";
import { choose, place, type HostAccount } from "../src/core/allocation-placement.js";
import { DEFAULT_SIZES } from "../src/core/allocation-sizes.js";
import { SqliteStore } from "../src/store/sqlite/sqlite-store.js";
import { PostgresStore } from "../src/store/postgres/postgres-store.js";
import type { Store } from "../src/store/store.js";
import { createToken } from "../src/coordinator/auth.js";
import { createAllocation } from "../src/coordinator/actions/allocation-create.js";
import type { AllocCtx } from "../src/coordinator/actions/allocation-context.js";
import { accountEnrolledHost, setOwnerBudget } from "../src/coordinator/actions/allocation-owners.js";
import { arg, dist, enginesArg, ms, printTable, round, writeResult, type Engine } from "./lib.js";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const decisions = Number(arg("decisions", "2000"));
const hostsN = Number(arg("hosts", "1000"));
const creates = Number(arg("creates", "2000"));
const clients = Number(arg("clients", "16"));
const storesN = Number(arg("stores", "3"));
const small = DEFAULT_SIZES[0]!;

function pureRows(): Record<string, string | number>[] {
  // 10,000 live allocations spread unevenly over 1,000 hosts of 64 vCPU / 128 GiB / 16 slots.
  const hosts: HostAccount[] = [];
  let live = 0;
  for (let i = 0; i < 1000; i++) {
    const n = i % 17 === 0 ? 16 : 10;
    live += n;
    hosts.push({ hostId: `h_${String(i).padStart(4, "0")}`, name: `n${i}`, standing: i % 50 === 0 ? "withdrawn" : "ready", capacity: { vcpu: 64, memoryMib: 131072, diskMib: 1048576, slots: 16 }, used: { vcpu: 2 * n, memoryMib: 4096 * n, diskMib: 20480 * n, slots: n } });
  }
  const rows: Record<string, string | number>[] = [];
  for (const strategy of ["binpack", "spread"] as const) {
    for (const [fn, run] of [["choose", () => choose(hosts, small, strategy)?.hostId], ["place+verdicts", () => place(hosts, small, strategy).chosen?.hostId]] as const) {
      for (let i = 0; i < 200; i++) run(); // warm-up
      const t: number[] = [];
      for (let i = 0; i < decisions; i++) {
        const s = process.hrtime.bigint();
        const chosen = run();
        t.push(ms(s));
        if (!chosen) throw new Error("no host chosen");
      }
      const x = dist(t);
      rows.push({ fn, strategy, hosts: hosts.length, live_allocations: live, decisions, p50_ms: x.p50, p99_ms: x.p99, max_ms: x.max });
    }
  }
  return rows;
}

async function openStores(engine: Engine, n: number): Promise<{ stores: Store[]; close(): Promise<void> }> {
  if (engine === "sqlite") {
    const dir = mkdtempSync(join(tmpdir(), "berth-bench-"));
    const s = new SqliteStore({ path: join(dir, "berth.db") });
    return { stores: [s], close: async () => { await s.close(); rmSync(dir, { recursive: true, force: true }); } };
  }
  const schema = "b_" + randomBytes(6).toString("hex");
  const stores: Store[] = [];
  for (let i = 0; i < n; i++) stores.push(await PostgresStore.open({ connectionString: process.env.BERTH_PG_URL!, schema }));
  return {
    stores,
    close: async () => {
      await (stores[0] as PostgresStore).pool.query(`DROP SCHEMA "${schema}" CASCADE`);
      for (const s of stores) await s.close();
    },
  };
}

async function storeRow(engine: Engine, nStores: number): Promise<Record<string, string | number>> {
  const { stores, close } = await openStores(engine, nStores);
  try {
    const store = stores[0]!;
    const now = Date.now();
    const ctxs: AllocCtx[] = stores.map((s, i) => ({ store: s, now: Date.now, actor: `bench-${i}`, config: { allocationSizes: DEFAULT_SIZES, maxAllocationMs: 86_400_000 } }));
    await store.transaction(async (tx) => {
      for (let i = 0; i < hostsN; i++) await accountEnrolledHost(tx, "bench", { id: `h_${i}`, org: "bench", name: `n${i}`, vcpu: 64, memoryMib: 131072, slots: 64 }, now);
    });
    const owners: string[] = [];
    for (let i = 0; i < clients; i++) {
      const t = await createToken(store, { org: "bench", role: "member", expiresAt: null, label: null }, now, (n) => randomBytes(n));
      await setOwnerBudget(ctxs[0]!, "bench", t.id, { vcpu: 1_000_000, memoryMib: 1_000_000_000, count: 1_000_000 }, false);
      owners.push(t.id);
    }
    let next = 0;
    const lat: number[] = [];
    const start = process.hrtime.bigint();
    await Promise.all(
      owners.map(async (owner, c) => {
        const ctx = ctxs[c % ctxs.length]!;
        for (;;) {
          const i = next++;
          if (i >= creates) return;
          const s = process.hrtime.bigint();
          await createAllocation(ctx, "bench", owner, { id: `a${i}`, size: "small", durationMs: null, strategy: i % 2 ? "spread" : "binpack" });
          lat.push(ms(s));
        }
      }),
    );
    const wall = ms(start) / 1000;
    const x = dist(lat);
    return { engine, stores: stores.length, hosts: hostsN, clients, creates, creates_per_s: round(creates / wall, 1), p50_ms: x.p50, p99_ms: x.p99 };
  } finally {
    await close();
  }
}

const pure = pureRows();
printTable("placement decision (pure, 1,000 hosts, 10,000 live allocations)", pure);
const rows: Record<string, string | number>[] = [];
for (const engine of enginesArg()) {
  rows.push(await storeRow(engine, 1));
  if (engine === "postgres" && storesN > 1) rows.push(await storeRow(engine, storesN));
}
printTable("allocation creates through the store (in-process)", rows);
process.stdout.write(`\nwrote ${writeResult("alloc-placement", { placement: pure, creates: rows })}\n`);
