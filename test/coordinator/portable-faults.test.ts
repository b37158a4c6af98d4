/**
 * Portable access under faults, on a real store: delayed and late provider
 * completions, revocation / fencing / scrub failures, a transaction that
 * fails half-way, and two coordinators ("keepers") racing on one database.
 */
import { test, describe } from "node:test";
import assert from "node:assert/strict";
import { PG_SKIP, PG_URL, dropSchema, openStore, startTestCoordinator, tempDir, TestClock, type Engine } from "../helpers/env.js";
import { PostgresStore } from "../../src/store/postgres/postgres-store.js";
import type { Param, Store, Tx } from "../../src/store/store.js";
import { ApiError } from "../../src/cli/api.js";
import {
  ackBody,
  auditEvents,
  borrowPortable,
  grantRow,
  HOST_KEY,
  machineRow,
  metricValue,
  portableEnv,
  refused,
  ScriptedExternalProvider,
  settle,
  tokens,
} from "../helpers/portable.js";

/** A store whose transactions fail at the first statement matching `failOn` while armed: the outermost boundary of storage. */
class FaultyStore implements Store {
  failOn: RegExp | null = null;
  constructor(readonly inner: Store) {}
  get dialect() {
    return this.inner.dialect;
  }
  get stats() {
    return this.inner.stats;
  }
  transaction<T>(fn: (tx: Tx) => Promise<T>, opts?: { name?: string }): Promise<T> {
    return this.inner.transaction((tx) => {
      const wrapped: Tx = {
        dialect: tx.dialect,
        forUpdate: tx.forUpdate,
        skipLocked: tx.skipLocked,
        all: (sql, p) => tx.all(sql, p),
        get: (sql, p) => tx.get(sql, p),
        afterCommit: (f) => tx.afterCommit(f),
        run: async (sql, p) => {
          this.#inject(sql);
          return tx.run(sql, p);
        },
        write: async (sql, p, opts) => {
          this.#inject(sql);
          return tx.write(sql, p, opts);
        },
      };
      return fn(wrapped);
    }, opts);
  }
  #inject(sql: string): void {
    if (this.failOn && this.failOn.test(sql)) {
      this.failOn = null;
      throw new Error("injected storage failure");
    }
  }
  readCommitted<T>(sql: string, params?: readonly Param[]): Promise<T | undefined> {
    return this.inner.readCommitted<T>(sql, params);
  }
  close(): Promise<void> {
    return this.inner.close();
  }
}

async function liveGrantsPerMachine(store: Store): Promise<number> {
  const r = await store.transaction((tx) => tx.get<{ n: number }>("SELECT COALESCE(MAX(c), 0) AS n FROM (SELECT machine_id, COUNT(*) AS c FROM grants WHERE state <> 'closed' GROUP BY machine_id) x"));
  return Number(r!.n);
}

