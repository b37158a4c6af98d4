/**
 * Three real `berth serve` processes on one PostgreSQL schema, 32 concurrent
 * borrowers spreading their requests round-robin over the three, 2,000
 * borrow/return cycles on a keeper pool of 40 machines registered by an
 * outside keeper. A few borrows are deliberately abandoned, so the
 * coordinators' reconcilers race for their heartbeat due rows while the load
 * runs.
 *
 * Proof, from the durable audit trail (every machine transition appends one
 * row in the same transaction):
 * - per machine, replayed in seq order, every event starts in the state the
 *   previous one ended in, the generation advances by one per reserve, and a
 *   reserve never happens while an earlier borrow of the machine is live: no
 *   machine ever had two live borrows;
 * - every borrow row has exactly one reserve event, and exactly one closing
 *   event (return, or quarantine for an abandoned one);
 * - no due row was processed twice: each abandoned borrow's heartbeat
 *   deadline produced exactly one quarantine in the audit, and the three
 *   coordinators together counted exactly that many missed heartbeats
 *   (`berth_heartbeats_total{outcome="missed"}`, counted only when the
 *   handling transaction commits). A second handling of the same row would
 *   either append a second quarantine (or break the state chain) or raise
 *   that sum.
 */
import { test, describe } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { Api, ApiError } from "../../src/cli/api.js";
import { createToken } from "../../src/coordinator/auth.js";
import { PostgresStore } from "../../src/store/postgres/postgres-store.js";
import { PG_SKIP, tempDir } from "../helpers/env.js";
import { openLocation, startServe, type ServeProcess, type StoreLocation } from "../helpers/serve.js";

const COORDINATORS = 3;
const BORROWERS = 32;
const CYCLES = 2_000;
const MACHINES = 40;
/** Every ABANDON_EVERY-th cycle the borrower walks away without returning. */
const ABANDON_EVERY = 250;
const HEARTBEAT_MS = 2_000;

type Claim = { token: string };
type Borrow = { borrowId: string; borrowToken: string; machine: { id: string } };

interface AuditRow {
  seq: number;
  machine_id: string;
  subject: string | null;
  event: string;
  from_state: string | null;
  to_state: string;
  generation: number;
  actor: string;
}

function metricSum(texts: string[], name: string, labels: string): number {
  let sum = 0;
  for (const text of texts) {
    for (const l of text.split("\n")) if (l.startsWith(`${name}{`) && l.includes(labels)) sum += Number(l.split(" ").pop());
  }
  return sum;
}

