/**
 * API-token checks read committed state outside the transaction queue. A
 * token revoked through another handle on the same database (as `berth
 * token revoke` does, from its own process) is refused on the coordinator's
 * very next request, on SQLite and PostgreSQL; a token created that way is
 * accepted at once. The keeper borrow, heartbeat and return take a token
 * they have seen before from the coordinator's cache and check it again in
 * their own transaction: revoked elsewhere after it was cached, it is
 * refused there too, and nothing is taken or ended. So does the portable
 * borrow.
 */
import { test, describe } from "node:test";
import assert from "node:assert/strict";
import { join } from "node:path";
import { randomBytes } from "node:crypto";
import { startTestCoordinator, PG_SKIP, PG_URL, type Engine } from "../helpers/env.js";
import { SqliteStore } from "../../src/store/sqlite/sqlite-store.js";
import { PostgresStore } from "../../src/store/postgres/postgres-store.js";
import { createToken, revokeTokenWithGrants } from "../../src/coordinator/auth.js";
import { Api, ApiError } from "../../src/cli/api.js";
import type { Store } from "../../src/store/store.js";
import { ScriptedExternalProvider } from "../helpers/portable.js";
import { generateSshKeyPair } from "../../src/core/ssh-keys.js";

async function secondHandle(engine: Engine, dir: string, first: Store): Promise<Store> {
  if (engine === "sqlite") return new SqliteStore({ path: join(dir, "berth.db") });
  const r = await (first as PostgresStore).pool.query("SELECT current_schema() AS s");
  return PostgresStore.open({ connectionString: PG_URL!, schema: (r.rows[0] as { s: string }).s });
}

