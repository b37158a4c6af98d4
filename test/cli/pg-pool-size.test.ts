/**
 * BERTH_PG_POOL_SIZE sets the connections each coordinator keeps to
 * PostgreSQL; a value that is not a whole number from 1 to 1000 stops
 * `berth serve` before it connects, with a stable code, and nothing is
 * created in the state directory's database.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { BIN } from "../helpers/cluster.js";
import { tempDir } from "../helpers/env.js";
import { pgPoolSize } from "../../src/cli/common.js";

test("pool size: unset keeps the default, whole numbers 1–1000 are taken", () => {
  assert.equal(pgPoolSize(undefined), undefined);
  assert.equal(pgPoolSize(""), undefined);
  assert.equal(pgPoolSize("1"), 1);
  assert.equal(pgPoolSize("6"), 6);
  assert.equal(pgPoolSize("1000"), 1000);
});

test("a bad BERTH_PG_POOL_SIZE refuses `berth serve` with invalid_request before any connection", () => {
  const d = tempDir("berth-pgpool-");
  try {
    for (const bad of ["0", "-3", "2.5", "lots", "1001"]) {
      // Port 9 (discard) on loopback: a connection attempt would fail differently.
      const r = spawnSync(process.execPath, [BIN, "serve", "--state-dir", d.path, "--listen", "127.0.0.1:0"], {
        env: { ...process.env, BERTH_PG_URL: "postgres://u:p@127.0.0.1:9/none", BERTH_PG_POOL_SIZE: bad },
        encoding: "utf8",
        timeout: 30_000,
      });
      assert.notEqual(r.status, 0, `BERTH_PG_POOL_SIZE=${bad} was accepted`);
      assert.match(r.stderr, /invalid_request: BERTH_PG_POOL_SIZE must be a whole number from 1 to 1000/);
      assert.doesNotMatch(r.stderr, /ECONNREFUSED/);
    }
    assert.equal(existsSync(join(d.path, "berth.db")), false);
  } finally {
    d.cleanup();
  }
});
