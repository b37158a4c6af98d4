/**
 * A keeper borrow's deadline fits the borrow, not the machine. Through the
 * binary, against a real `berth serve` + `berth agent` (process runtime), on
 * a pool whose machines live 60 s:
 *   - each borrow gets its own deadline: `--duration` from the moment it is
 *     lent (two borrows of one machine differ), the default stated in
 *     docs/cli.md (half the pool's hard TTL here);
 *   - a `--duration` the pool cannot honour is refused (duration_too_long),
 *     nothing borrowed;
 *   - a machine with less life left than the borrow asks is never lent: it is
 *     retired and a fresh one is lent instead;
 *   - after the deadline, `berth return` says what happened and what to do.
 */
import { test, describe, before, after } from "node:test";
import assert from "node:assert/strict";
import { join } from "node:path";
import { readFileSync } from "node:fs";
import { berth, Cluster } from "../helpers/cluster.js";

type Row = { id: string; state: string; generation: number; hard_expires_at: number; reason: string | null };

describe("keeper deadlines fit the borrow", { timeout: 240_000 }, () => {
  const c = new Cluster({ runtime: "process", minReady: 1, maxReady: 2, slots: 3 });
  before(async () => {
    await c.start();
    await c.api.call("POST", "/v1/pools/ci/ensure", { minReady: 1, maxReady: 2, compatibilityKey: "e2e", access: "keeper", provider: "hosts", keeperKey: c.keeper.publicKey, hardTtlMs: 60_000 });
  });
  after(() => c.close());

  async function rows(): Promise<Row[]> {
    const { SqliteStore } = await import("../../src/store/sqlite/sqlite-store.js");
    const s = new SqliteStore({ path: join(c.coordDir, "berth.db") });
    try {
      return await s.transaction((tx) => tx.all<Row>("SELECT id, state, generation, hard_expires_at, reason FROM machines ORDER BY created_at"));
    } finally {
      await s.close();
    }
  }
  const aReady = (minLifeMs = 0) =>
    c.waitFor("a ready machine", async () => (await rows()).find((m) => m.state === "ready" && m.hard_expires_at - Date.now() > minLifeMs), 60_000);

  async function borrow(name: string, extra: string[] = []): Promise<{ t0: number; t1: number; expiresAt: number; machine: string; receipt: string; status: number; stderr: string }> {
    const receipt = join(c.dir.path, `${name}.json`);
    const t0 = Date.now();
    const r = await berth(["borrow", "ci", "--config", c.clientConfig, "--receipt", receipt, "--json", ...extra]);
    const t1 = Date.now();
    if (r.status !== 0) return { t0, t1, expiresAt: 0, machine: "", receipt, status: r.status ?? -1, stderr: r.stderr };
    const j = JSON.parse(r.stdout) as { expiresAt: number; machine: { id: string } };
    return { t0, t1, expiresAt: j.expiresAt, machine: j.machine.id, receipt, status: 0, stderr: r.stderr };
  }
  const giveBack = async (receipt: string) => {
    const r = await berth(["return", "--config", c.clientConfig, "--receipt", receipt]);
    assert.equal(r.status, 0, r.stderr);
  };

  test("each borrow gets its own deadline: --duration from when it is lent; the default is stated", async () => {
    await aReady(40_000);
    const a = await borrow("a", ["--duration", "20s"]);
    assert.equal(a.status, 0, a.stderr);
    assert.ok(a.expiresAt >= a.t0 + 20_000 && a.expiresAt <= a.t1 + 20_000, `deadline ${a.expiresAt - a.t0} ms after the borrow began, asked 20 s`);
    await giveBack(a.receipt);
    await c.waitFor("the machine ready again", async () => (await rows()).find((m) => m.id === a.machine && m.state === "ready"));
    await new Promise((r) => setTimeout(r, 1_100));
    const b = await borrow("b", ["--duration", "15s"]);
    assert.equal(b.status, 0, b.stderr);
    assert.ok(b.expiresAt >= b.t0 + 15_000 && b.expiresAt <= b.t1 + 15_000, `deadline ${b.expiresAt - b.t0} ms after the borrow began, asked 15 s`);
    assert.notEqual(b.expiresAt, a.expiresAt, "two borrows, two deadlines");
    await giveBack(b.receipt);
    await aReady(35_000);
    const d = await borrow("d");
    assert.equal(d.status, 0, d.stderr);
    // Default: 30 minutes, or half the pool's hard TTL when that is shorter (60 s here).
    assert.ok(d.expiresAt >= d.t0 + 30_000 && d.expiresAt <= d.t1 + 30_000, `default deadline ${d.expiresAt - d.t0} ms after the borrow began`);
    await giveBack(d.receipt);
  });

  test("a --duration the pool cannot honour is refused, nothing borrowed", async () => {
    await aReady();
    const before = (await rows()).map((m) => [m.id, m.generation]);
    const r = await borrow("long", ["--duration", "5m"]);
    assert.equal(r.status, 1, r.stderr);
    assert.match(r.stderr, /^berth: duration_too_long: /m);
    assert.match(r.stderr, /at most 54s/);
    assert.match(r.stderr, /--hard-ttl/);
    // Above the longest borrow of any pool (24h): a usage error naming the limit, before anything is sent.
    const day = await borrow("day", ["--duration", "25h"]);
    assert.equal(day.status, 2, day.stderr);
    assert.match(day.stderr, /--duration 25h: a borrow lasts at most 24h/);
    // The API names the limit too (not a bare schema bound).
    await assert.rejects(c.api.call("POST", "/v1/pools/ci/borrow", { durationMs: 25 * 3_600_000 }), (e: Error & { status?: number }) => {
      assert.equal(e.status, 400);
      assert.match(e.message, /invalid_request: field durationMs: a borrow lasts at most 24h \(86400000 ms\)/);
      return true;
    });
    const after = (await rows()).map((m) => [m.id, m.generation]);
    assert.deepEqual(after.filter(([id]) => before.some(([b]) => b === id)), before, "no machine was lent");
  });

  test("a machine with less life left than asked is never lent: it is retired and a fresh one lent", async () => {
    // One machine at most, so that no fresh one stands by.
    await c.api.call("POST", "/v1/pools/ci/ensure", { minReady: 1, maxReady: 1, compatibilityKey: "e2e", access: "keeper", provider: "hosts", keeperKey: c.keeper.publicKey, hardTtlMs: 60_000 });
    // Until the only machine is ready with less than 50 s left: then a 50 s borrow must not get it.
    const old = await c.waitFor("the ready machine to age", async () => {
      const live = (await rows()).filter((x) => x.state !== "destroyed");
      const m = live[0];
      return live.length === 1 && m && m.state === "ready" && m.hard_expires_at - Date.now() < 49_000 && m.hard_expires_at - Date.now() > 10_000 ? m : null;
    }, 90_000);
    const r = await berth(["run", "--config", c.clientConfig, "--pool", "ci", "--duration", "50s", "--wait", "60s", "--", "echo", "ran"]);
    assert.equal(r.status, 0, r.stderr);
    assert.equal(r.stdout, "ran\n");
    const lent = /borrowed (m_\S+) from ci \(keeper\); hard deadline (\S+)/.exec(r.stderr);
    assert.ok(lent, r.stderr);
    assert.notEqual(lent[1], old.id, "the short-lived machine was not lent");
    const now = await rows();
    const fresh = now.find((m) => m.id === lent[1])!;
    assert.ok(Date.parse(lent[2]!) <= fresh.hard_expires_at, "the deadline is within the lent machine's life");
    const o = now.find((m) => m.id === old.id)!;
    assert.ok(["draining", "destroying", "destroyed"].includes(o.state), `the short-lived machine was retired (${o.state})`);
  });

  test("after the deadline, `berth return` says what happened and what to do", async () => {
    await aReady(10_000);
    const a = await borrow("short", ["--duration", "2s"]);
    assert.equal(a.status, 0, a.stderr);
    // The deadline is the coordinator's clock, which is this host's: a little past it is enough.
    await new Promise((r) => setTimeout(r, Math.max(0, a.expiresAt - Date.now()) + 250));
    const r = await berth(["return", "--config", c.clientConfig, "--receipt", a.receipt]);
    assert.equal(r.status, 1, r.stderr);
    assert.match(r.stderr, /^berth: borrow_expired: borrow b_\S+ ended at \S+: its deadline \(--duration 2s\) passed/m);
    assert.match(r.stderr, /nothing to return/);
    assert.match(r.stderr, /borrow again/);
    assert.match(r.stderr, /--duration/);
    assert.ok(JSON.parse(readFileSync(a.receipt, "utf8")), "the receipt is still readable");
  });
});
