/**
 * The reconciler visits only due rows: with 10,000 idle ready machines (each
 * with its hard-TTL rotation deadline in the future) and 3 deadlines that are
 * due, one tick visits exactly 3 rows — counted by the tick itself and by the
 * `berth_reconcile_due_rows_total` metric — and leaves the 10,000 untouched.
 */
import { test, describe } from "node:test";
import assert from "node:assert/strict";
import { startTestCoordinator, TestClock, PG_SKIP, type Engine } from "../helpers/env.js";
import { insertMany, machineRow, MACHINE_COLUMNS } from "../helpers/bulk.js";

const IDLE = 10_000;
const HOUR = 3_600_000;

async function visitedMetric(text: string): Promise<number> {
  const line = text.split("\n").find((l) => l.startsWith("berth_reconcile_due_rows_total "));
  return line ? Number(line.split(" ")[1]) : 0;
}

for (const engine of ["sqlite", "postgres"] as Engine[]) {
  describe(`due index on ${engine}`, { skip: engine === "postgres" ? PG_SKIP : false }, () => {
    test(`one tick over ${IDLE} idle machines and 3 due deadlines visits exactly 3 rows`, async () => {
      const clock = new TestClock();
      const t = await startTestCoordinator({ engine, clock, reconcile: false, config: { retentionMs: HOUR } });
      try {
        const api = await t.api("admin");
        await api.call("POST", "/v1/pools/ci/ensure", { minReady: 0, maxReady: 1000, compatibilityKey: "linux-x64" });
        const now = clock.now();
        await t.store.transaction(async (tx) => {
          await tx.run("DELETE FROM due"); // the ensure's own fill re-check; this test places every row itself
          const idle = Array.from({ length: IDLE }, (_, i) => `m_idle_${i}`);
          await insertMany(tx, "machines", MACHINE_COLUMNS, idle.map((id) => machineRow(id, "ready", now)));
          // Rotation deadlines an hour or more away: in the index, not due.
          await insertMany(tx, "due", ["kind", "ref", "due_at"], idle.map((id, i) => ["ttl", id, now + HOUR + i]));
          // Three deadlines that are due: retention of a destroyed machine, of an ended borrow, of an expired claim.
          await insertMany(tx, "machines", MACHINE_COLUMNS, [machineRow("m_gone", "destroyed", now)]);
          await tx.run(
            "INSERT INTO borrows (id, org, pool, machine_id, principal, token_hash, state, generation, created_at, heartbeat_deadline, expires_at, ended_at, reason) VALUES ('b_old', 'acme', 'ci', 'm_idle_0', 'tok_x', 'h1', 'returned', 1, ?, ?, ?, ?, 'returned')",
            [now - 3 * HOUR, now - 2 * HOUR, now - HOUR, now - 2 * HOUR],
          );
          await tx.run("INSERT INTO claims (id, org, pool, token_hash, state, created_at, expires_at, machine_id) VALUES ('c_old', 'acme', 'ci', 'h2', 'expired', ?, ?, NULL)", [now - 3 * HOUR, now - 2 * HOUR]);
          await insertMany(tx, "due", ["kind", "ref", "due_at"], [["retention", "m:m_gone", now - 3], ["retention", "b:b_old", now - 2], ["retention", "c:c_old", now]]);
        });
        const metricBefore = await visitedMetric((await api.raw("GET", "/metrics")).text);

        const r = await t.coord.reconciler.tick();

        assert.equal(r.visited, 3);
        assert.equal((await visitedMetric((await api.raw("GET", "/metrics")).text)) - metricBefore, 3);
        // The three were handled: each record pruned, each due row gone.
        const left = await t.store.transaction(async (tx) => ({
          gone: await tx.get("SELECT id FROM machines WHERE id = 'm_gone'"),
          borrow: await tx.get("SELECT id FROM borrows WHERE id = 'b_old'"),
          claim: await tx.get("SELECT id FROM claims WHERE id = 'c_old'"),
          retention: await tx.get<{ n: number }>("SELECT COUNT(*) AS n FROM due WHERE kind = 'retention'"),
          ttl: await tx.get<{ n: number; first: number }>("SELECT COUNT(*) AS n, MIN(due_at) AS first FROM due WHERE kind = 'ttl'"),
          ready: await tx.get<{ n: number }>("SELECT COUNT(*) AS n FROM machines WHERE state = 'ready'"),
        }));
        assert.deepEqual([left.gone, left.borrow, left.claim, left.retention!.n], [undefined, undefined, undefined, 0]);
        // The idle machines and their deadlines are untouched.
        assert.deepEqual([left.ttl!.n, Number(left.ttl!.first), left.ready!.n], [IDLE, now + HOUR, IDLE]);
        // Nothing else is due: the next tick visits nothing.
        assert.equal((await t.coord.reconciler.tick()).visited, 0);
      } finally {
        await t.close();
      }
    });
  });
}