describe("three coordinators on one PostgreSQL database", { skip: PG_SKIP }, () => {
  test(`[I1] ${BORROWERS} borrowers, ${CYCLES} borrow/return cycles: never two live borrows of a machine, no due row handled twice`, async () => {
    const dir = tempDir();
    const loc: StoreLocation = { engine: "postgres", dir: dir.path, schema: "t_" + randomBytes(6).toString("hex") };
    const store = (await openLocation(loc)) as PostgresStore;
    const procs: ServeProcess[] = [];
    const apis: Api[] = [];
    try {
      const { token } = await createToken(store, { org: "acme", role: "admin", expiresAt: null, label: null }, Date.now(), (n) => randomBytes(n));
      procs.push(...(await Promise.all(Array.from({ length: COORDINATORS }, () => startServe(loc)))));
      for (const p of procs) apis.push(new Api(p.url, token, { connections: 16 }));

      const e = await apis[0]!.call<{ claims: Claim[] }>("POST", "/v1/pools/ci/ensure", { minReady: MACHINES, maxReady: MACHINES, compatibilityKey: "linux-x64", heartbeatMs: HEARTBEAT_MS });
      assert.equal(e.claims.length, MACHINES);
      await Promise.all(e.claims.map((c, i) => apis[i % COORDINATORS]!.call("POST", "/v1/pools/ci/machines", { claimToken: c.token, resourceId: `vm-${i}`, ssh: { host: "10.0.0.1", port: 22 } })));

      let started = 0;
      let request = 0;
      const next = () => apis[request++ % COORDINATORS]!;
      const outcome = { returned: 0, abandoned: 0, lostBySlowness: 0, exhausted: 0 };
      const borrower = async () => {
        while (started < CYCLES) {
          const n = started++;
          let b: Borrow | null = null;
          while (!b) {
            try {
              b = await next().call<Borrow>("POST", "/v1/pools/ci/borrow", {});
            } catch (err) {
              if (!(err instanceof ApiError && err.code === "pool_exhausted")) throw err;
              outcome.exhausted++;
              await new Promise((r) => setTimeout(r, 5));
            }
          }
          if (n % ABANDON_EVERY === ABANDON_EVERY - 1) {
            outcome.abandoned++;
            continue;
          }
          try {
            await next().call("POST", `/v1/borrows/${b.borrowId}/return`, { token: b.borrowToken });
            outcome.returned++;
          } catch (err) {
            // Only if this machine was so slow that the heartbeat deadline passed: the borrow was abandoned for us.
            if (!(err instanceof ApiError && (err.code === "borrow_expired" || err.code === "borrow_not_active"))) throw err;
            outcome.lostBySlowness++;
          }
        }
      };
      await Promise.all(Array.from({ length: BORROWERS }, borrower));
      assert.equal(outcome.returned + outcome.abandoned + outcome.lostBySlowness, CYCLES);

      // Let the reconcilers find every abandoned borrow (their heartbeat deadlines pass).
      const deadline = Date.now() + 20_000;
      while ((await store.pool.query("SELECT COUNT(*)::int AS n FROM borrows WHERE state = 'active'")).rows[0].n > 0) {
        assert.ok(Date.now() < deadline, "every abandoned borrow is found by a reconciler");
        await new Promise((r) => setTimeout(r, 100));
      }
      const metrics = await Promise.all(apis.map(async (a) => (await a.raw("GET", "/metrics")).text));

      const audit = (await store.pool.query<AuditRow>("SELECT * FROM audit ORDER BY seq")).rows;
      const borrows = (await store.pool.query<{ id: string; machine_id: string; state: string; generation: number }>("SELECT id, machine_id, state, generation FROM borrows")).rows;
      assert.equal(borrows.length, CYCLES);

      // Replay every machine's transitions in commit order.
      const byMachine = new Map<string, AuditRow[]>();
      for (const a of audit) byMachine.set(a.machine_id, [...(byMachine.get(a.machine_id) ?? []), a]);
      assert.equal(byMachine.size, MACHINES);
      const reserves = new Map<string, AuditRow[]>();
      const closes = new Map<string, AuditRow[]>();
      for (const [machineId, events] of byMachine) {
        let state: string | null = null;
        let generation = 0;
        let live: string | null = null;
        for (const ev of events) {
          assert.equal(ev.from_state, state, `${machineId} seq ${ev.seq}: ${ev.event} starts in ${ev.from_state}, but the machine was ${state}`);
          if (ev.event === "reserve") {
            assert.equal(live, null, `${machineId} seq ${ev.seq}: borrow ${ev.subject} reserved while ${live} was live`);
            assert.equal(ev.generation, generation + 1, `${machineId} seq ${ev.seq}: generation advances by one`);
            live = ev.subject;
            reserves.set(ev.subject!, [...(reserves.get(ev.subject!) ?? []), ev]);
          } else {
            assert.equal(ev.generation, generation, `${machineId} seq ${ev.seq}: only a reserve moves the generation`);
            if (ev.subject !== null && ev.subject === live) {
              live = null;
              closes.set(ev.subject, [...(closes.get(ev.subject) ?? []), ev]);
            }
          }
          state = ev.to_state;
          generation = ev.generation;
        }
      }

      let abandonedRows = 0;
      for (const b of borrows) {
        const r = reserves.get(b.id) ?? [];
        assert.equal(r.length, 1, `borrow ${b.id} was reserved once`);
        assert.deepEqual([r[0]!.machine_id, r[0]!.generation], [b.machine_id, b.generation]);
        const c = closes.get(b.id) ?? [];
        assert.equal(c.length, 1, `borrow ${b.id} was closed once`);
        assert.equal(c[0]!.event, b.state === "returned" ? "return" : "quarantine", `borrow ${b.id} (${b.state}) closed by ${c[0]!.event}`);
        if (b.state === "abandoned") abandonedRows++;
      }
      assert.equal(abandonedRows, outcome.abandoned + outcome.lostBySlowness);
      assert.equal(audit.filter((a) => a.event === "quarantine").length, abandonedRows);
      assert.equal(metricSum(metrics, "berth_heartbeats_total", 'outcome="missed"'), abandonedRows, "missed heartbeats handled across all three coordinators");
      // The load really went through all three processes.
      const actors = new Set(audit.filter((a) => a.event === "reserve").map((a) => a.actor));
      assert.equal(actors.size, COORDINATORS);
    } finally {
      await Promise.all(apis.map((a) => a.close()));
      await Promise.all(procs.map((p) => p.kill("SIGTERM")));
      await store.pool.query(`DROP SCHEMA "${loc.schema}" CASCADE`).catch(() => undefined);
      await store.close();
      dir.cleanup();
    }
  });
});
