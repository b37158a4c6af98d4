/**
 * A borrow's fill wake-up on PostgreSQL (requestFillCheck) against the
 * reconciler's fill visit, which deletes the pool's `fill` due row before it
 * counts capacity:
 * - borrows that find a check pending share the row (KEY SHARE): a second
 *   borrow does not wait for the first, and neither writes the row;
 * - the reconciler's delete waits until those borrows commit, so the count it
 *   takes next includes their machines;
 * - a borrow that comes while the reconciler holds the deleted row waits for
 *   it and then writes the row anew: no borrow's wake-up is lost.
 */
import { test, describe } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { PostgresStore } from "../../src/store/postgres/postgres-store.js";
import { clearDue, requestFillCheck } from "../../src/store/due.js";
import type { Tx } from "../../src/store/store.js";
import { PG_SKIP, PG_URL } from "../helpers/env.js";

const REF = "acme:ci";
const opened: Array<{ finish(): void; done: Promise<void> }> = [];

/** A transaction held open until `finish()`: `pid` is its backend, `ran` resolves once `body` has run in it. */
function open(store: PostgresStore, body: (tx: Tx) => Promise<void>): { pid: Promise<number>; ran: Promise<void>; finish(): void; done: Promise<void> } {
  let finish!: () => void;
  const gate = new Promise<void>((r) => (finish = r));
  let pidResolve!: (pid: number) => void;
  const pid = new Promise<number>((r) => (pidResolve = r));
  let ranResolve!: () => void;
  const ran = new Promise<void>((r) => (ranResolve = r));
  const done = store.transaction(async (tx) => {
    pidResolve((await tx.get<{ pid: number }>("SELECT pg_backend_pid() AS pid"))!.pid);
    await body(tx);
    ranResolve();
    await gate;
  });
  const handle = { pid, ran, finish, done };
  opened.push(handle);
  return handle;
}

/** Resolves once backend `pid` waits on a lock; fails if it has not within 20 s (it went through instead). */
async function waitsOnLock(store: PostgresStore, pid: number): Promise<void> {
  const deadline = Date.now() + 20_000;
  for (;;) {
    if (Date.now() > deadline) throw new Error(`backend ${pid} never waited on a lock`);
    const r = await store.pool.query("SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1", [pid]);
    if ((r.rows[0] as { wait_event_type: string | null } | undefined)?.wait_event_type === "Lock") return;
    await new Promise((res) => setTimeout(res, 5));
  }
}

async function dueAt(store: PostgresStore): Promise<number | undefined> {
  return (await store.readCommitted<{ due_at: number }>("SELECT due_at FROM due WHERE kind = 'fill' AND ref = ?", [REF]))?.due_at;
}

describe("fill wake-up of a borrow on PostgreSQL", { skip: PG_SKIP }, () => {
  test("borrows share a pending check; the reconciler's delete waits for them; a later borrow writes the row anew", async () => {
    const store = await PostgresStore.open({ connectionString: PG_URL!, schema: "t_" + randomBytes(6).toString("hex"), poolSize: 6 });
    try {
      await store.transaction((tx) => tx.run("INSERT INTO due (kind, ref, due_at) VALUES ('fill', ?, 100)", [REF]));
      // Two borrows find the check pending: the second does not wait for the first.
      const b1 = open(store, (tx) => requestFillCheck(tx, REF, 200));
      await b1.ran;
      const b2 = open(store, (tx) => requestFillCheck(tx, REF, 200));
      await b2.ran;
      // The reconciler's fill visit starts with the delete: it waits for both borrows.
      let deleted = false;
      const rec = open(store, async (tx) => {
        await clearDue(tx, "fill", REF);
        // The visit then counts capacity; that read is what sends the (held) delete.
        await tx.get("SELECT COUNT(*) AS n FROM machines");
        deleted = true;
      });
      await waitsOnLock(store, await rec.pid);
      b1.finish();
      await b1.done;
      assert.equal(deleted, false, "the delete still waits for the second borrow");
      b2.finish();
      await b2.done;
      await rec.ran;
      assert.equal(deleted, true);
      assert.equal(await dueAt(store), 100, "neither borrow wrote the row");
      // A borrow during the reconciler's transaction waits for it, then inserts the row.
      const b3 = open(store, (tx) => requestFillCheck(tx, REF, 300));
      await waitsOnLock(store, await b3.pid);
      rec.finish();
      await rec.done;
      await b3.ran;
      b3.finish();
      await b3.done;
      assert.equal(await dueAt(store), 300);
    } finally {
      for (const o of opened) o.finish();
      await Promise.allSettled(opened.map((o) => o.done));
      await store.pool.query("SELECT current_schema() AS s").then((r) => store.pool.query(`DROP SCHEMA "${(r.rows[0] as { s: string }).s}" CASCADE`));
      await store.close();
    }
  });
});

