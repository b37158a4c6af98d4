/**
 * Keeper pools end to end over HTTP on a real SQLite file (and PostgreSQL
 * where configured): desired capacity, fill claims, registration, borrow,
 * heartbeat, return, abandonment, quarantine, pruning.
 */
import { test, describe } from "node:test";
import assert from "node:assert/strict";
import { startTestCoordinator, TestClock, PG_SKIP, type Engine } from "../helpers/env.js";
import { ApiError, type Api } from "../../src/cli/api.js";

type Claim = { id: string; token: string; expiresAt: number };

async function ensure(api: Api, pool: string, body: Record<string, unknown>) {
  return api.call<{ claims: Claim[]; counts: { ready: number; openClaims: number } }>("POST", `/v1/pools/${pool}/ensure`, { compatibilityKey: "linux-x64", ...body });
}

async function register(api: Api, pool: string, claim: Claim, resourceId: string) {
  return api.call<{ machineId: string; state: string }>("POST", `/v1/pools/${pool}/machines`, { claimToken: claim.token, resourceId, ssh: { host: "10.0.0.1", port: 22, user: "ci" } });
}

async function refused(p: Promise<unknown>, code: string, status?: number): Promise<void> {
  await assert.rejects(p, (e: unknown) => {
    assert.ok(e instanceof ApiError, `expected ApiError, got ${String(e)}`);
    assert.equal(e.code, code, e.message);
    if (status) assert.equal(e.status, status);
    return true;
  });
}

function metricValue(text: string, name: string, labels: string): number {
  const line = text.split("\n").find((l) => l.startsWith(`${name}{`) && l.includes(labels));
  return line ? Number(line.split(" ").pop()) : 0;
}

