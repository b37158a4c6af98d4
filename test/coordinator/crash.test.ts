/**
 * Crash atomicity: a real `berth serve` is SIGKILLed while a compound
 * transition is inside its transaction — every write of the transaction made,
 * COMMIT not yet sent (the store's NODE_ENV=test pause hook stops it there).
 * After the kill the store must hold none of it: a dump of every table equals
 * the dump taken just before the request. A restarted coordinator then runs
 * the same request to completion, and the result is coherent (machine,
 * borrow, claims, due rows and audit agree), i.e. all of it.
 *
 * Transitions covered: ensure (pool row + claims + due rows), keeper borrow
 * (machine reserve + generation + borrow row + due rows + audit) and keeper
 * return (borrow end + machine back to ready + due rows + audit).
 */
import { test, describe } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { Api, ApiError } from "../../src/cli/api.js";
import { createToken } from "../../src/coordinator/auth.js";
import type { Store } from "../../src/store/store.js";
import { PG_SKIP, tempDir, type Engine } from "../helpers/env.js";
import { dumpAll, openLocation, startServe, type ServeProcess, type StoreLocation } from "../helpers/serve.js";
import { PostgresStore } from "../../src/store/postgres/postgres-store.js";

type Claim = { id: string; token: string };
type Borrow = { borrowId: string; borrowToken: string; machine: { id: string; generation: number } };

interface Scenario {
  /** The transaction name the pause hook stops in. */
  tx: "ensure" | "borrow" | "return";
  /** Brings the store to the state just before the interrupted request; returns what the request needs. */
  setup(api: Api): Promise<{ borrow?: Borrow }>;
  request(api: Api, s: { borrow?: Borrow }): Promise<unknown>;
}

const ENSURE = { minReady: 2, maxReady: 2, compatibilityKey: "linux-x64", heartbeatMs: 3_600_000 };

async function poolWithMachine(api: Api): Promise<void> {
  const e = await api.call<{ claims: Claim[] }>("POST", "/v1/pools/ci/ensure", { ...ENSURE, minReady: 1, maxReady: 1 });
  await api.call("POST", "/v1/pools/ci/machines", { claimToken: e.claims[0]!.token, resourceId: "vm-1", ssh: { host: "10.0.0.1", port: 22 } });
}

const SCENARIOS: Scenario[] = [
  {
    tx: "ensure",
    setup: async () => ({}),
    request: (api) => api.call("POST", "/v1/pools/ci/ensure", ENSURE),
  },
  {
    tx: "borrow",
    setup: async (api) => {
      await poolWithMachine(api);
      return {};
    },
    request: (api) => api.call("POST", "/v1/pools/ci/borrow", {}),
  },
  {
    tx: "return",
    setup: async (api) => {
      await poolWithMachine(api);
      return { borrow: await api.call<Borrow>("POST", "/v1/pools/ci/borrow", {}) };
    },
    request: (api, s) => api.call("POST", `/v1/borrows/${s.borrow!.borrowId}/return`, { token: s.borrow!.borrowToken }),
  },
];

/** The coordinator's own background work (the pool's fill re-check) is done, so only the request changes the store. */
async function quiet(store: Store): Promise<void> {
  const deadline = Date.now() + 10_000;
  for (;;) {
    const r = await store.transaction((tx) => tx.get<{ n: number }>("SELECT COUNT(*) AS n FROM due WHERE kind = 'fill'"));
    if (r!.n === 0) return;
    if (Date.now() > deadline) throw new Error("the coordinator never finished its fill re-check");
    await new Promise((res) => setTimeout(res, 50));
  }
}

