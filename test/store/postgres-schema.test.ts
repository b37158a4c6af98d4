/**
 * A PostgreSQL store's schema is part of each connection before any
 * statement runs on it (the `search_path` startup parameter): every pooled
 * connection is in the schema from its first statement, without the
 * un-awaited `SET` that pg warns about, and a schema that cannot be set up
 * leaves the store unopened with nothing written to the default schema.
 */
import { test, describe } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import pg from "pg";
import { PostgresStore } from "../../src/store/postgres/postgres-store.js";
import { PG_SKIP, PG_URL } from "../helpers/env.js";

describe("PostgreSQL store schema", { skip: PG_SKIP }, () => {
  test("every pooled connection is in the schema from its first statement, and pg prints no deprecation warning", async () => {
    const warnings: string[] = [];
    const onWarning = (w: Error) => warnings.push(`${w.name}: ${w.message}`);
    process.on("warning", onWarning);
    const schema = "t_" + randomBytes(6).toString("hex");
    const poolSize = 8;
    const store = await PostgresStore.open({ connectionString: PG_URL!, schema, poolSize });
    try {
      // poolSize transactions at once: each runs on its own connection, most of them new.
      let arrived = 0;
      let release!: () => void;
      const all = new Promise<void>((r) => (release = r));
      const seen = await Promise.all(
        Array.from({ length: poolSize }, () =>
          store.transaction(async (tx) => {
            // source "client": set as a startup parameter of the connection, not by a SET statement on it.
            const r = await tx.get<{ s: string; pid: number; source: string }>(
              "SELECT current_schema() AS s, pg_backend_pid() AS pid, (SELECT source FROM pg_settings WHERE name = 'search_path') AS source",
            );
            if (++arrived === poolSize) release();
            await all;
            return r!;
          }),
        ),
      );
      assert.equal(new Set(seen.map((r) => r.pid)).size, poolSize, "one connection per transaction");
      for (const r of seen) assert.deepEqual({ schema: r.s, source: r.source }, { schema, source: "client" });
      const committed = await store.readCommitted<{ s: string }>("SELECT current_schema() AS s");
      assert.equal(committed?.s, schema);
      await new Promise((r) => setImmediate(r)); // warnings are emitted on the next tick
      assert.deepEqual(warnings.filter((w) => w.startsWith("DeprecationWarning")), []);
    } finally {
      process.off("warning", onWarning);
      await store.pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
      await store.close();
    }
  });

  test("a schema that cannot be set up: open fails, and no statement ran in the role's default schema", async () => {
    const admin = new pg.Client({ connectionString: PG_URL! });
    await admin.connect();
    // A role whose default schema ("$user", first on its search_path) is its own and
    // writable, so a statement that ran outside the requested schema would land there.
    const role = "t_role_" + randomBytes(5).toString("hex");
    const password = randomBytes(12).toString("hex");
    const noUsage = "t_" + randomBytes(6).toString("hex");
    await admin.query(`CREATE ROLE ${role} LOGIN PASSWORD '${password}'`);
    await admin.query(`CREATE SCHEMA ${role} AUTHORIZATION ${role}`);
    await admin.query(`CREATE SCHEMA ${noUsage}`); // exists, but the role may not use it
    try {
      const url = new URL(PG_URL!);
      url.username = role;
      url.password = password;
      const cases = [
        { schema: "t_" + randomBytes(6).toString("hex"), why: /permission denied/ }, // the role may not create schemas
        { schema: noUsage, why: /no schema has been selected/ },
      ];
      for (const c of cases) {
        // The second case gets past CREATE SCHEMA (which needs this) to the schema it may not use.
        if (c.schema === noUsage) await admin.query(`GRANT CREATE ON DATABASE "${url.pathname.slice(1)}" TO ${role}`);
        await assert.rejects(PostgresStore.open({ connectionString: url.toString(), schema: c.schema }), (e: Error) => {
          assert.match(e.message, new RegExp(`schema "${c.schema}" could not be set up`));
          assert.match(e.message, c.why);
          return true;
        });
      }
      const own = await admin.query("SELECT table_name FROM information_schema.tables WHERE table_schema = $1", [role]);
      assert.deepEqual(own.rows, []);
      const elsewhere = await admin.query("SELECT schemaname, tablename FROM pg_tables WHERE tableowner = $1", [role]);
      assert.deepEqual(elsewhere.rows, []);
    } finally {
      await admin.query(`DROP SCHEMA IF EXISTS ${noUsage} CASCADE`);
      await admin.query(`DROP SCHEMA IF EXISTS ${role} CASCADE`);
      await admin.query(`DROP OWNED BY ${role}`).catch(() => undefined);
      await admin.query(`DROP ROLE IF EXISTS ${role}`);
      await admin.end();
    }
  });
});