for (const engine of ["sqlite", "postgres"] as Engine[]) {
  describe(`keeper pools on ${engine}`, { skip: engine === "postgres" ? PG_SKIP : false }, () => {
    test("a client-chosen borrow id and token: a repeat answers the same borrow (even from an empty pool); another token, org or pool is conflict", async () => {
      const t = await startTestCoordinator({ engine, reconcile: false });
      try {
        const api = await t.api("admin");
        const e = await ensure(api, "ci", { minReady: 1, maxReady: 1 });
        const m = await register(api, "ci", e.claims[0]!, "vm-1");
        const member = await t.api("member");
        const chosen = { borrowId: "b_" + "k".repeat(20), borrowToken: "bbt_" + "A".repeat(43) };
        const first = await member.raw("POST", "/v1/pools/ci/borrow", chosen);
        assert.equal(first.status, 201, first.text);
        const b = first.body as { borrowId: string; borrowToken: string; machine: { id: string; generation: number }; expiresAt: number; repeated: boolean };
        assert.equal(b.borrowId, chosen.borrowId);
        assert.equal(b.borrowToken, chosen.borrowToken);
        assert.equal(b.machine.id, m.machineId);
        assert.equal(b.repeated, false);
        // The pool's one machine is lent: a repeat (a retry after a lost reply) still gets its borrow.
        const again = await member.raw("POST", "/v1/pools/ci/borrow", chosen);
        assert.equal(again.status, 200, again.text);
        assert.deepEqual({ ...(again.body as object), repeated: false }, b);
        assert.equal((again.body as { repeated: boolean }).repeated, true);
        await refused(member.call("POST", "/v1/pools/ci/borrow", {}), "pool_exhausted", 503);
        const show = await api.call<{ counts: { ready: number; lent: number } }>("GET", "/v1/pools/ci");
        assert.equal(show.counts.lent, 1, "one machine lent, not two");
        // The same id with another token, from another organisation, or for another pool: conflict.
        await refused(member.call("POST", "/v1/pools/ci/borrow", { ...chosen, borrowToken: "bbt_" + "B".repeat(43) }), "conflict", 409);
        await ensure(await t.api("admin", "other-org"), "ci", { minReady: 0, maxReady: 1 });
        await refused((await t.api("member", "other-org")).call("POST", "/v1/pools/ci/borrow", chosen), "conflict", 409);
        await ensure(api, "other", { minReady: 0, maxReady: 1 });
        await refused(member.call("POST", "/v1/pools/other/borrow", chosen), "conflict", 409);
        // The stored token is a hash; the client's token works for the borrow's own calls.
        await member.call("POST", `/v1/borrows/${b.borrowId}/heartbeat`, { token: chosen.borrowToken });
        const back = await member.call<{ state: string }>("POST", `/v1/borrows/${b.borrowId}/return`, { token: chosen.borrowToken });
        assert.equal(back.state, "ready");
        // Once returned, a repeat does not lend the machine again under the old borrow.
        await refused(member.call("POST", "/v1/pools/ci/borrow", chosen), "borrow_not_active", 409);
        // Malformed or half-given: refused before anything is read.
        await refused(member.call("POST", "/v1/pools/ci/borrow", { borrowId: chosen.borrowId }), "invalid_request", 400);
        await refused(member.call("POST", "/v1/pools/ci/borrow", { ...chosen, borrowToken: "short" }), "invalid_request", 400);
        await refused(member.call("POST", "/v1/pools/ci/borrow", { ...chosen, borrowId: "b_UPPER_" + "x".repeat(20) }), "invalid_request", 400);
        assert.equal((await api.call<{ counts: { ready: number } }>("GET", "/v1/pools/ci")).counts.ready, 1);
      } finally {
        await t.close();
      }
    });

    test("8 concurrent requests of one client-chosen borrow: one borrow, one machine lent, every answer the same", async () => {
      const t = await startTestCoordinator({ engine, reconcile: false });
      try {
        const api = await t.api("admin");
        const e = await ensure(api, "ci", { minReady: 3, maxReady: 3 });
        for (const [i, c] of e.claims.entries()) await register(api, "ci", c, `vm-${i}`);
        const member = await t.api("member");
        const chosen = { borrowId: "b_" + "c".repeat(20), borrowToken: "bbt_" + "C".repeat(43) };
        const answers = await Promise.all(Array.from({ length: 8 }, () => member.call<{ borrowId: string; machine: { id: string } }>("POST", "/v1/pools/ci/borrow", chosen)));
        assert.deepEqual(new Set(answers.map((a) => `${a.borrowId}/${a.machine.id}`)).size, 1, JSON.stringify(answers));
        const counts = (await api.call<{ counts: { ready: number; lent: number } }>("GET", "/v1/pools/ci")).counts;
        assert.equal(counts.lent, 1);
        assert.equal(counts.ready, 2);
      } finally {
        await t.close();
      }
    });

    test("[I7] ensure issues claims, registration consumes them, borrow and return cycle", async () => {
      const t = await startTestCoordinator({ engine, reconcile: false });
      try {
        const api = await t.api("admin");
        const e1 = await ensure(api, "ci", { minReady: 2, maxReady: 3 });
        assert.equal(e1.claims.length, 2);
        // Claims under way count: a second ensure issues nothing more.
        const e2 = await ensure(api, "ci", { minReady: 2, maxReady: 3 });
        assert.equal(e2.claims.length, 0);
        const m1 = await register(api, "ci", e1.claims[0]!, "vm-1");
        await register(api, "ci", e1.claims[1]!, "vm-2");
        assert.equal(m1.state, "ready");
        const show = await api.call<{ counts: { ready: number } }>("GET", "/v1/pools/ci");
        assert.equal(show.counts.ready, 2);

        const member = await t.api("member");
        const b = await member.call<{ borrowId: string; borrowToken: string; machine: { id: string; generation: number } }>("POST", "/v1/pools/ci/borrow", {});
        // The longest-waiting ready machine is lent first.
        assert.equal(b.machine.id, m1.machineId);
        assert.equal(b.machine.generation, 1);
        await member.call("POST", `/v1/borrows/${b.borrowId}/heartbeat`, { token: b.borrowToken });
        const back = await member.call<{ state: string }>("POST", `/v1/borrows/${b.borrowId}/return`, { token: b.borrowToken });
        assert.equal(back.state, "ready");
        // A second return (a retry after a lost reply) answers where the first went and changes nothing.
        const again = await member.call<{ state: string; repeated?: boolean; machineId: string }>("POST", `/v1/borrows/${b.borrowId}/return`, { token: b.borrowToken });
        assert.deepEqual(again, { machineId: m1.machineId, state: "ready", repeated: true });
        // Still the same once the machine was lent again (a later generation): the return had reached ready.
        const b3 = await member.call<{ borrowId: string; borrowToken: string; machine: { id: string } }>("POST", "/v1/pools/ci/borrow", {});
        if (b3.machine.id === m1.machineId) {
          const third = await member.call<{ state: string }>("POST", `/v1/borrows/${b.borrowId}/return`, { token: b.borrowToken });
          assert.equal(third.state, "ready");
        }
        await member.call("POST", `/v1/borrows/${b3.borrowId}/return`, { token: b3.borrowToken });
        // A wrong token is refused.
        const b2 = await member.call<{ borrowId: string; borrowToken: string }>("POST", "/v1/pools/ci/borrow", {});
        await refused(member.call("POST", `/v1/borrows/${b2.borrowId}/return`, { token: b.borrowToken }), "token_mismatch", 403);
      } finally {
        await t.close();
      }
    });

    test("[I7] registering twice with one claim is refused and changes nothing", async () => {
      const t = await startTestCoordinator({ engine, reconcile: false });
      try {
        const api = await t.api("operator");
        const e = await ensure(api, "ci", { minReady: 1, maxReady: 1 });
        await register(api, "ci", e.claims[0]!, "vm-1");
        const before = await t.store.transaction((tx) => tx.all("SELECT * FROM machines ORDER BY id"));
        await refused(register(api, "ci", e.claims[0]!, "vm-2"), "claim_consumed", 409);
        const after = await t.store.transaction((tx) => tx.all("SELECT * FROM machines ORDER BY id"));
        assert.deepEqual(after, before);
      } finally {
        await t.close();
      }
    });

    test("[I7] an unexpired claim funding provisioning survives a lowered maxReady; expired claims are released", async () => {
      const clock = new TestClock();
      const t = await startTestCoordinator({ engine, clock, reconcile: false, config: { claimTtlMs: 60_000 } });
      try {
        const api = await t.api("operator");
        const e = await ensure(api, "ci", { minReady: 2, maxReady: 2 });
        assert.equal(e.claims.length, 2);
        const lowered = await ensure(api, "ci", { minReady: 0, maxReady: 0 });
        assert.equal(lowered.counts.openClaims, 2);
        await register(api, "ci", e.claims[0]!, "vm-1");
        clock.advance(60_000);
        await t.coord.reconciler.tick();
        await refused(register(api, "ci", e.claims[1]!, "vm-2"), "claim_expired", 409);
        const claims = await t.store.transaction((tx) => tx.all<{ state: string }>("SELECT state FROM claims ORDER BY state"));
        assert.deepEqual(claims.map((c) => c.state), ["consumed", "expired"]);
        const metrics = (await api.raw("GET", "/metrics")).text;
        assert.equal(metricValue(metrics, "berth_fill_claims_total", 'event="expired"'), 1);
        assert.equal(metricValue(metrics, "berth_fill_claims_total", 'event="completed"'), 1);
      } finally {
        await t.close();
      }
    });

    test("[I7] 20 concurrent ensure callers never push a pool past maxReady", async () => {
      const t = await startTestCoordinator({ engine, reconcile: true });
      try {
        const apis = await Promise.all(Array.from({ length: 20 }, () => t.api("operator")));
        const results = await Promise.all(apis.map((a, i) => ensure(a, "burst", { minReady: 4 + (i % 3), maxReady: 6 })));
        const issued = results.reduce((n, r) => n + r.claims.length, 0);
        assert.ok(issued <= 6, `issued ${issued} claims for maxReady 6`);
        assert.ok(issued >= 4, `issued ${issued} claims for minReady >= 4`);
        const open = await t.store.transaction((tx) => tx.get<{ n: number }>("SELECT COUNT(*) AS n FROM claims WHERE pool = 'burst' AND state = 'open'"));
        assert.equal(Number(open!.n), issued);
      } finally {
        await t.close();
      }
    });

    test("[I6] missed heartbeat -> quarantined -> confirmed destroyed -> pruned after retention; a late heartbeat is 409 and changes nothing", async () => {
      const clock = new TestClock();
      const t = await startTestCoordinator({ engine, clock, reconcile: false, config: { retentionMs: 3_600_000 } });
      try {
        const api = await t.api("admin");
        const e = await ensure(api, "ci", { minReady: 1, maxReady: 1, heartbeatMs: 10_000 });
        const { machineId } = await register(api, "ci", e.claims[0]!, "vm-1");
        const b = await api.call<{ borrowId: string; borrowToken: string }>("POST", "/v1/pools/ci/borrow", {});
        clock.advance(9_999);
        await api.call("POST", `/v1/borrows/${b.borrowId}/heartbeat`, { token: b.borrowToken });
        clock.advance(10_000); // exactly at the deadline: already missed
        const before = await t.store.transaction((tx) => tx.all("SELECT * FROM borrows"));
        await refused(api.call("POST", `/v1/borrows/${b.borrowId}/heartbeat`, { token: b.borrowToken }), "borrow_expired", 409);
        assert.deepEqual(await t.store.transaction((tx) => tx.all("SELECT * FROM borrows")), before);
        await t.coord.reconciler.tick();
        const m = await t.store.transaction((tx) => tx.get<{ state: string }>("SELECT state FROM machines WHERE id = ?", [machineId]));
        assert.equal(m!.state, "quarantined");
        const borrow = await api.call<{ state: string }>("GET", `/v1/borrows/${b.borrowId}`);
        assert.equal(borrow.state, "abandoned");
        // Time passing never makes it ready again.
        clock.advance(7 * 86_400_000);
        await t.coord.reconciler.tick();
        assert.equal((await t.store.transaction((tx) => tx.get<{ state: string }>("SELECT state FROM machines WHERE id = ?", [machineId])))!.state, "quarantined");
        await api.call("POST", `/v1/machines/${machineId}/destroyed`, {});
        clock.advance(3_600_000);
        await t.coord.reconciler.tick();
        assert.equal(await t.store.transaction((tx) => tx.get("SELECT * FROM machines WHERE id = ?", [machineId])), undefined);
        const metrics = (await api.raw("GET", "/metrics")).text;
        assert.equal(metricValue(metrics, "berth_machines_quarantined_total", 'reason="abandoned"'), 1);
        assert.equal(metricValue(metrics, "berth_records_pruned_total", 'kind="machine"'), 1);
        assert.equal(metricValue(metrics, "berth_heartbeats_total", 'outcome="missed"'), 1);
        assert.equal(metricValue(metrics, "berth_heartbeats_total", 'outcome="refused"'), 1);
        const audit = await t.store.transaction((tx) => tx.all<{ event: string }>("SELECT event FROM audit WHERE machine_id = ? ORDER BY seq", [machineId]));
        assert.deepEqual(audit.map((a) => a.event), ["register", "reserve", "quarantine", "destroyed_confirmed", "pruned"]);
      } finally {
        await t.close();
      }
    });
  });
}