/** Machines, borrows, claims, due rows and the audit trail tell one story. */
async function assertCoherent(store: Store): Promise<void> {
  await store.transaction(async (tx) => {
    const machines = await tx.all<{ id: string; state: string; generation: number; claim_id: string; lent_to: string | null }>("SELECT * FROM machines");
    for (const m of machines) {
      const active = await tx.all<{ id: string; generation: number }>("SELECT id, generation FROM borrows WHERE machine_id = ? AND state = 'active'", [m.id]);
      if (m.state === "busy") {
        assert.equal(active.length, 1, `busy machine ${m.id} has exactly one active borrow`);
        assert.equal(active[0]!.generation, m.generation);
        assert.equal(m.lent_to, active[0]!.id);
        const due = await tx.get("SELECT * FROM due WHERE kind = 'heartbeat' AND ref = ?", [active[0]!.id]);
        assert.ok(due, "an active borrow has its heartbeat deadline in the due index");
      } else {
        assert.equal(active.length, 0, `${m.state} machine ${m.id} has no active borrow`);
      }
      const last = await tx.get<{ to_state: string; generation: number }>("SELECT to_state, generation FROM audit WHERE machine_id = ? ORDER BY seq DESC LIMIT 1", [m.id]);
      assert.deepEqual({ ...last }, { to_state: m.state, generation: m.generation }, `audit of ${m.id} ends where the machine is`);
      const claim = await tx.get<{ state: string; machine_id: string }>("SELECT state, machine_id FROM claims WHERE id = ?", [m.claim_id]);
      assert.deepEqual({ ...claim }, { state: "consumed", machine_id: m.id });
    }
    const ended = await tx.all<{ id: string }>("SELECT id FROM borrows WHERE state <> 'active'");
    for (const b of ended) {
      assert.equal(await tx.get("SELECT * FROM due WHERE kind = 'heartbeat' AND ref = ?", [b.id]), undefined, "an ended borrow has no heartbeat deadline");
      assert.ok(await tx.get("SELECT * FROM due WHERE kind = 'retention' AND ref = ?", [`b:${b.id}`]), "an ended borrow is due for pruning");
    }
    const open = await tx.all<{ id: string }>("SELECT id FROM claims WHERE state = 'open'");
    for (const c of open) assert.ok(await tx.get("SELECT * FROM due WHERE kind = 'claim' AND ref = ?", [c.id]), `open claim ${c.id} has its expiry in the due index`);
  });
}

for (const engine of ["sqlite", "postgres"] as Engine[]) {
  describe(`SIGKILL inside a transaction on ${engine}`, { skip: engine === "postgres" ? PG_SKIP : false }, () => {
    for (const sc of SCENARIOS) {
      test(`[I9] ${sc.tx}: killed before COMMIT leaves none of it; the restarted coordinator does all of it`, async () => {
        const dir = tempDir();
        const loc: StoreLocation = { engine, dir: dir.path, schema: engine === "postgres" ? "t_" + randomBytes(6).toString("hex") : undefined };
        let store: Store | null = await openLocation(loc);
        const { token } = await createToken(store, { org: "acme", role: "admin", expiresAt: null, label: null }, Date.now(), (n) => randomBytes(n));
        const procs: ServeProcess[] = [];
        const apis: Api[] = [];
        try {
          const first = await startServe(loc, { NODE_ENV: "test", BERTH_TEST_PAUSE_IN_TX: sc.tx });
          procs.push(first);
          const api = new Api(first.url, token);
          apis.push(api);
          const state = await sc.setup(api);
          await quiet(store);
          const before = await dumpAll(store);

          const interrupted = sc.request(api, state).then(
            () => "answered",
            (e: unknown) => (e instanceof ApiError ? `refused ${e.code}` : "connection lost"),
          );
          await first.waitFor(new RegExp(`paused in transaction ${sc.tx}\\b`));
          await first.kill("SIGKILL");
          assert.equal(await interrupted, "connection lost", "the client never got an answer");

          // None of it: reopen from scratch (SQLite recovers its WAL) and compare every table.
          await store.close();
          store = await openLocation(loc);
          assert.deepEqual(await dumpAll(store), before);

          // All of it: a restarted coordinator runs the same request to the end.
          const second = await startServe(loc);
          procs.push(second);
          const api2 = new Api(second.url, token);
          apis.push(api2);
          await sc.request(api2, state);
          const after = await dumpAll(store);
          assert.notDeepEqual(after, before);
          if (sc.tx === "ensure") {
            const claims = await store.transaction((tx) => tx.all<{ state: string }>("SELECT state FROM claims"));
            assert.deepEqual(claims.map((c) => c.state), ["open", "open"]);
          } else {
            const m = await store.transaction((tx) => tx.get<{ state: string; generation: number }>("SELECT state, generation FROM machines"));
            assert.deepEqual({ ...m }, sc.tx === "borrow" ? { state: "busy", generation: 1 } : { state: "ready", generation: 1 });
          }
          await assertCoherent(store);
        } finally {
          await Promise.all(apis.map((a) => a.close()));
          for (const p of procs) await p.kill("SIGKILL");
          if (store instanceof PostgresStore) await store.pool.query(`DROP SCHEMA "${loc.schema}" CASCADE`);
          await store?.close();
          dir.cleanup();
        }
      });
    }
  });
}