for (const engine of ["sqlite", "postgres"] as Engine[]) {
  describe(`portable access under faults on ${engine}`, { skip: engine === "postgres" ? PG_SKIP : false }, () => {
    test("[I1][I4] a delayed install completing after the return never activates; the key it may have left gets the machine destroyed", async () => {
      const env = await portableEnv(engine);
      try {
        const member = await env.t.api("member");
        const b = await borrowPortable(member);
        env.provider.on("install_key", "hold");
        const acking = member.call<{ state: string }>("POST", `/v1/borrows/${b.borrowId}/ack`, ackBody(b));
        await env.provider.heldOne("install_key");
        // The borrower gives up while the install is in flight: invalidated first, then removal, fence, scrub.
        const back = await member.call<{ state: string }>("POST", `/v1/borrows/${b.borrowId}/return`, tokens(b));
        assert.equal(back.state, "invalidated");
        await settle(env.t.coord);
        assert.equal((await machineRow(env.t, b.machine.id))!.state, "ready");
        // Now the delayed install lands (this provider does not fence its own late work).
        env.provider.release("install_key");
        const acked = await acking;
        assert.notEqual(acked.state, "active");
        const g = await grantRow(env.t, b.borrowId);
        assert.equal(g.activated_at, null, "never active");
        assert.deepEqual(env.provider.keysOn("vm-agents-1"), [b.fingerprint], "the provider says the key is there now");
        // Doubt: the machine is quarantined and destroyed, never lent with that key.
        assert.equal((await machineRow(env.t, b.machine.id))!.state, "quarantined");
        await settle(env.t.coord);
        assert.equal((await machineRow(env.t, b.machine.id))!.state, "destroyed");
        assert.ok(env.provider.destroyed.has("vm-agents-1"));
        assert.ok((await auditEvents(env.t, b.machine.id)).includes("late_install"));
        await refused(borrowPortable(member), "pool_exhausted");
      } finally {
        await env.close();
      }
    });

    test("[I4] a late completion of an older generation never activates the newer borrow of the same machine", async () => {
      const env = await portableEnv(engine);
      try {
        const member = await env.t.api("member");
        const a = await borrowPortable(member);
        // The first ack's install reply is lost; its operation lease runs out while the borrow is returned.
        env.provider.on("install_key", "hold");
        const acking = member.call("POST", `/v1/borrows/${a.borrowId}/ack`, ackBody(a)).catch((e: unknown) => e);
        await env.provider.heldOne("install_key");
        // The borrow is returned and cleaned up while the install is still in flight.
        await member.call("POST", `/v1/borrows/${a.borrowId}/return`, tokens(a));
        await settle(env.t.coord);
        const b = await borrowPortable(member);
        assert.equal(b.machine.id, a.machine.id);
        assert.equal(b.generation, a.generation + 1);
        // The old install now reports done, for generation g, while the machine is at g + 1.
        env.provider.release("install_key", "done");
        await acking;
        const gb = await grantRow(env.t, b.borrowId);
        assert.equal(gb.state, "pending", "the newer borrow is untouched by the older completion");
        assert.equal((await machineRow(env.t, b.machine.id))!.state, "reserved");
        await member.call("POST", `/v1/borrows/${b.borrowId}/ack`, ackBody(b));
        assert.equal((await grantRow(env.t, b.borrowId)).state, "active");
        assert.equal((await grantRow(env.t, a.borrowId)).activated_at, null);
        assert.ok((await auditEvents(env.t, a.machine.id)).includes("late_install_key"), "recorded as a late completion");
      } finally {
        await env.close();
      }
    });

    for (const step of ["remove_key", "fence", "scrub"] as const) {
      test(`[I5] a ${step} that fails quarantines the machine; it is destroyed, never ready`, async () => {
        const env = await portableEnv(engine);
        try {
          const member = await env.t.api("member");
          const b = await borrowPortable(member);
          await member.call("POST", `/v1/borrows/${b.borrowId}/ack`, ackBody(b));
          env.provider.on(step, "fail");
          await member.call("POST", `/v1/borrows/${b.borrowId}/return`, tokens(b));
          await settle(env.t.coord);
          const events = await auditEvents(env.t, b.machine.id);
          assert.ok(events.includes("quarantine"), events.join(","));
          assert.equal((await machineRow(env.t, b.machine.id))!.state, "destroyed");
          assert.ok(!events.includes("scrubbed"));
          if (step === "remove_key") assert.deepEqual(env.provider.callsOf("remove_key").map((c) => [c.args.grantId, c.args.fingerprint]), [[b.borrowId, b.fingerprint]], "the exact grant key");
          if (step !== "remove_key") assert.ok(events.indexOf("revoked") < events.indexOf("quarantine"), "removal was proven before the failing step");
          assert.equal((await grantRow(env.t, b.borrowId)).state, "closed");
          const metrics = (await env.admin.raw("GET", "/metrics")).text;
          assert.equal(metricValue(metrics, "berth_machines_quarantined_total", `reason="${step}_failed"`), 1);
          if (step === "fence") assert.equal(metricValue(metrics, "berth_grants_total", 'event="fence_failed"'), 1);
          if (step === "remove_key") assert.equal(metricValue(metrics, "berth_grants_total", 'event="revoke_failed"'), 1);
        } finally {
          await env.close();
        }
      });
    }

    test("[I5] a fence whose outcome stays unknown is retried with the same id, then quarantines; removal alone never makes it ready", async () => {
      const env = await portableEnv(engine);
      try {
        const member = await env.t.api("member");
        const b = await borrowPortable(member);
        await member.call("POST", `/v1/borrows/${b.borrowId}/ack`, ackBody(b));
        env.provider.on("fence", "throw", 100);
        await member.call("POST", `/v1/borrows/${b.borrowId}/return`, tokens(b));
        for (let i = 0; i < 10; i++) {
          await settle(env.t.coord);
          env.clock.advance(60_000);
          assert.notEqual((await machineRow(env.t, b.machine.id))!.state, "ready");
        }
        const fences = env.provider.callsOf("fence");
        assert.equal(fences.length, 6, "six attempts");
        assert.equal(new Set(fences.map((f) => f.opId)).size, 1, "one operation id");
        assert.equal((await machineRow(env.t, b.machine.id))!.state, "destroyed");
      } finally {
        await env.close();
      }
    });

    test("a transaction failing half-way leaves nothing: borrow and ack roll back whole", async () => {
      const dir = tempDir();
      const inner = await openStore(engine, dir.path);
      const store = new FaultyStore(inner);
      const provider = new ScriptedExternalProvider();
      const t = await startTestCoordinator({ engine, store, dir: dir.path, clock: new TestClock(), reconcile: false, providers: [provider], config: { portable: true } });
      try {
        const admin = await t.api("admin");
        const e = await admin.call<{ claims: { token: string }[] }>("POST", "/v1/pools/agents/ensure", { minReady: 1, maxReady: 1, compatibilityKey: "k", access: "portable", provider: "external" });
        const { machineId } = await admin.call<{ machineId: string }>("POST", "/v1/pools/agents/machines", { claimToken: e.claims[0]!.token, resourceId: "vm-1", ssh: { host: "10.0.0.1", port: 22, user: "u", hostKey: HOST_KEY } });
        const snapshot = async () =>
          t.store.transaction(async (tx) => ({
            machines: await tx.all("SELECT * FROM machines"),
            grants: await tx.all("SELECT * FROM grants"),
            due: await tx.all("SELECT * FROM due ORDER BY kind, ref"),
            ops: await tx.all("SELECT * FROM operations"),
          }));
        const before = await snapshot();
        // The grant insert fails after the machine was reserved in the same transaction.
        store.failOn = /^\s*INSERT INTO grants/;
        await assert.rejects(borrowPortable(admin), (err: unknown) => err instanceof ApiError && err.status === 500);
        assert.deepEqual(await snapshot(), before, "the reservation rolled back with the failed grant insert");
        const b = await borrowPortable(admin);
        const pending = await snapshot();
        // Ack: the grant's state write fails after the install intent (op row) was written.
        store.failOn = /^UPDATE grants SET state = 'installing'/;
        await assert.rejects(admin.call("POST", `/v1/borrows/${b.borrowId}/ack`, ackBody(b)), (err: unknown) => err instanceof ApiError && err.status === 500);
        assert.deepEqual(await snapshot(), pending, "no install intent without the grant moving with it");
        assert.equal(provider.callsOf("install_key").length, 0, "and no provider call");
        const ok = await admin.call<{ state: string }>("POST", `/v1/borrows/${b.borrowId}/ack`, ackBody(b));
        assert.equal(ok.state, "active");
        assert.equal((await machineRow(t, machineId))!.state, "busy");
      } finally {
        await t.close();
        await dropSchema(inner);
        await inner.close();
        dir.cleanup();
      }
    });

    test("[I1][I4] two coordinators on one database: concurrent borrows never share a machine; acks and returns cross over", async () => {
      const dir = tempDir();
      const clock = new TestClock();
      const pA = new ScriptedExternalProvider();
      const pB = new ScriptedExternalProvider();
      const storeA = await openStore(engine, dir.path);
      let storeB: Store;
      if (engine === "postgres") {
        const s = ((await (storeA as PostgresStore).pool.query("SELECT current_schema() AS s")).rows[0] as { s: string }).s;
        storeB = await PostgresStore.open({ connectionString: PG_URL!, schema: s });
      } else storeB = await openStore(engine, dir.path);
      const a = await startTestCoordinator({ engine, store: storeA, dir: dir.path, clock, reconcile: false, providers: [pA], config: { portable: true } });
      const b = await startTestCoordinator({ engine, store: storeB, dir: dir.path, clock, reconcile: false, providers: [pB], config: { portable: true }, keepStore: true });
      try {
        const admin = await a.api("admin");
        const e = await admin.call<{ claims: { token: string }[] }>("POST", "/v1/pools/agents/ensure", { minReady: 3, maxReady: 3, compatibilityKey: "k", access: "portable", provider: "external" });
        for (const [i, c] of e.claims.entries()) await admin.call("POST", "/v1/pools/agents/machines", { claimToken: c.token, resourceId: `vm-${i}`, ssh: { host: "10.0.0.1", port: 22, user: "u", hostKey: HOST_KEY } });
        const apis = await Promise.all(Array.from({ length: 12 }, (_, i) => (i % 2 ? a : b).api("member")));
        const results = await Promise.allSettled(apis.map((api) => borrowPortable(api)));
        const won = results.filter((r) => r.status === "fulfilled").map((r) => (r as PromiseFulfilledResult<Awaited<ReturnType<typeof borrowPortable>>>).value);
        const lost = results.filter((r) => r.status === "rejected").map((r) => (r as PromiseRejectedResult).reason as ApiError);
        assert.equal(won.length, 3);
        assert.ok(lost.every((x) => x.code === "pool_exhausted"), lost.map((x) => x.code).join(","));
        assert.equal(new Set(won.map((w) => w.machine.id)).size, 3, "three distinct machines");
        // Each grant is acknowledged twice, once through each coordinator, at the same time.
        const apiOf = (w: (typeof won)[number]) => apis[results.findIndex((r) => r.status === "fulfilled" && r.value === w)]!;
        const bodies = won.map((w) => ackBody(w));
        await Promise.all(won.flatMap((w, i) => [apiOf(w).call("POST", `/v1/borrows/${w.borrowId}/ack`, bodies[i]), apiOf(w).call("POST", `/v1/borrows/${w.borrowId}/ack`, bodies[i])]));
        assert.equal(pA.callsOf("install_key").length + pB.callsOf("install_key").length, 3, "one install per grant across both coordinators");
        assert.equal(await liveGrantsPerMachine(a.store), 1);
        // Returns race with the reconcilers of both coordinators.
        await Promise.all([...won.map((w) => apiOf(w).call("POST", `/v1/borrows/${w.borrowId}/return`, tokens(w))), settle(a.coord), settle(b.coord)]);
        await Promise.all([settle(a.coord), settle(b.coord)]);
        await settle(a.coord);
        const states = await a.store.transaction((tx) => tx.all<{ state: string }>("SELECT state FROM machines"));
        assert.deepEqual(states.map((s) => s.state), ["ready", "ready", "ready"]);
        for (const w of won) assert.equal((await grantRow(a, w.borrowId)).state, "closed");
        const all = [...pA.calls, ...pB.calls];
        for (const kind of ["remove_key", "fence", "scrub"] as const) assert.equal(new Set(all.filter((c) => c.kind === kind).map((c) => c.opId)).size, 3, `${kind}: one operation per grant`);
      } finally {
        await b.close();
        await storeB.close();
        await a.close();
        await storeA.close();
        dir.cleanup();
      }
    });
  });
}
