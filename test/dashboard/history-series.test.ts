/**
 * The dashboard's labelled history series (coordinator migration 18) on
 * SQLite and PostgreSQL, no browser, made by real events: provisions given up
 * (EC2 emulator refusing RunInstances, so the pool's breaker opens), a keeper
 * borrow abandoned (its machine quarantined by the reconciler), allocations
 * placed on an enrolled host. The coordinator writes them with its buckets;
 * another instance's counts add up, its use figures do not; the pool page
 * and the Allocations page embed them at their bucket's time, and the
 * figures are in the page's text. (Drawn in a browser: dashboard.test.ts.)
 */
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { startTestCoordinator, PG_SKIP, type Engine } from "../helpers/env.js";
import { awsWorld } from "../helpers/aws.js";
import { until } from "../helpers/portable-e2e.js";
import { HISTORY_BUCKET_MS } from "../../src/store/history.js";
import { writeSeries } from "../../src/store/history-series.js";

async function signIn(url: string, token: string): Promise<string> {
  const r = await fetch(`${url}/ui/sign-in`, { method: "POST", body: new URLSearchParams({ token }), redirect: "manual" });
  return r.headers.get("set-cookie")!.split(";")[0]!;
}

interface Charts {
  x: number[];
  charts: Array<{ id: string; y: string; series: Array<[string, number[]]> }>;
}

async function page(url: string, cookie: string, key: string): Promise<{ html: string; d: Charts }> {
  const r = await fetch(url, { headers: { cookie } });
  assert.equal(r.status, 200);
  const html = await r.text();
  const m = new RegExp(`<script type="application/json" data-series="${key}">([^<]*)</script>`).exec(html);
  assert.ok(m, `the page embeds the ${key} series' JSON`);
  return { html, d: JSON.parse(m[1]!) as Charts };
}

/** A chart's column of one label, as {x: value} where not 0. */
function column(d: Charts, id: string, label: string): Record<number, number> {
  const c = d.charts.find((c) => c.id === id);
  assert.ok(c, `chart ${id} is in the JSON`);
  const s = c.series.find(([l]) => l === label);
  assert.ok(s, `chart ${id} has a line for ${label}: ${JSON.stringify(c.series.map(([l]) => l))}`);
  const out: Record<number, number> = {};
  s[1].forEach((v, i) => {
    if (v !== 0) out[d.x[i]!] = v;
  });
  return out;
}

const bucketOf = (ms: number) => (ms - (ms % HISTORY_BUCKET_MS)) / 1000;

