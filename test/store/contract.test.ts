/**
 * The store contract: one suite, run against SQLite (a real file) and
 * PostgreSQL (a fresh schema; skipped with the reason when
 * BERTH_TEST_PG_URL is unset). Whatever the coordinator relies on from
 * `Store` is stated here once and must hold on both engines.
 */
import { test, describe } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { join } from "node:path";
import Database from "better-sqlite3";
import { SqliteStore } from "../../src/store/sqlite/sqlite-store.js";
import { PostgresStore } from "../../src/store/postgres/postgres-store.js";
import { MIGRATIONS } from "../../src/store/migrations.js";
import { clearDue, setDue, setDueNoLater } from "../../src/store/due.js";
import type { Store, Tx } from "../../src/store/store.js";
import { BerthError } from "../../src/core/errors.js";
import { PG_SKIP, PG_URL, tempDir, type Engine } from "../helpers/env.js";

/** A store on a fresh file or schema, reopenable on the same one. */
interface Fixture {
  store: Store;
  reopen(): Promise<Store>;
  cleanup(): Promise<void>;
}

async function fixture(engine: Engine, sqliteOpts: { busyTimeoutMs?: number } = {}): Promise<Fixture> {
  const dir = tempDir();
  const opened: Store[] = [];
  if (engine === "sqlite") {
    const open = async () => {
      const s = new SqliteStore({ path: join(dir.path, "berth.db"), ...sqliteOpts });
      opened.push(s);
      return s;
    };
    const store = await open();
    return {
      store,
      reopen: open,
      async cleanup() {
        for (const s of opened) await s.close().catch(() => undefined);
        dir.cleanup();
      },
    };
  }
  const schema = "t_" + randomBytes(6).toString("hex");
  const open = async () => {
    const s = await PostgresStore.open({ connectionString: PG_URL!, schema });
    opened.push(s);
    return s;
  };
  const store = await open();
  return {
    store,
    reopen: open,
    async cleanup() {
      await (store as PostgresStore).pool.query(`DROP SCHEMA "${schema}" CASCADE`);
      for (const s of opened) await s.close().catch(() => undefined);
      dir.cleanup();
    },
  };
}

function machineRow(id: string, resourceId: string, state: string): (string | number | null)[] {
  return [id, "acme", "ci", "keeper", "external", resourceId, null, state, 0, null, null, null, null, null, null, null, 1, 1, null, 2, null];
}

const INSERT_MACHINE =
  "INSERT INTO machines (id, org, pool, access, provider, resource_id, host_id, state, generation, incarnation, ssh_host, ssh_port, ssh_user, host_key, claim_id, lent_to, created_at, state_since, ready_since, hard_expires_at, reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";

async function dueRows(store: Store): Promise<Array<{ kind: string; ref: string; due_at: number }>> {
  return store.transaction((tx) => tx.all("SELECT kind, ref, due_at FROM due ORDER BY kind, ref"));
}

/** A latch one transaction waits on while the test arranges the other. */
function latch(): { wait: Promise<void>; open(): void } {
  let open!: () => void;
  const wait = new Promise<void>((r) => (open = r));
  return { wait, open };
}

