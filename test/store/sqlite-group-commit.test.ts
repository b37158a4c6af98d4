/**
 * SQLite group commit: transactions queued together share one COMMIT, each
 * in its own savepoint. A body that throws leaves nothing and harms no
 * neighbour; later bodies see earlier ones' writes (queue order); and no
 * transaction resolves before its writes are committed, as seen from a
 * second connection on the same file.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { join } from "node:path";
import Database from "better-sqlite3";
import { SqliteStore } from "../../src/store/sqlite/sqlite-store.js";
import { tempDir } from "../helpers/env.js";

function setup() {
  const dir = tempDir();
  const path = join(dir.path, "berth.db");
  const store = new SqliteStore({ path });
  return {
    store,
    path,
    async cleanup() {
      await store.close();
      dir.cleanup();
    },
  };
}

const insert = (id: string) => "INSERT INTO due (kind, ref, due_at) VALUES ('fill', '" + id + "', 1)";
const refs = async (store: SqliteStore) => (await store.transaction((tx) => tx.all<{ ref: string }>("SELECT ref FROM due WHERE kind = 'fill' ORDER BY ref"))).map((r) => r.ref);

test("a body that throws in a group is rolled back alone; the others commit", async () => {
  const s = setup();
  try {
    const boom = new Error("boom");
    // Started in one tick, so they run as one group.
    const results = await Promise.allSettled([
      s.store.transaction(async (tx) => tx.run(insert("a"))),
      s.store.transaction(async (tx) => {
        await tx.run(insert("b"));
        throw boom;
      }),
      s.store.transaction(async (tx) => tx.run(insert("c"))),
    ]);
    assert.deepEqual(results.map((r) => r.status), ["fulfilled", "rejected", "fulfilled"]);
    assert.equal((results[1] as PromiseRejectedResult).reason, boom);
    assert.deepEqual(await refs(s.store), ["a", "c"]);
  } finally {
    await s.cleanup();
  }
});

test("a later body of a group sees the writes of an earlier one (queue order)", async () => {
  const s = setup();
  try {
    const [, seen] = await Promise.all([
      s.store.transaction(async (tx) => tx.run(insert("first"))),
      s.store.transaction(async (tx) => (await tx.all<{ ref: string }>("SELECT ref FROM due WHERE kind = 'fill'")).map((r) => r.ref)),
    ]);
    assert.deepEqual(seen, ["first"]);
  } finally {
    await s.cleanup();
  }
});

test("each transaction of a group resolves only once its writes are visible to another connection", async () => {
  const s = setup();
  const other = new Database(s.path, { readonly: true });
  try {
    const visible: boolean[] = [];
    const look = (ref: string) => () => {
      visible.push(other.prepare("SELECT 1 FROM due WHERE kind = 'fill' AND ref = ?").get(ref) !== undefined);
    };
    await Promise.all(
      ["x", "y", "z"].map((ref) => s.store.transaction(async (tx) => tx.run(insert(ref))).then(look(ref))),
    );
    assert.deepEqual(visible, [true, true, true]);
  } finally {
    other.close();
    await s.cleanup();
  }
});