for (const engine of ["sqlite", "postgres"] as Engine[]) {
  describe(`dashboard history series on ${engine}`, { skip: engine === "postgres" ? PG_SKIP : false }, () => {
    test("provisions given up, quarantines by reason and allocation use per host and owner are kept per bucket and shown", { timeout: 120_000 }, async () => {
      const w = await awsWorld({ stepBudgetMs: 400, pollMs: 50 });
      const t = await startTestCoordinator({ engine, providers: [w.provider], config: { portable: true, opRetryUnitMs: 10, provisionBreakerThreshold: 2, provisionBreakerBackoffMs: 3_600_000 } });
      try {
        const admin = await t.api("admin");
        const adminTok = await t.token("admin");
        // Two provisions refused by EC2: each given up, and the pool's breaker opens on the second.
        w.emu.faults.runRefusals.push("InsufficientInstanceCapacity", "InsufficientInstanceCapacity");
        const provisionAt = Date.now();
        await admin.call("POST", "/v1/pools/cloud/ensure", { minReady: 1, maxReady: 1, compatibilityKey: "aws-linux", access: "portable", provider: "aws", heartbeatMs: 30_000 });
        await until("the breaker open", async () => ((await admin.call<{ provisionBreaker: { openUntil: number | null } | null }>("GET", "/v1/pools/cloud")).provisionBreaker?.openUntil ?? 0) > Date.now(), 60_000);

        // A keeper borrow whose heartbeat is missed: the machine is quarantined ("abandoned").
        const e = await admin.call<{ claims: Array<{ token: string }> }>("POST", "/v1/pools/k/ensure", { minReady: 1, maxReady: 1, compatibilityKey: "k", heartbeatMs: 1_000 });
        await admin.call("POST", "/v1/pools/k/machines", { claimToken: e.claims[0]!.token, resourceId: "k-0", ssh: { host: "10.0.0.1", port: 22 } });
        await admin.call("POST", "/v1/pools/k/borrow", {});
        await until("the machine quarantined", async () => (await t.store.transaction((tx) => tx.get<{ n: number }>("SELECT COUNT(*) AS n FROM machines WHERE pool = 'k' AND state = 'quarantined'")))?.n == 1, 30_000);
        const quarantinedAt = Date.now();

        // Two allocations of one owner on an enrolled host (placed; the host's agent is not reached).
        const agent = await t.token("agent");
        const owner = await t.token("member");
        await fetch(`${t.coord.url}/v1/hosts/enroll`, {
          method: "POST",
          headers: { authorization: `Bearer ${agent.token}`, "content-type": "application/json" },
          body: JSON.stringify({ name: "host-a", url: "http://127.0.0.1:1", runtime: "process", capacity: { vcpu: 8, memoryMb: 16384, slots: 4 }, ssh: { host: "127.0.0.1", port: 2222, hostKey: "ssh-ed25519 AAAA", fingerprint: "SHA256:x" } }),
        }).then((r) => assert.equal(r.status, 200));
        await admin.call("POST", `/v1/owners/${owner.id}/admit`, { vcpu: 8, memoryMib: 8192, count: 3 });
        for (const id of ["a1", "a2"]) {
          const r = await fetch(`${t.coord.url}/v1/allocations`, { method: "POST", headers: { authorization: `Bearer ${owner.token}`, "content-type": "application/json" }, body: JSON.stringify({ id, size: "small", durationMs: 3_600_000 }) });
          assert.equal(r.status, 201, await r.text());
        }

        // Written with the buckets (what the 10-second timer does; a stop writes the open bucket too).
        await t.coord.ctx.metrics.history.flush(t.store, t.coord.ctx.actor, Date.now(), true);
        const rows = await t.store.transaction((tx) => tx.all<{ scope: string; series: string; label: string; value: number }>("SELECT scope, series, label, value FROM history_series WHERE instance = ? ORDER BY scope, series, label, at", [t.coord.ctx.actor]));
        const sum = (scope: string, series: string, label: string) => rows.filter((r) => r.scope === scope && r.series === series && r.label === label).reduce((a, r) => a + Number(r.value), 0);
        assert.equal(sum("cloud", "provision", "failed"), 2, JSON.stringify(rows));
        assert.equal(sum("cloud", "provision", "breaker_open"), 1);
        assert.equal(sum("k", "quarantine", "abandoned"), 1);
        const use = rows.filter((r) => r.scope === "" && r.series === "host_allocations" && r.label === "host-a");
        assert.ok(use.length >= 1 && use.every((r) => Number(r.value) === 2), JSON.stringify(use));

        // Another coordinator's rows in the same bucket: its counted quarantine adds up, its (smaller) use figure does not.
        const qAt = bucketOf(quarantinedAt) * 1000;
        await t.store.transaction((tx) =>
          writeSeries(tx, "c-other", [
            { org: "acme", scope: "k", at: qAt, series: "quarantine", label: "abandoned", value: 2 },
            { org: "acme", scope: "", at: qAt, series: "host_allocations", label: "host-a", value: 1 },
          ], Date.now()),
        );

        const cookie = await signIn(t.coord.url, adminTok.token);
        const k = await page(`${t.coord.url}/ui/pools/k?window=15m`, cookie, "pool");
        const abandoned = column(k.d, "history-quarantine", "abandoned");
        assert.equal(Object.values(abandoned).reduce((a, n) => a + n, 0), 3, `1 here + 2 of the other instance: ${JSON.stringify(abandoned)}`);
        assert.ok(Object.keys(abandoned).every((x) => Math.abs(Number(x) - bucketOf(quarantinedAt)) <= 10), `at the quarantine's time: ${JSON.stringify(abandoned)} vs ${bucketOf(quarantinedAt)}`);
        assert.match(k.html, /In the window: abandoned 3/);
        assert.match(k.html, /No provision given up in this window/);

        const cloud = await page(`${t.coord.url}/ui/pools/cloud?window=15m`, cookie, "pool");
        const failed = column(cloud.d, "history-provision", "failed");
        assert.equal(Object.values(failed).reduce((a, n) => a + n, 0), 2);
        assert.ok(Object.keys(failed).every((x) => Number(x) >= bucketOf(provisionAt) && Number(x) <= bucketOf(quarantinedAt)), JSON.stringify(failed));
        assert.match(cloud.html, /In the window: breaker_open 1, failed 2/);

        const allocs = await page(`${t.coord.url}/ui/allocations?window=15m`, cookie, "use");
        const hostUse = column(allocs.d, "use-host-allocations", "host-a");
        assert.equal(Math.max(...Object.values(hostUse)), 2, "the largest of the instances' figures, not their sum");
        const vcpu = Number((await t.store.transaction((tx) => tx.get<{ n: number }>("SELECT SUM(vcpu) AS n FROM allocations")))!.n);
        assert.ok(vcpu > 0);
        assert.equal(Math.max(...Object.values(column(allocs.d, "use-host-vcpu", "host-a"))), vcpu);
        assert.ok(Object.values(column(allocs.d, "use-owner-allocations", owner.id)).includes(2));
        // A member does not see the organisation's use; another organisation's operator sees none of it.
        const member = await signIn(t.coord.url, owner.token);
        assert.doesNotMatch(await (await fetch(`${t.coord.url}/ui/allocations`, { headers: { cookie: member } })).text(), /data-series="use"/);
        const other = await signIn(t.coord.url, (await t.token("admin", "globex")).token);
        const theirs = await page(`${t.coord.url}/ui/allocations?window=15m`, other, "use");
        assert.deepEqual(theirs.d.charts, []);
        assert.equal((await fetch(`${t.coord.url}/ui/pools/k`, { headers: { cookie: other } })).status, 404);
      } finally {
        await t.close();
        await w.close();
      }
    });
  });
}