for (const engine of ["sqlite", "postgres"] as Engine[]) {
  describe(`store contract on ${engine}`, { skip: engine === "postgres" ? PG_SKIP : false }, () => {
    test("a committed transaction is visible afterwards; a throw inside fn leaves nothing and reaches the caller unchanged", async () => {
      const f = await fixture(engine);
      try {
        const { store } = f;
        await store.transaction(async (tx) => {
          await tx.run(INSERT_MACHINE, machineRow("m_1", "vm-1", "ready"));
          await setDue(tx, "ttl", "m_1", 100);
        });
        const boom = new BerthError("conflict", "conflict: thrown on purpose");
        let ranAfterCommit = false;
        await assert.rejects(
          store.transaction(async (tx) => {
            await tx.run(INSERT_MACHINE, machineRow("m_2", "vm-2", "ready"));
            await tx.run("UPDATE machines SET state = 'busy' WHERE id = 'm_1'");
            await setDue(tx, "ttl", "m_2", 100);
            tx.afterCommit(() => (ranAfterCommit = true));
            throw boom;
          }),
          (e) => e === boom,
        );
        assert.equal(ranAfterCommit, false, "after-commit work of a rolled-back transaction must not run");
        const machines = await store.transaction((tx) => tx.all<{ id: string; state: string }>("SELECT id, state FROM machines ORDER BY id"));
        assert.deepEqual(machines, [{ id: "m_1", state: "ready" }]);
        assert.deepEqual(await dueRows(store), [{ kind: "ttl", ref: "m_1", due_at: 100 }]);
        // The store is still usable after a rollback.
        let committed = 0;
        await store.transaction(async (tx) => {
          await tx.run("UPDATE machines SET state = 'busy' WHERE id = 'm_1'");
          tx.afterCommit(() => committed++);
        });
        assert.equal(committed, 1);
        assert.equal((await store.transaction((tx) => tx.get<{ state: string }>("SELECT state FROM machines WHERE id = 'm_1'")))!.state, "busy");
      } finally {
        await f.cleanup();
      }
    });

    test("migrations are idempotent: opening the same database again keeps data and applies nothing twice", async () => {
      const f = await fixture(engine);
      try {
        await f.store.transaction((tx) => tx.run(INSERT_MACHINE, machineRow("m_1", "vm-1", "ready")));
        // Two more opens, concurrently (the PostgreSQL migrator takes an advisory lock).
        const [a, b] = await Promise.all([f.reopen(), f.reopen()]);
        for (const s of [a, b]) {
          const versions = await s.transaction((tx) => tx.all<{ version: number }>("SELECT version FROM schema_version ORDER BY version"));
          assert.deepEqual(versions.map((v) => v.version), MIGRATIONS.map((m) => m.version));
          const n = await s.transaction((tx) => tx.get<{ n: number }>("SELECT COUNT(*) AS n FROM machines"));
          assert.equal(n!.n, 1);
        }
      } finally {
        await f.cleanup();
      }
    });

    test("? placeholders bind in order, and a '?' inside a value is data, not a placeholder", async () => {
      const f = await fixture(engine);
      try {
        const tricky = "what? it's a 'quote' ? and $1";
        await f.store.transaction((tx) =>
          tx.run("INSERT INTO audit (at, machine_id, subject, event, from_state, to_state, generation, actor) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", [7, "m_1", tricky, "e", null, "ready", 3, "a?b"]),
        );
        const row = await f.store.transaction((tx) =>
          tx.get<{ subject: string; actor: string; generation: number; from_state: null }>("SELECT subject, actor, generation, from_state FROM audit WHERE machine_id = ? AND generation = ? AND actor = ?", ["m_1", 3, "a?b"]),
        );
        assert.deepEqual({ ...row }, { subject: tricky, actor: "a?b", generation: 3, from_state: null });
      } finally {
        await f.cleanup();
      }
    });

    test("BIGINT epoch milliseconds and COUNT(*) come back as JavaScript numbers", async () => {
      const f = await fixture(engine);
      try {
        const big = Date.UTC(2200, 0, 1) + 123; // well past 2^32, inside 2^53
        await f.store.transaction((tx) => setDue(tx, "ttl", "m_big", big));
        const row = await f.store.transaction((tx) => tx.get<{ due_at: unknown; n: unknown }>("SELECT due_at, (SELECT COUNT(*) FROM due) AS n FROM due WHERE ref = ?", ["m_big"]));
        assert.equal(typeof row!.due_at, "number");
        assert.equal(row!.due_at, big);
        assert.equal(typeof row!.n, "number");
        assert.equal(row!.n, 1);
        const safe = Number.MAX_SAFE_INTEGER;
        await f.store.transaction((tx) => setDue(tx, "ttl", "m_max", safe));
        const max = await f.store.transaction((tx) => tx.get<{ due_at: unknown }>("SELECT due_at FROM due WHERE ref = ?", ["m_max"]));
        assert.equal(max!.due_at, safe);
      } finally {
        await f.cleanup();
      }
    });

    test("the partial unique index refuses a second live machine for one resource, and allows it once the first is destroyed", async () => {
      const f = await fixture(engine);
      try {
        await f.store.transaction((tx) => tx.run(INSERT_MACHINE, machineRow("m_1", "vm-1", "ready")));
        await assert.rejects(
          f.store.transaction((tx) => tx.run(INSERT_MACHINE, machineRow("m_2", "vm-1", "quarantined"))),
          (e: { code?: string }) => /UNIQUE|23505/.test(String(e.code)) || /unique/i.test(String(e)),
        );
        await f.store.transaction((tx) => tx.run("UPDATE machines SET state = 'destroyed' WHERE id = 'm_1'"));
        await f.store.transaction((tx) => tx.run(INSERT_MACHINE, machineRow("m_2", "vm-1", "ready")));
        // A second destroyed record of the same resource is fine too (history is kept until pruned).
        await f.store.transaction((tx) => tx.run(INSERT_MACHINE, machineRow("m_3", "vm-1", "destroyed")));
        const n = await f.store.transaction((tx) => tx.get<{ n: number }>("SELECT COUNT(*) AS n FROM machines WHERE resource_id = 'vm-1' AND state <> 'destroyed'"));
        assert.equal(n!.n, 1);
      } finally {
        await f.cleanup();
      }
    });

    test("held writes: read back inside the transaction, all committed together; an unmet row count or a failing write leaves nothing", async () => {
      const f = await fixture(engine);
      try {
        const s = f.store;
        const audit = (tx: Tx, subject: string) =>
          tx.write("INSERT INTO audit (at, machine_id, subject, event, from_state, to_state, generation, actor) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", [1, "m_1", subject, "e", "a", "b", 0, "test"]);
        const seen = await s.transaction(async (tx) => {
          await setDue(tx, "claim", "c_1", 1_000);
          await audit(tx, "first");
          await clearDue(tx, "claim", "c_1"); // a second write to one table: sent after the first
          await setDue(tx, "claim", "c_2", 2_000);
          await tx.write("DELETE FROM audit WHERE subject = ?", ["nothing"], { expect: { rows: 0, error: () => new Error("unreachable") } });
          return { due: await tx.all<{ ref: string }>("SELECT ref FROM due ORDER BY ref"), audit: await tx.all("SELECT subject FROM audit") };
        });
        assert.deepEqual(seen, { due: [{ ref: "c_2" }], audit: [{ subject: "first" }] });
        assert.deepEqual((await dueRows(s)).map((r) => r.ref), ["c_2"]);

        // A row count that is not the expected one fails the whole transaction with the given error,
        // including writes sent before it and writes held with it.
        await assert.rejects(
          s.transaction(async (tx) => {
            await setDue(tx, "claim", "c_3", 3_000);
            await tx.get("SELECT 1 AS one"); // sends c_3
            await audit(tx, "second");
            await tx.write("UPDATE due SET due_at = ? WHERE kind = ? AND ref = ?", [1, "claim", "c_missing"], { expect: { rows: 1, error: () => new BerthError("conflict", "conflict: row gone") } });
            await setDue(tx, "claim", "c_4", 4_000);
          }),
          (e: unknown) => e instanceof BerthError && e.code === "conflict",
        );
        // A held write the database refuses (primary key) fails it too.
        await assert.rejects(
          s.transaction(async (tx) => {
            await audit(tx, "third");
            await tx.write("INSERT INTO due (kind, ref, due_at) VALUES (?, ?, ?)", ["claim", "c_2", 9]);
          }),
        );
        assert.deepEqual((await dueRows(s)).map((r) => r.ref), ["c_2"]);
        assert.deepEqual(await s.transaction((tx) => tx.all("SELECT subject FROM audit")), [{ subject: "first" }]);

        // Only plain writes are taken, on both engines.
        for (const bad of ["SELECT 1", "UPDATE due SET due_at = 1 RETURNING ref", "DELETE FROM due; DELETE FROM audit;"]) {
          await assert.rejects(s.transaction((tx) => tx.write(bad)), /Tx.write takes one INSERT, UPDATE or DELETE/);
        }
      } finally {
        await f.cleanup();
      }
    });

    test("due-index upserts: setDue moves a row, setDueNoLater only brings it earlier, clearDue removes it", async () => {
      const f = await fixture(engine);
      try {
        const s = f.store;
        await s.transaction(async (tx) => {
          await setDue(tx, "heartbeat", "b_1", 1_000);
          await setDue(tx, "heartbeat", "b_1", 5_000); // later: moved
          await setDueNoLater(tx, "fill", "acme:ci", 3_000); // absent: inserted
          await setDueNoLater(tx, "fill", "acme:ci", 9_000); // later: ignored
          await setDueNoLater(tx, "fill", "acme:ci", 2_000); // earlier: taken
          await setDue(tx, "claim", "c_1", 4_000);
        });
        assert.deepEqual(await dueRows(s), [
          { kind: "claim", ref: "c_1", due_at: 4_000 },
          { kind: "fill", ref: "acme:ci", due_at: 2_000 },
          { kind: "heartbeat", ref: "b_1", due_at: 5_000 },
        ]);
        await s.transaction(async (tx) => {
          await setDue(tx, "heartbeat", "b_1", 500); // setDue may also move earlier
          await clearDue(tx, "claim", "c_1");
          await clearDue(tx, "claim", "c_missing"); // clearing nothing is fine
        });
        assert.deepEqual(await dueRows(s), [
          { kind: "fill", ref: "acme:ci", due_at: 2_000 },
          { kind: "heartbeat", ref: "b_1", due_at: 500 },
        ]);
      } finally {
        await f.cleanup();
      }
    });

    if (engine === "sqlite") {
      test("a write lock held by another connection is retried until it is released", async () => {
        const f = await fixture("sqlite", { busyTimeoutMs: 20 });
        const other = new Database(join((f.store as SqliteStore).db.name));
        try {
          other.pragma("busy_timeout = 0");
          other.exec("BEGIN IMMEDIATE");
          other.prepare("INSERT INTO due (kind, ref, due_at) VALUES ('fill', 'other', 1)").run();
          const retriesBefore = f.store.stats.retries;
          let bodyRuns = 0;
          const pending = f.store.transaction(async (tx) => {
            bodyRuns++;
            // Sees the other connection's committed row: this body ran only after it let go.
            const seen = await tx.get<{ n: number }>("SELECT COUNT(*) AS n FROM due WHERE ref = 'other'");
            await setDue(tx, "fill", "mine", 2);
            return seen!.n;
          });
          // Let the store hit the lock and back off at least once before releasing it.
          while (f.store.stats.retries === retriesBefore) await new Promise((r) => setTimeout(r, 5));
          other.exec("COMMIT");
          assert.equal(await pending, 1);
          assert.equal(bodyRuns, 1);
          assert.ok(f.store.stats.retries > retriesBefore);
          assert.deepEqual((await dueRows(f.store)).map((r) => r.ref), ["mine", "other"]);
        } finally {
          if (other.inTransaction) other.exec("ROLLBACK");
          other.close();
          await f.cleanup();
        }
      });

      test("a lock that is never released ends in store_busy after bounded retries, with nothing written", async () => {
        const f = await fixture("sqlite", { busyTimeoutMs: 5 });
        const other = new Database(join((f.store as SqliteStore).db.name));
        try {
          other.exec("BEGIN IMMEDIATE");
          await assert.rejects(
            f.store.transaction((tx) => setDue(tx, "fill", "mine", 2)),
            (e) => e instanceof BerthError && e.code === "store_busy" && e.status === 503,
          );
          other.exec("ROLLBACK");
          assert.deepEqual(await dueRows(f.store), []);
        } finally {
          if (other.inTransaction) other.exec("ROLLBACK");
          other.close();
          await f.cleanup();
        }
      });

      test("transactions of one store never interleave (the in-process queue serializes writers)", async () => {
        const f = await fixture("sqlite");
        try {
          const order: string[] = [];
          const hold = latch();
          const a = f.store.transaction(async (tx) => {
            order.push("a:start");
            await hold.wait;
            await setDue(tx, "fill", "a", 1);
            order.push("a:end");
          });
          const b = f.store.transaction(async (tx) => {
            order.push("b:start");
            await setDue(tx, "fill", "b", 1);
            order.push("b:end");
          });
          await new Promise((r) => setTimeout(r, 20));
          assert.deepEqual(order, ["a:start"], "b must not start while a is open");
          hold.open();
          await Promise.all([a, b]);
          assert.deepEqual(order, ["a:start", "a:end", "b:start", "b:end"]);
        } finally {
          await f.cleanup();
        }
      });
    }

    if (engine === "postgres") {
      test("a deadlock between two transactions is retried: both finish, each body's writes applied exactly once", async () => {
        const f = await fixture("postgres");
        try {
          const s = f.store;
          await s.transaction(async (tx) => {
            await setDue(tx, "fill", "r1", 0);
            await setDue(tx, "fill", "r2", 0);
          });
          const bothLocked = { n: 0, latch: latch() };
          const runs = { a: 0, b: 0 };
          // Each increments both rows, in opposite orders; on the first attempt
          // each waits until the other holds its first row, so one of them must
          // be chosen as the deadlock victim, rolled back and re-run.
          const body = (first: string, second: string, who: "a" | "b") => async (tx: Tx) => {
            runs[who]++;
            await tx.run("UPDATE due SET due_at = due_at + 1 WHERE ref = ?", [first]);
            if (runs[who] === 1) {
              if (++bothLocked.n === 2) bothLocked.latch.open();
              await bothLocked.latch.wait;
            }
            await tx.run("UPDATE due SET due_at = due_at + 1 WHERE ref = ?", [second]);
          };
          const retriesBefore = s.stats.retries;
          await Promise.all([s.transaction(body("r1", "r2", "a")), s.transaction(body("r2", "r1", "b"))]);
          assert.ok(s.stats.retries > retriesBefore, "one transaction was retried");
          assert.equal(runs.a + runs.b, 3, "exactly one body ran twice");
          // Two bodies, each adding 1 to both rows: a rolled-back attempt left nothing behind.
          assert.deepEqual((await dueRows(s)).map((r) => [r.ref, r.due_at]), [["r1", 2], ["r2", 2]]);
        } finally {
          await f.cleanup();
        }
      });

      test("SKIP LOCKED: two concurrent transactions take different due rows", async () => {
        const f = await fixture("postgres");
        try {
          const s = f.store;
          await s.transaction(async (tx) => {
            await setDue(tx, "heartbeat", "b_1", 10);
            await setDue(tx, "heartbeat", "b_2", 20);
            await setDue(tx, "heartbeat", "b_3", 30);
          });
          // The reconciler's own query.
          const take = (tx: Tx) => tx.get<{ ref: string }>(`SELECT kind, ref, due_at FROM due WHERE due_at <= ? ORDER BY due_at, kind, ref LIMIT 1${tx.skipLocked}`, [100]);
          const aHolds = latch();
          const release = latch();
          const a = s.transaction(async (tx) => {
            const row = await take(tx);
            aHolds.open();
            await release.wait;
            await clearDue(tx, "heartbeat", row!.ref);
            return row!.ref;
          });
          await aHolds.wait;
          const b = await s.transaction(async (tx) => {
            const row = await take(tx);
            await clearDue(tx, "heartbeat", row!.ref);
            return row!.ref;
          });
          release.open();
          assert.equal(await a, "b_1");
          assert.equal(b, "b_2", "the second transaction skipped the row the first holds");
          assert.deepEqual((await dueRows(s)).map((r) => r.ref), ["b_3"]);
        } finally {
          await f.cleanup();
        }
      });
    }
  });
}
