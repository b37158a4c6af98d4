/**
 * Every database file and its WAL/SHM is owner-only (0600), whatever the
 * umask and whatever the directory's own mode: a real `berth serve` and a
 * real `berth agent`, started with umask 000 in state directories created
 * 0777 beforehand, then stores of an older run whose files were left 0644.
 */
import { after, describe, it } from "node:test";
import assert from "node:assert/strict";
import { chmodSync, existsSync, mkdirSync, statSync } from "node:fs";
import { join } from "node:path";
import { Fleet } from "../helpers/identity-fleet.js";
import { SqliteStore } from "../../src/store/sqlite/sqlite-store.js";
import { AgentStore } from "../../src/agent/store/store.js";
import { tempDir } from "../helpers/env.js";

const mode = (p: string) => (statSync(p).mode & 0o777).toString(8);

describe("database files are 0600 (umask 000, a directory created 0777 beforehand)", () => {
  const saved = process.umask(0o000); // inherited by every process this test starts
  const f = new Fleet();
  after(async () => {
    await f.close();
    process.umask(saved);
  });

  it("berth serve: berth.db, berth.db-wal, berth.db-shm and the secret; berth agent: agent.db and agent.db-wal", { timeout: 120_000 }, async () => {
    mkdirSync(f.coordDir, { mode: 0o777 });
    chmodSync(f.coordDir, 0o777);
    const agentDir = join(f.dir.path, "agent-m");
    mkdirSync(agentDir, { mode: 0o777 });
    await f.start();
    await f.startAgent("m", { slots: 1 });
    await f.waitFor("active", async () => (await f.host("m")).identity.state === "active");
    // A write through the API so the WAL holds something.
    await f.api.call("POST", "/v1/pools/p/ensure", { minReady: 1, maxReady: 1, compatibilityKey: "fm", provider: "hosts" });
    await f.waitFor("a ready machine", async () => (await f.api.call<{ counts: { ready: number } }>("GET", "/v1/pools/p")).counts.ready === 1);
    assert.equal(mode(f.coordDir), "777", "the directory was left as the operator made it (the test's premise)");
    const files = [
      join(f.coordDir, "berth.db"),
      join(f.coordDir, "berth.db-wal"),
      join(f.coordDir, "berth.db-shm"),
      join(f.coordDir, "coordinator.secret"),
      join(agentDir, "agent.db"),
      join(agentDir, "agent.db-wal"),
    ];
    for (const p of files) {
      assert.ok(existsSync(p), `${p} exists`);
      assert.equal(mode(p), "600", p);
    }
  });

  it("files of an older run left 0644 are made 0600 when the store opens", async () => {
    const d = tempDir("berth-modes-");
    try {
      const s = new SqliteStore({ path: join(d.path, "old.db") });
      s.db.exec("CREATE TABLE IF NOT EXISTS t (x)"); // the WAL exists while the store is open
      for (const p of ["old.db", "old.db-wal", "old.db-shm"]) chmodSync(join(d.path, p), 0o644);
      const again = new SqliteStore({ path: join(d.path, "old.db") });
      for (const p of ["old.db", "old.db-wal", "old.db-shm"]) assert.equal(mode(join(d.path, p)), "600", p);
      await again.close();
      await s.close();

      const agentDir = join(d.path, "agent");
      const a = AgentStore.open(agentDir);
      a.meta.set("x", "1");
      a.close();
      chmodSync(join(agentDir, "agent.db"), 0o644);
      const b = AgentStore.open(agentDir);
      b.meta.set("x", "2");
      assert.equal(mode(join(agentDir, "agent.db")), "600");
      assert.equal(mode(join(agentDir, "agent.db-wal")), "600");
      b.close();
    } finally {
      d.cleanup();
    }
  });
});
