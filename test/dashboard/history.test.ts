/**
 * The dashboard's history store (coordinator migration 17) on SQLite and
 * PostgreSQL, no browser: borrows served and returned are written per
 * 10-second bucket with the pool's machines by state; a second coordinator
 * instance's rows add up; rows past the 24 h retention are deleted; the pool
 * page's chart JSON shows the buckets at their times, and only to the pool's
 * organisation. (The charts drawn in a browser: dashboard.test.ts.)
 */
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { startTestCoordinator, TestClock, PG_SKIP, type Engine } from "../helpers/env.js";
import { HISTORY_BUCKET_MS, HISTORY_RETENTION_MS, writeHistory } from "../../src/store/history.js";

async function signIn(url: string, token: string): Promise<string> {
  const r = await fetch(`${url}/ui/sign-in`, { method: "POST", body: new URLSearchParams({ token }), redirect: "manual" });
  return r.headers.get("set-cookie")!.split(";")[0]!;
}

interface Series {
  x: number[];
  started: number[];
  returned: number[];
  p95: Array<number | null>;
  ready: Array<number | null>;
  lent: Array<number | null>;
}

async function chartData(url: string, cookie: string): Promise<Series> {
  const html = await (await fetch(url, { headers: { cookie } })).text();
  const m = /<script type="application\/json" data-history="history">([^<]*)<\/script>/.exec(html);
  assert.ok(m, "the page embeds the history's JSON");
  return JSON.parse(m[1]!) as Series;
}

for (const engine of ["sqlite", "postgres"] as Engine[]) {
  describe(`dashboard history on ${engine}`, { skip: engine === "postgres" ? PG_SKIP : false }, () => {
    test("buckets are written with state counts, summed over instances, kept 24 h, and shown at their time to their organisation only", async () => {
      const start = Date.now() - (Date.now() % HISTORY_BUCKET_MS) - 20 * HISTORY_BUCKET_MS;
      const clock = new TestClock(start + 1_000);
      const t = await startTestCoordinator({ engine, clock, reconcile: false });
      try {
        const api = await t.api("admin");
        const e = await api.call<{ claims: Array<{ token: string }> }>("POST", "/v1/pools/h/ensure", { minReady: 3, maxReady: 3, compatibilityKey: "k" });
        for (const [i, c] of e.claims.entries()) await api.call("POST", "/v1/pools/h/machines", { claimToken: c.token, resourceId: `h-${i}`, ssh: { host: "10.0.0.1", port: 22 } });
        const b1 = await api.call<{ borrowId: string; borrowToken: string }>("POST", "/v1/pools/h/borrow", {});
        await api.call("POST", "/v1/pools/h/borrow", {});
        await api.call("POST", `/v1/borrows/${b1.borrowId}/return`, { token: b1.borrowToken });
        // A row past the retention, and another coordinator's row for the same bucket.
        await t.store.transaction((tx) =>
          writeHistory(tx, "c-other", [
            { org: "acme", pool: "h", at: start - HISTORY_RETENTION_MS - HISTORY_BUCKET_MS, started: 9, returned: 9, latency: new Array(11).fill(0), ready: 0, lent: 0, cleanup: 0, quarantined: 0 },
            { org: "acme", pool: "h", at: start, started: 3, returned: 0, latency: [3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], ready: 0, lent: 0, cleanup: 0, quarantined: 0 },
          ], start - HISTORY_RETENTION_MS),
        );
        clock.advance(HISTORY_BUCKET_MS);
        const written = await t.coord.ctx.metrics.history.flush(t.store, t.coord.ctx.actor, clock.now());
        assert.equal(written, 1, "one pool, one closed bucket");
        const rows = await t.store.transaction((tx) => tx.all<{ at: number; instance: string; started: number; returned: number; lent: number }>("SELECT at, instance, started, returned, lent FROM history ORDER BY instance"));
        assert.deepEqual(rows.map((r) => ({ ...r, at: Number(r.at) })), [
          { at: start, instance: t.coord.ctx.actor, started: 2, returned: 1, lent: 1 },
          { at: start, instance: "c-other", started: 3, returned: 0, lent: 0 },
        ]);
        const cookie = await signIn(t.coord.url, (await t.token("member")).token);
        const d = await chartData(`${t.coord.url}/ui/pools/h?window=15m`, cookie);
        const i = d.x.indexOf(start / 1000);
        assert.ok(i >= 0, "the bucket is on the chart's time axis");
        assert.deepEqual([d.started[i], d.returned[i], d.lent[i], d.ready[i]], [5, 1, 1, 2]);
        assert.equal(d.started.reduce((a, n) => a + n, 0), 5, "no borrow anywhere else on the chart");
        assert.equal(typeof d.p95[i], "number");
        // Another organisation's session does not see the pool.
        const other = await signIn(t.coord.url, (await t.token("admin", "globex")).token);
        assert.equal((await fetch(`${t.coord.url}/ui/pools/h`, { headers: { cookie: other } })).status, 404);
      } finally {
        await t.close();
      }
    });
  });
}
