/**
 * The client library, imported through the package's entry point ("berth",
 * package.json "exports") exactly as a TypeScript agent harness would, against
 * a real `berth serve` + `berth agent` (process runtime).
 */
import { test, describe, before, after } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { Writable } from "node:stream";
import { BerthClient, type Borrow } from "berth";
import { Cluster } from "../helpers/cluster.js";
import { cutFirstBorrowReply } from "../helpers/cut-proxy.js";

function hashing(): Writable & { digest: () => string; bytes: () => number } {
  const h = createHash("sha256");
  let n = 0;
  const w = new Writable({
    write(chunk: Buffer, _e, cb) {
      h.update(chunk);
      n += chunk.length;
      cb();
    },
  }) as Writable & { digest: () => string; bytes: () => number };
  w.digest = () => h.digest("hex");
  w.bytes = () => n;
  return w;
}

describe("client library (import from \"berth\")", { timeout: 180_000 }, () => {
  const c = new Cluster({ runtime: "process", minReady: 3, maxReady: 3, slots: 4 });
  let client: BerthClient;
  before(async () => {
    await c.start();
    await c.ensurePool("ci");
    await c.waitFor("three ready machines", async () => (await c.readyCount("ci")) >= 3, 60_000);
    client = BerthClient.fromConfig({ config: c.clientConfig });
  });
  after(async () => {
    await client?.close();
    await c.close();
  });

  const allReady = () =>
    c.waitFor("every machine ready again", async () => {
      const ms = await c.machines();
      return ms.length >= 3 && ms.every((m) => m.state === "ready") ? ms : null;
    });

  test("an AbortSignal mid-command: the command gets INT, the machine is returned and ready again", async () => {
    const before = await allReady();
    const ac = new AbortController();
    let out = "";
    let borrowed: Borrow | null = null;
    const stdout = new Writable({
      write(chunk: Buffer, _e, cb) {
        out += chunk.toString();
        if (out.includes("started")) ac.abort(new Error("enough"));
        cb();
      },
    });
    await assert.rejects(
      // Short sleeps in a loop, not one long one: a signal that lands while sh is between fork and
      // exec of a child is swallowed by that child (sh's own race, not berth's); the trap still runs
      // once the current short sleep ends.
      client.run({ pool: "ci", command: ["sh", "-c", "trap 'echo interrupted; exit 0' INT; echo started; i=0; while [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; echo not-reached"], stdout, stderr: process.stderr, signal: ac.signal, onBorrowed: (b) => (borrowed = b) }),
      /enough/,
    );
    assert.ok(borrowed, "the run had borrowed");
    const b = borrowed as Borrow;
    assert.equal(b.state, "returned");
    assert.match(out, /interrupted/);
    assert.doesNotMatch(out, /not-reached/);
    const view = await client.api.call<{ state: string }>("GET", `/v1/borrows/${b.id}`);
    assert.equal(view.state, "returned");
    const afterAbort = await allReady();
    assert.deepEqual(afterAbort.map((m) => m.id).sort(), before.map((m) => m.id).sort(), "nothing quarantined or replaced");
  });

  test("exec streams 50 MB of output byte-exact, then the exit status", async () => {
    const size = 50 * 1024 * 1024;
    const line = "berth 0123456789abcdefghijklmnopqrstuvwxyz\n";
    const expected = createHash("sha256");
    const block = Buffer.from(line.repeat(Math.ceil(size / line.length))).subarray(0, size);
    expected.update(block);
    const b = await client.borrow({ pool: "ci" });
    try {
      const sink = hashing();
      const r = await client.exec(b, `yes '${line.trimEnd()}' | head -c ${size}; exit 3`, { stdout: sink, stderr: process.stderr });
      assert.equal(r.code, 3);
      assert.equal(sink.bytes(), size);
      assert.equal(sink.digest(), expected.digest("hex"));
      // Several commands on one borrow share its connection; stdin bytes arrive with EOF.
      const echoed = await client.exec(b, "cat; echo done", { stdin: Buffer.from("from stdin\n") });
      assert.equal(echoed.stdout!.toString(), "from stdin\ndone\n");
      assert.equal(echoed.status, 0);
    } finally {
      await client.return(b);
    }
  });

  test("concurrent runs from one client object", async () => {
    await allReady();
    const runs = await Promise.all(
      [0, 1, 2, 3, 4, 5].map((i) => client.run({ pool: "ci", command: ["sh", "-c", `echo run-${i}; exit ${i}`], waitMs: 60_000 })),
    );
    runs.forEach((r, i) => {
      assert.equal(r.stdout!.toString(), `run-${i}\n`);
      assert.equal(r.status, i);
      assert.ok(r.returned, `run ${i} returned its machine`);
    });
    assert.equal(new Set(runs.map((r) => r.borrowId)).size, 6);
    await allReady();
  });

  test("a borrow whose reply is lost (connection cut after the coordinator answered) is sent again and gets the same borrow: one machine lent", async () => {
    const before = await allReady();
    const proxy = await cutFirstBorrowReply(c.coordinator!.url);
    const via = new BerthClient({ url: proxy.url, token: readFileSync(join(c.dir.path, "admin.token"), "utf8").trim(), keeperKeyFile: join(c.dir.path, "keeper_ed25519") });
    try {
      const b = await via.borrow({ pool: "ci" });
      assert.equal(proxy.cut(), 1, "the first answer was cut");
      const lent = (await c.machines()).filter((m) => m.state !== "ready");
      assert.deepEqual(lent.map((m) => m.id), [b.machine.id], "exactly the machine of the borrow the client holds is out of the pool");
      const r = await via.exec(b, ["echo", "after-a-lost-reply"]);
      assert.equal(r.stdout!.toString(), "after-a-lost-reply\n");
      assert.equal((await via.return(b)).repeated, false);
    } finally {
      await via.close();
      await proxy.close();
    }
    const afterRun = await allReady();
    assert.deepEqual(afterRun.map((m) => m.id).sort(), before.map((m) => m.id).sort(), "no machine abandoned or replaced");
  });

  test("return is idempotent: a repeat answers where the first went", async () => {
    const b = await client.borrow({ pool: "ci", waitMs: 30_000 });
    const first = await client.return(b);
    assert.equal(first.repeated, false);
    const again = await client.return(b);
    assert.equal(again.repeated, true);
  });
});
