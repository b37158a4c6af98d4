/**
 * Directed tests for the invariants of PRODUCT.md that had no test of their
 * own that fails when they break (the model-based test covers all ten at
 * random; these pin one scenario each). Real store (SQLite file, and
 * PostgreSQL where configured), real coordinator actions over HTTP, the
 * reconciler and executor driven by hand; the provider is scripted (the
 * outermost boundary).
 */
import { test, describe } from "node:test";
import assert from "node:assert/strict";
import { PG_SKIP, PG_URL, openStore, startTestCoordinator, tempDir, TestClock, type Engine } from "../helpers/env.js";
import { PostgresStore } from "../../src/store/postgres/postgres-store.js";
import type { Store } from "../../src/store/store.js";
import { ApiError } from "../../src/cli/api.js";
import { ackBody, borrowPortable, grantRow, HOST_KEY, machineRow, portableEnv, ScriptedExternalProvider, settle, tokens, type Borrowed } from "../helpers/portable.js";

async function nonClosedGrantsPerMachine(store: Store): Promise<Map<string, number>> {
  const rows = await store.transaction((tx) => tx.all<{ machine_id: string; n: number }>("SELECT machine_id, COUNT(*) AS n FROM grants WHERE state <> 'closed' GROUP BY machine_id"));
  return new Map(rows.map((r) => [r.machine_id, Number(r.n)]));
}

