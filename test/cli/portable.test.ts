/**
 * The portable CLI through the real binary: explicit opt-in, fail-closed
 * refusals (coordinator without --portable, provider without the
 * capabilities, keeper requests to a portable pool), no key or receipt left
 * by a refused borrow, heartbeats that print the unchanged deadline, and
 * `berth up --portable -- CMD`.
 */
import { test, describe, before, after } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { berth, berthSync, PortableCluster, receiptOf, start, stop } from "../helpers/portable-e2e.js";
import { tempDir } from "../helpers/env.js";

describe("portable CLI opt-in and refusals", () => {
  let c: PortableCluster;
  before(async () => {
    // A heartbeat interval no CLI start-up on a loaded machine can outlast: this file tests what the commands print, not heartbeat timing.
    c = await new PortableCluster({ runtime: "process", minReady: 1, maxReady: 2, heartbeatMs: 60_000 }).start();
  });
  after(async () => {
    await c?.close();
  });

  test("keeper requests to a portable pool are refused, never served another way; nothing is left behind", async () => {
    const ann = c.client("ann");
    const rf = join(ann.dir, "r.json");
    const b = await berth(["borrow", "agents", "--receipt", rf, ...ann.args]);
    assert.equal(b.status, 1);
    assert.match(b.stderr, /namespace_conflict: pool agents is a portable pool/);
    const run = await berth(["run", "--pool", "agents", ...ann.args, "--", "true"]);
    assert.equal(run.status, 1);
    assert.match(run.stderr, /namespace_conflict/);
    assert.deepEqual(readdirSync(ann.dir).filter((f) => f !== "token" && f !== "client.json" && f !== "receipts"), []);
    if (existsSync(join(ann.dir, "receipts"))) assert.deepEqual(readdirSync(join(ann.dir, "receipts")), [], "no receipt or key left by a refused borrow");
  });

  test("a provider without the portable capabilities is refused for a portable pool", async () => {
    const admin = ["--url", c.coordinator!.url, "--token-file", join(c.tmp.path, "admin.token")];
    const r = await berth(["pool", "ensure", "ext", "--min-ready", "0", "--max-ready", "1", "--compatibility-key", "k", "--access", "portable", "--provider", "external", ...admin]);
    assert.equal(r.status, 1);
    assert.match(r.stderr, /portable_unsupported: provider external lacks/);
  });

  test("[I3] manual borrow prints pending, then active; heartbeat prints the unchanged deadline", async () => {
    const bea = c.client("bea");
    const rf = join(bea.dir, "r.json");
    const b = await berth(["borrow", "agents", "--access", "portable", "--duration", "2m", "--receipt", rf, ...bea.args]);
    assert.equal(b.status, 0, b.stderr);
    assert.match(b.stdout, /PENDING \(not usable until `berth ack`\)/);
    const pending = receiptOf(rf);
    assert.equal(pending.state, "pending");
    const a = await berth(["ack", "--receipt", rf, ...bea.args]);
    assert.match(a.stdout, /ACTIVE/);
    const deadline = /hard deadline (\S+)/.exec(a.stdout)![1]!;
    for (let i = 0; i < 2; i++) {
      const h = await berth(["heartbeat", "--receipt", rf, ...bea.args]);
      assert.equal(h.status, 0, h.stderr);
      assert.equal(/hard deadline (\S+)/.exec(h.stdout)![1], deadline);
    }
    const back = await berth(["return", "--receipt", rf, ...bea.args]);
    assert.equal(back.status, 0, back.stderr);
    assert.match(back.stdout, /cleanup: /);
    assert.ok(!existsSync(pending.keyFile));
    await c.waitReady(1);
  });
});

describe("a coordinator without --portable", () => {
  test("refuses every portable request with portable_unsupported and makes no keeper borrow", async () => {
    const dir = tempDir("berth-noportable-");
    const serve = await start(["serve", "--state-dir", join(dir.path, "coord"), "--listen", "127.0.0.1:0"], /listening on (http:\/\/\S+)/);
    try {
      const url = serve.match[1]!;
      const tokenFile = join(dir.path, "token");
      assert.equal(berthSync(["token", "create", "--state-dir", join(dir.path, "coord"), "--org", "e2e", "--role", "admin", "--out", tokenFile]).status, 0);
      const flags = ["--url", url, "--token-file", tokenFile];
      const ensure = await berth(["pool", "ensure", "agents", "--min-ready", "0", "--max-ready", "1", "--compatibility-key", "k", "--access", "portable", ...flags]);
      assert.equal(ensure.status, 1);
      assert.match(ensure.stderr, /portable_unsupported/);
      assert.equal((await berth(["pool", "ensure", "ci", "--min-ready", "0", "--max-ready", "1", "--compatibility-key", "k", "--provider", "external", ...flags])).status, 0);
      const rf = join(dir.path, "r.json");
      const b = await berth(["borrow", "ci", "--access", "portable", "--receipt", rf, ...flags]);
      assert.equal(b.status, 1);
      assert.match(b.stderr, /portable_unsupported: .*no fallback/);
      assert.ok(!existsSync(rf) && !existsSync(`${rf}.key`), "no receipt and no key left");
      const show = await berth(["pool", "show", "ci", "--json", ...flags]);
      assert.equal((JSON.parse(show.stdout) as { counts: { lent: number } }).counts.lent, 0, "no keeper borrow was made instead");
    } finally {
      await stop(serve);
      dir.cleanup();
    }
  });
});

describe("berth up --portable", () => {
  test("runs the command on a portable borrow and tears everything down", async () => {
    const dir = tempDir("berth-up-portable-");
    try {
      const r = await berth(["up", "--portable", "--runtime", "process", "--listen", "127.0.0.1:0", "--min-ready", "1", "--", "sh", "-c", "echo up-portable; exit 4"], { cwd: dir.path });
      assert.equal(r.status, 4, r.stderr);
      assert.match(r.stdout, /up-portable/);
      assert.match(r.stderr, /from agents \(portable\); hard deadline/);
      assert.match(r.stderr, /draining pool agents/);
      assert.deepEqual(readdirSync(join(dir.path, ".berth", "receipts")), []);
    } finally {
      dir.cleanup();
    }
  });
});
