/**
 * API-token checks read committed state outside the transaction queue. A
 * token revoked through another handle on the same database (as `berth
 * token revoke` does, from its own process) is refused on the coordinator's
 * very next request, on SQLite and PostgreSQL; a token created that way is
 * accepted at once.
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
  });
}
