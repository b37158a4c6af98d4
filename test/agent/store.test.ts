/**
 * The agent store's lock, with real `bin/berth agent` processes: one agent per
 * state directory; the lock goes with its holder, even one SIGKILLed.
 */
import { strict as assert } from "node:assert";
import { join } from "node:path";
import { after, describe, it } from "node:test";
import Database from "better-sqlite3";
import { AGENT_MIGRATIONS, AgentLockedError, AgentStore, STORE_FILE } from "../../src/agent/store/store.js";
import { argsHashOf } from "../../src/protocol/operations.js";
import { AgentHarness } from "../helpers/agent.js";

const harness = new AgentHarness("berth-store-");
after(() => harness.close());
const tempDir = (): string => harness.dir();
const spawnAgent = (stateDir: string) => harness.spawnAgent({ stateDir });

describe("agent store lock", () => {
  it("a second agent process on the same state directory refuses to start; the lock is free once the holder is gone", async () => {
    const dir = join(tempDir(), "state");
    const first = spawnAgent(dir);
    await first.ready;

    const second = spawnAgent(dir);
    const refused = await second.exit;
    assert.equal(refused.code, 3, refused.stderr);
    assert.ok(
      refused.stderr.includes(`agent_locked: another berth agent holds ${dir}`),
      `stderr says why: ${refused.stderr}`,
    );
    assert.equal(first.child.exitCode, null, "the holder keeps running");

    // A SIGKILLed holder leaves no stale lock (the kernel drops its locks).
    first.child.kill("SIGKILL");
    await first.exit;
    const third = spawnAgent(dir);
    await third.ready;
    third.child.kill("SIGTERM");
    const stopped = await third.exit;
    assert.equal(stopped.code, 0, stopped.stderr);
  });

  it("refuses a second open in the same process, and applies a versioned migration once", () => {
    const dir = tempDir();
    // Not idempotent on purpose: a second run would fail (table exists) and lose the row.
    const extra = [{ version: 100, name: "test extra table", sql: "CREATE TABLE extra (x INTEGER)" }];
    const store = AgentStore.open(dir, { migrations: extra });
    assert.throws(() => AgentStore.open(dir), (e: unknown) => e instanceof AgentLockedError && e.code === "agent_locked");
    store.db.prepare("INSERT INTO extra (x) VALUES (1)").run();
    store.close();
    const again = AgentStore.open(dir, { migrations: extra });
    assert.deepEqual((again.db.prepare("SELECT version FROM schema_version ORDER BY version").all() as Array<{ version: number }>).map((r) => r.version), [...AGENT_MIGRATIONS.map((m) => m.version), 100]);
    assert.equal((again.db.prepare("SELECT count(*) AS n FROM extra").get() as { n: number }).n, 1);
    assert.equal(again.db.pragma("journal_mode", { simple: true }), "wal");
    assert.equal(again.db.pragma("synchronous", { simple: true }), 2, "synchronous=FULL");
    again.close();
  });

  it("adopts a store written by the named-migration scheme, and renames its create operations to provision", () => {
    const dir = tempDir();
    // The layout an agent of the previous scheme left: schema_migrations, and an operation named "create".
    const old = new Database(join(dir, STORE_FILE));
    old.exec(AGENT_MIGRATIONS[0]!.sql);
    old.exec("CREATE TABLE schema_migrations (name TEXT PRIMARY KEY, applied_at INTEGER NOT NULL)");
    old.prepare("INSERT INTO schema_migrations (name, applied_at) VALUES ('001_agent_core', 1)").run();
    const oldHash = "6b228eebf130f0dd893b785e74aa5454bc30d4b89a1d84cd8cd639264296806e"; // sha256 of {"kind":"create"}, as that agent kept it
    old.prepare("INSERT INTO operations (op_id, kind, machine_id, generation, args_hash, status, result, created_at) VALUES ('op_old', 'create', 'm_old', 0, ?, 'done', '{}', 1)").run(oldHash);
    old.close();
    const store = AgentStore.open(dir);
    try {
      const versions = (store.db.prepare("SELECT version FROM schema_version ORDER BY version").all() as Array<{ version: number }>).map((r) => r.version);
      assert.deepEqual(versions, AGENT_MIGRATIONS.map((m) => m.version));
      assert.equal(store.db.prepare("SELECT name FROM sqlite_master WHERE name = 'schema_migrations'").get(), undefined);
      const op = store.operations.get("op_old");
      assert.equal(op?.kind, "provision");
      // A retry of the same op id under the new word is answered from the record, not refused as other arguments.
      assert.equal(op?.argsHash, argsHashOf("provision", undefined));
    } finally {
      store.close();
    }
  });
});
