/**
 * Keeper and portable access side by side, and rollback: separate
 * namespaces, registrations and borrows refused across them, fail-closed
 * refusals with no fallback (coordinator without --portable, provider
 * without the capabilities), and a coordinator restarted without portable
 * access that neither exposes grants through keeper paths nor abandons their
 * cleanup.
 */
import { test, describe } from "node:test";
import assert from "node:assert/strict";
import { PG_SKIP, startTestCoordinator, tempDir, TestClock, openStore, type Engine } from "../helpers/env.js";
import { ackBody, borrowPortable, grantRow, HOST_KEY, machineRow, refused, ScriptedExternalProvider, settle, tokens } from "../helpers/portable.js";
import type { Api } from "../../src/cli/api.js";

const ssh = { host: "10.0.0.1", port: 22, user: "u", hostKey: HOST_KEY };

async function pool(api: Api, name: string, access: "keeper" | "portable", n: number): Promise<{ token: string }[]> {
  const e = await api.call<{ claims: { token: string }[] }>("POST", `/v1/pools/${name}/ensure`, { minReady: n, maxReady: n, compatibilityKey: "k", access, provider: "external" });
  return e.claims;
}

for (const engine of ["sqlite", "postgres"] as Engine[]) {
  describe(`keeper/portable isolation on ${engine}`, { skip: engine === "postgres" ? PG_SKIP : false }, () => {
    test("[I10] a resource live in one namespace cannot be registered in the other, both ways; borrows never cross", async () => {
      const provider = new ScriptedExternalProvider();
      const t = await startTestCoordinator({ engine, clock: new TestClock(), reconcile: false, providers: [provider], config: { portable: true } });
      try {
        const admin = await t.api("admin");
        const portableClaims = await pool(admin, "agents", "portable", 2);
        const keeperClaims = await pool(admin, "ci", "keeper", 2);
        await admin.call("POST", "/v1/pools/agents/machines", { claimToken: portableClaims[0]!.token, resourceId: "vm-p", ssh });
        await admin.call("POST", "/v1/pools/ci/machines", { claimToken: keeperClaims[0]!.token, resourceId: "vm-k", ssh });
        const before = await t.store.transaction((tx) => tx.all("SELECT * FROM machines ORDER BY id"));
        await refused(admin.call("POST", "/v1/pools/ci/machines", { claimToken: keeperClaims[1]!.token, resourceId: "vm-p", ssh }), "namespace_conflict", 409);
        await refused(admin.call("POST", "/v1/pools/agents/machines", { claimToken: portableClaims[1]!.token, resourceId: "vm-k", ssh }), "namespace_conflict", 409);
        assert.deepEqual(await t.store.transaction((tx) => tx.all("SELECT * FROM machines ORDER BY id")), before);

        const member = await t.api("member");
        await refused(member.call("POST", "/v1/pools/agents/borrow", {}), "namespace_conflict", 409);
        await refused(borrowPortable(member, "ci"), "namespace_conflict", 409);
        // Changing a pool's access while it has live machines is refused.
        await refused(admin.call("POST", "/v1/pools/agents/ensure", { minReady: 1, maxReady: 2, compatibilityKey: "k", access: "keeper", provider: "external" }), "conflict", 409);
        assert.deepEqual(await t.store.transaction((tx) => tx.all("SELECT * FROM machines ORDER BY id")), before);
        assert.equal((await t.store.transaction((tx) => tx.all("SELECT * FROM borrows"))).length, 0);
        assert.equal((await t.store.transaction((tx) => tx.all("SELECT * FROM grants"))).length, 0);

        // Each protocol still works in its own namespace, in separate tables.
        const k = await member.call<{ borrowId: string }>("POST", "/v1/pools/ci/borrow", {});
        const p = await borrowPortable(member, "agents");
        assert.ok(k.borrowId.startsWith("b_") && p.borrowId.startsWith("g_"));
        assert.equal((await t.store.transaction((tx) => tx.all("SELECT * FROM borrows"))).length, 1);
        assert.equal((await t.store.transaction((tx) => tx.all("SELECT * FROM grants"))).length, 1);
        // A grant is not reachable through keeper paths with its tokens (and vice versa).
        await refused(member.call("POST", `/v1/borrows/${k.borrowId}/ack`, { token: p.borrowToken, grantToken: p.grantToken, publicKey: p.publicKey }), "not_found", 404);
      } finally {
        await t.close();
      }
    });

    test("[I10] fail closed: a coordinator without portable access refuses every portable request; no keeper borrow is made instead", async () => {
      const t = await startTestCoordinator({ engine, clock: new TestClock(), reconcile: false, providers: [new ScriptedExternalProvider()] });
      try {
        const admin = await t.api("admin");
        await refused(pool(admin, "agents", "portable", 1), "portable_unsupported", 400);
        assert.equal((await t.store.transaction((tx) => tx.all("SELECT * FROM pools"))).length, 0);
        const claims = await pool(admin, "ci", "keeper", 1);
        await admin.call("POST", "/v1/pools/ci/machines", { claimToken: claims[0]!.token, resourceId: "vm-1", ssh });
        await refused(borrowPortable(admin, "ci"), "portable_unsupported", 400);
        await refused(admin.call("POST", "/v1/borrows/g_whatever/ack", { token: "x", grantToken: "y", publicKey: "z" }), "portable_unsupported", 400);
        assert.equal((await t.store.transaction((tx) => tx.all("SELECT * FROM borrows"))).length, 0, "no fallback to keeper access");
        const m = await t.store.transaction((tx) => tx.get<{ state: string; generation: number }>("SELECT state, generation FROM machines"));
        assert.deepEqual({ ...m }, { state: "ready", generation: 0 });
      } finally {
        await t.close();
      }
    });

    test("[I10] fail closed: a provider without the portable capabilities is refused for portable pools", async () => {
      // The stock external provider: no key install, revoke, fence, destroy or identity observation.
      const t = await startTestCoordinator({ engine, clock: new TestClock(), reconcile: false, config: { portable: true } });
      try {
        const admin = await t.api("admin");
        await assert.rejects(pool(admin, "agents", "portable", 1), (e: Error & { code?: string }) => {
          assert.equal(e.code, "portable_unsupported");
          assert.match(e.message, /installKey, revokeKey, fence, destroy, observeIdentity/);
          return true;
        });
        assert.equal((await t.store.transaction((tx) => tx.all("SELECT * FROM pools"))).length, 0);
        // A provider lacking only one capability is refused too.
        const t2 = await startTestCoordinator({ engine, clock: new TestClock(), reconcile: false, config: { portable: true }, providers: [new ScriptedExternalProvider({ provision: false, installKey: true, revokeKey: true, fence: false, scrub: true, destroy: true, observeIdentity: true })] });
        try {
          await assert.rejects(pool(await t2.api("admin"), "agents", "portable", 1), (e: Error & { code?: string }) => e.code === "portable_unsupported" && /lacks fence/.test(e.message));
        } finally {
          await t2.close();
        }
      } finally {
        await t.close();
      }
    });

    test("[I10] rollback: restarted without portable access, grants stay out of keeper paths and their cleanup still completes", async () => {
      const dir = tempDir();
      const clock = new TestClock();
      const store = await openStore(engine, dir.path);
      const provider = new ScriptedExternalProvider();
      const t1 = await startTestCoordinator({ engine, store, dir: dir.path, clock, reconcile: false, providers: [provider], config: { portable: true }, keepStore: true });
      let t2: Awaited<ReturnType<typeof startTestCoordinator>> | null = null;
      try {
        const admin = await t1.api("admin");
        const claims = await pool(admin, "agents", "portable", 2);
        for (const [i, c] of claims.entries()) await admin.call("POST", "/v1/pools/agents/machines", { claimToken: c.token, resourceId: `vm-${i}`, ssh });
        const b = await borrowPortable(admin, "agents", { durationMs: 60_000 });
        await admin.call("POST", `/v1/borrows/${b.borrowId}/ack`, ackBody(b));
        await t1.close();

        // The older configuration: portable off, same database.
        t2 = await startTestCoordinator({ engine, store, dir: dir.path, clock, reconcile: false, providers: [provider] });
        const old = await t2.api("admin");
        await refused(old.call("GET", `/v1/borrows/${b.borrowId}`), "not_found", 404);
        await refused(old.call("POST", `/v1/borrows/${b.borrowId}/heartbeat`, tokens(b)), "not_found", 404);
        await refused(old.call("POST", `/v1/borrows/${b.borrowId}/return`, tokens(b)), "not_found", 404);
        await refused(old.call("POST", "/v1/pools/agents/borrow", {}), "namespace_conflict", 409);
        assert.equal((await t2.store.transaction((tx) => tx.all("SELECT * FROM borrows"))).length, 0);
        // The grant's hard deadline still ends it, and its cleanup is still proven before the machine is ready.
        clock.t = b.expiresAt;
        await settle(t2.coord);
        const g = await grantRow(t2, b.borrowId);
        assert.equal(g.reason, "expired");
        assert.equal(g.state, "closed");
        assert.deepEqual(provider.callsOf("remove_key").map((c) => c.args.fingerprint), [b.fingerprint]);
        assert.equal((await machineRow(t2, b.machine.id))!.state, "ready");
        assert.equal(provider.keysOn("vm-0").length + provider.keysOn("vm-1").length, 0, "no key left anywhere");
      } finally {
        await t2?.close();
        await store.close();
        dir.cleanup();
      }
    });
  });
}