for (const engine of ["sqlite", "postgres"] as Engine[]) {
  describe(`invariants on ${engine}`, { skip: engine === "postgres" ? PG_SKIP : false }, () => {
    test("[I1] concurrent borrows over three cycles: at most one non-closed grant per machine, and a machine ready again holds no key", async () => {
      const env = await portableEnv(engine, { n: 3 });
      try {
        const apis = await Promise.all(Array.from({ length: 8 }, () => env.t.api("member")));
        const resources = new Map<string, string>();
        for (const id of env.machines) {
          const r = await env.t.store.transaction((tx) => tx.get<{ resource_id: string }>("SELECT resource_id FROM machines WHERE id = ?", [id]));
          resources.set(id, r!.resource_id);
        }
        for (let cycle = 0; cycle < 3; cycle++) {
          const results = await Promise.allSettled(apis.map((api) => borrowPortable(api)));
          const won: Array<{ api: (typeof apis)[number]; b: Borrowed }> = [];
          results.forEach((r, i) => {
            if (r.status === "fulfilled") won.push({ api: apis[i]!, b: r.value });
            else assert.equal((r.reason as ApiError).code, "pool_exhausted");
          });
          assert.equal(won.length, 3, "one borrow per machine");
          assert.equal(new Set(won.map((w) => w.b.machine.id)).size, 3);
          for (const n of (await nonClosedGrantsPerMachine(env.t.store)).values()) assert.equal(n, 1);
          await Promise.all(won.map((w) => w.api.call("POST", `/v1/borrows/${w.b.borrowId}/ack`, ackBody(w.b))));
          for (const w of won) assert.deepEqual(env.provider.keysOn(resources.get(w.b.machine.id)!), [w.b.fingerprint], "the borrower's key alone is installed");
          // A second borrow while all are lent gets nothing.
          await assert.rejects(borrowPortable(apis[0]!), (e: unknown) => e instanceof ApiError && e.code === "pool_exhausted");
          await Promise.all(won.map((w) => w.api.call("POST", `/v1/borrows/${w.b.borrowId}/return`, tokens(w.b))));
          await settle(env.t.coord);
          for (const id of env.machines) {
            assert.equal((await machineRow(env.t, id))!.state, "ready");
            assert.deepEqual(env.provider.keysOn(resources.get(id)!), [], `ready machine ${id} holds no key`);
          }
          assert.equal((await nonClosedGrantsPerMachine(env.t.store)).size, 0, "every grant of a ready machine is closed");
          env.clock.advance(1_000);
        }
      } finally {
        await env.close();
      }
    });

    test("[I5] a returned machine is ready only after remove-key, fence and scrub of its generation, in that order, each confirmed", async () => {
      const env = await portableEnv(engine);
      try {
        const member = await env.t.api("member");
        const b = await borrowPortable(member);
        await member.call("POST", `/v1/borrows/${b.borrowId}/ack`, ackBody(b));
        for (const kind of ["remove_key", "fence", "scrub"] as const) env.provider.on(kind, "hold");
        await member.call("POST", `/v1/borrows/${b.borrowId}/return`, tokens(b));
        const settling = settle(env.t.coord);
        const steps = ["remove_key", "fence", "scrub"] as const;
        // Whichever step the coordinator asks for next (or the end of the cleanup), so a skipped step fails here instead of waiting forever.
        const next = () => Promise.race([...steps.map((k) => env.provider.heldOne(k).then(() => k)), settling.then(() => "settled" as const)]);
        for (const [kind, state] of [["remove_key", "revoking"], ["fence", "fencing"], ["scrub", "scrubbing"]] as const) {
          const got = await next();
          if (got !== kind) {
            if (got !== "settled") env.provider.release(got, "fail");
            assert.fail(`expected ${kind} next, the coordinator went to ${got}; the machine is ${(await machineRow(env.t, b.machine.id))!.state}`);
          }
          assert.equal((await machineRow(env.t, b.machine.id))!.state, state, `while ${kind} is unconfirmed the machine is ${state}, not ready`);
          env.provider.release(kind);
        }
        await settling;
        assert.equal((await machineRow(env.t, b.machine.id))!.state, "ready");
        const cleanup = env.provider.calls.filter((c) => c.kind !== "install_key");
        assert.deepEqual(cleanup.map((c) => c.kind), ["remove_key", "fence", "scrub"]);
        for (const c of cleanup) assert.equal(c.generation, b.generation, `${c.kind} is for the grant's generation`);
        assert.equal(cleanup[0]!.args.fingerprint, b.fingerprint, "the grant's exact key is removed");
        assert.equal((await grantRow(env.t, b.borrowId)).state, "closed");
      } finally {
        await env.close();
      }
    });

    test("[I9] cleanup started by a coordinator that then dies resumes on a restarted one from the operation's durable row, with the same op id", async () => {
      const dir = tempDir();
      const clock = new TestClock();
      const storeA = await openStore(engine, dir.path);
      let storeB: Store | null = null;
      const pA = new ScriptedExternalProvider();
      const pB = new ScriptedExternalProvider();
      const a = await startTestCoordinator({ engine, store: storeA, dir: dir.path, clock, reconcile: false, providers: [pA], config: { portable: true }, keepStore: true });
      let aClosed = false;
      try {
        const admin = await a.api("admin");
        const e = await admin.call<{ claims: { token: string }[] }>("POST", "/v1/pools/agents/ensure", { minReady: 1, maxReady: 1, compatibilityKey: "k", access: "portable", provider: "external" });
        const { machineId } = await admin.call<{ machineId: string }>("POST", "/v1/pools/agents/machines", { claimToken: e.claims[0]!.token, resourceId: "vm-1", ssh: { host: "10.0.0.1", port: 22, user: "u", hostKey: HOST_KEY } });
        const member = await a.api("member");
        const b = await borrowPortable(member);
        await member.call("POST", `/v1/borrows/${b.borrowId}/ack`, ackBody(b));
        await member.call("POST", `/v1/borrows/${b.borrowId}/return`, tokens(b));
        // Coordinator A starts the key removal (op row running, lease set) and dies before calling the provider.
        const r = await a.coord.reconciler.tick();
        const started = r.started.find((s) => s.op.kind === "remove_key");
        assert.ok(started, "the return's key removal was started");
        await a.close();
        aClosed = true;
        assert.equal(pA.callsOf("remove_key").length, 0);

        if (engine === "postgres") {
          const s = ((await (storeA as PostgresStore).pool.query("SELECT current_schema() AS s")).rows[0] as { s: string }).s;
          storeB = await PostgresStore.open({ connectionString: PG_URL!, schema: s });
        } else storeB = await openStore(engine, dir.path);
        const bCoord = await startTestCoordinator({ engine, store: storeB, dir: dir.path, clock, reconcile: false, providers: [pB], config: { portable: true } });
        try {
          // Within the dead coordinator's lease nobody acts twice.
          await settle(bCoord.coord);
          assert.equal(pB.callsOf("remove_key").length, 0, "not retried while the lease runs");
          assert.equal((await machineRow(bCoord, machineId))!.state, "revoking", "never ready with the key removal unproven");
          clock.advance(30_000);
          await settle(bCoord.coord);
          assert.deepEqual(pB.callsOf("remove_key").map((c) => c.opId), [started.op.id], "resumed under the same operation id");
          assert.deepEqual(pB.calls.map((c) => c.kind), ["remove_key", "fence", "scrub"]);
          assert.equal((await machineRow(bCoord, machineId))!.state, "ready");
          assert.equal((await grantRow(bCoord, b.borrowId)).state, "closed");
        } finally {
          await bCoord.close();
        }
      } finally {
        if (!aClosed) await a.close();
        if (storeB) await storeB.close();
        await storeA.close();
        dir.cleanup();
      }
    });
  });
}