for (const engine of ["sqlite", "postgres"] as Engine[]) {
  describe(`API tokens changed by another handle on ${engine}`, { skip: engine === "postgres" ? PG_SKIP : false }, () => {
    test("a token created elsewhere works at once; revoked elsewhere, it is refused on the next request", async () => {
      const t = await startTestCoordinator({ engine, reconcile: false });
      const other = await secondHandle(engine, t.dir, t.store);
      const apis: Api[] = [];
      try {
        const tok = await createToken(other, { org: "acme", role: "member", expiresAt: null, label: null }, Date.now(), (n) => randomBytes(n));
        const api = new Api(t.coord.url, tok.token);
        apis.push(api);
        await api.call("GET", "/v1/pools");
        assert.deepEqual(await revokeTokenWithGrants(other, tok.id, Date.now()), { revoked: true, grants: 0 });
        await assert.rejects(api.call("GET", "/v1/pools"), (e: unknown) => e instanceof ApiError && e.status === 401 && /revoked/.test(e.message));
        await assert.rejects(api.call("POST", "/v1/pools/ci/borrow", {}), (e: unknown) => e instanceof ApiError && e.status === 401);
      } finally {
        await Promise.all(apis.map((a) => a.close()));
        await other.close();
        await t.close();
      }
    });

    test("a token the keeper routes cached, revoked elsewhere: borrow, heartbeat and return refused, nothing changed", async () => {
      const t = await startTestCoordinator({ engine, reconcile: false });
      const other = await secondHandle(engine, t.dir, t.store);
      const apis: Api[] = [];
      try {
        const admin = await t.api("admin");
        const e = await admin.call<{ claims: { token: string }[] }>("POST", "/v1/pools/p/ensure", { minReady: 2, maxReady: 2, compatibilityKey: "k", provider: "external" });
        for (const [i, c] of e.claims.entries()) {
          await admin.call("POST", "/v1/pools/p/machines", { claimToken: c.token, resourceId: `vm-${i}`, ssh: { host: "10.0.0.1", port: 22, user: "u" } });
        }
        const tok = await createToken(other, { org: "acme", role: "member", expiresAt: null, label: null }, Date.now(), (n) => randomBytes(n));
        const api = new Api(t.coord.url, tok.token);
        apis.push(api);
        type Borrowed = { borrowId: string; borrowToken: string };
        // Two borrows: the first reads the token committed, the second takes it from the cache.
        const b1 = await api.call<Borrowed>("POST", "/v1/pools/p/borrow", {});
        await api.call("POST", `/v1/borrows/${b1.borrowId}/return`, { token: b1.borrowToken });
        const b2 = await api.call<Borrowed>("POST", "/v1/pools/p/borrow", {});
        await api.call("POST", `/v1/borrows/${b2.borrowId}/heartbeat`, { token: b2.borrowToken });
        await revokeTokenWithGrants(other, tok.id, Date.now());
        const refused = (e: unknown) => e instanceof ApiError && e.status === 401 && /revoked/.test(e.message);
        await assert.rejects(api.call("POST", "/v1/pools/p/borrow", {}), refused);
        await assert.rejects(api.call("POST", `/v1/borrows/${b2.borrowId}/heartbeat`, { token: b2.borrowToken }), refused);
        await assert.rejects(api.call("POST", `/v1/borrows/${b2.borrowId}/return`, { token: b2.borrowToken }), refused);
        await assert.rejects(api.call("POST", `/v1/borrows/${b1.borrowId}/return`, { token: b1.borrowToken }), refused);
        await assert.rejects(api.call("POST", "/v1/pools/p/borrow", { borrowId: b2.borrowId, borrowToken: b2.borrowToken }), refused);
        // Nothing taken, nothing ended: the one live borrow is still active and one machine is still ready.
        const pool = await admin.call<{ states: Record<string, number> }>("GET", "/v1/pools/p");
        assert.deepEqual(pool.states, { ready: 1, busy: 1 });
        const shown = await admin.call<{ state: string }>("GET", `/v1/borrows/${b2.borrowId}`);
        assert.equal(shown.state, "active");
      } finally {
        await Promise.all(apis.map((a) => a.close()));
        await other.close();
        await t.close();
      }
    });

    test("a token the portable borrow cached, revoked elsewhere: borrow refused (and the ack), nothing taken or installed", async () => {
      const provider = new ScriptedExternalProvider();
      const t = await startTestCoordinator({ engine, reconcile: false, providers: [provider], config: { portable: true } });
      const other = await secondHandle(engine, t.dir, t.store);
      const apis: Api[] = [];
      try {
        const admin = await t.api("admin");
        const e = await admin.call<{ claims: { token: string }[] }>("POST", "/v1/pools/g/ensure", { minReady: 3, maxReady: 3, compatibilityKey: "k", access: "portable", provider: "external" });
        for (const [i, c] of e.claims.entries()) {
          await admin.call("POST", "/v1/pools/g/machines", { claimToken: c.token, resourceId: `vm-${i}`, ssh: { host: "10.0.0.1", port: 22, user: "u", hostKey: generateSshKeyPair("host").publicKey } });
        }
        const tok = await createToken(other, { org: "acme", role: "member", expiresAt: null, label: null }, Date.now(), (n) => randomBytes(n));
        const api = new Api(t.coord.url, tok.token);
        apis.push(api);
        type Grant = { borrowId: string; borrowToken: string; grantToken: string; state: string };
        const pair = generateSshKeyPair("client");
        const borrow = () => api.call<Grant>("POST", "/v1/pools/g/borrow", { access: "portable", publicKey: pair.publicKey });
        const ack = (g: Grant) => api.call<Grant>("POST", `/v1/borrows/${g.borrowId}/ack`, { token: g.borrowToken, grantToken: g.grantToken, publicKey: pair.publicKey });
        // The first request reads the token committed; from then on it comes from the cache.
        const g1 = await borrow();
        assert.equal((await ack(g1)).state, "active");
        await revokeTokenWithGrants(other, tok.id, Date.now());
        const refused = (e: unknown) => e instanceof ApiError && e.status === 401 && /revoked/.test(e.message);
        await assert.rejects(borrow(), refused);
        await assert.rejects(ack(g1), refused);
        // Nothing taken, nothing installed beyond the first grant's key.
        const pool = await admin.call<{ states: Record<string, number> }>("GET", "/v1/pools/g");
        assert.equal(pool.states.ready, 2, JSON.stringify(pool.states));
        assert.equal(provider.callsOf("install_key").length, 1);
        const grants = await t.store.transaction((tx) => tx.all<{ id: string }>("SELECT id FROM grants"));
        assert.deepEqual(grants.map((g) => g.id), [g1.borrowId]);
      } finally {
        await Promise.all(apis.map((a) => a.close()));
        await other.close();
        await t.close();
      }
    });
  });
}
