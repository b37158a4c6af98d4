/**
 * `berth run` keeps the habits people bring from ssh, tested through the
 * binary against a real `berth serve` + `berth agent` (process runtime):
 * signals are forwarded to the remote command and the machine is returned
 * normally (ready again, never quarantined), stdin is forwarded from a pipe
 * and `-n` turns it off, `berth return` can be repeated, and an empty pool is
 * waited on.
 */
import { test, describe, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { join } from "node:path";
import { BIN, berth, Cluster } from "../helpers/cluster.js";

interface Running {
  status: Promise<number | null>;
  out: () => string;
  err: () => string;
  kill: (s: NodeJS.Signals) => void;
  stdin: NodeJS.WritableStream;
}

function start(c: Cluster, args: string[]): Running {
  const child = spawn(process.execPath, [BIN, "run", "--config", c.clientConfig, ...args], { env: { ...process.env, BERTH_PG_URL: "" }, stdio: ["pipe", "pipe", "pipe"] });
  let out = "";
  let err = "";
  child.stdout.on("data", (d: Buffer) => (out += d.toString()));
  child.stderr.on("data", (d: Buffer) => (err += d.toString()));
  child.stdin.on("error", () => undefined);
  return {
    status: new Promise((r) => child.once("close", (code) => r(code))),
    out: () => out,
    err: () => err,
    kill: (s) => child.kill(s),
    stdin: child.stdin,
  };
}

async function until(what: string, fn: () => boolean, ms = 20_000): Promise<void> {
  const end = Date.now() + ms;
  while (!fn()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

describe("berth run behaves like ssh", { timeout: 180_000 }, () => {
  const c = new Cluster({ runtime: "process", minReady: 1, maxReady: 1, slots: 2 });
  before(async () => {
    await c.start();
    await c.ensurePool("ci");
    await c.waitFor("a ready machine", async () => (await c.readyCount("ci")) >= 1);
  });
  after(() => c.close());

  const settled = () =>
    c.waitFor("the machine ready again", async () => {
      const ms = await c.machines();
      return ms.length > 0 && ms.every((m) => m.state === "ready") ? ms : null;
    });

  for (const [sig, status] of [["SIGINT", 130], ["SIGTERM", 143]] as const) {
    test(`${sig} during a remote sleep: the remote trap runs, exit ${status}, the machine is returned and reused (not quarantined)`, async () => {
      const before = await settled();
      const name = sig.slice(3);
      // stdin is a pipe that is never written to: forwarded, and the signal must still arrive.
      // A loop of short sleeps: a signal landing while sh forks a child can be swallowed by that
      // child (sh's race); the trap then runs when the current sleep ends, not after 30 s.
      const r = start(c, ["--pool", "ci", "--", "sh", "-c", `trap 'echo trapped-${name}; exit 0' ${name}; echo started; i=0; while [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; echo not-reached`]);
      await until("the command to start", () => r.out().includes("started"));
      r.kill(sig);
      assert.equal(await r.status, status, r.err());
      assert.match(r.out(), new RegExp(`trapped-${name}`));
      assert.doesNotMatch(r.out(), /not-reached/);
      assert.match(r.err(), /returned m_/);
      const afterRun = await settled();
      assert.deepEqual(afterRun.map((m) => m.id), before.map((m) => m.id), "the same machine, not destroyed and replaced");
      assert.ok(afterRun.every((m) => m.state === "ready"));
    });
  }

  test("`echo hi | berth run -- cat` prints hi", async () => {
    await settled();
    const r = start(c, ["-q", "--pool", "ci", "--", "cat"]);
    r.stdin.end("hi\n");
    assert.equal(await r.status, 0, r.err());
    assert.equal(r.out(), "hi\n");
  });

  test("`berth run -n -- cat` ends at once although stdin stays open", async () => {
    await settled();
    const r = start(c, ["-q", "-n", "--pool", "ci", "--", "cat"]);
    // stdin is never ended: without -n this would wait for it, as ssh does.
    const status = await Promise.race([r.status, new Promise<string>((res) => setTimeout(() => res("still running"), 20_000))]);
    r.stdin.end();
    assert.equal(status, 0, r.err());
    assert.equal(r.out(), "");
  });

  test("two `berth return` of one receipt both exit 0; the second says so", async () => {
    await settled();
    const receipt = join(c.dir.path, "twice.json");
    const b = await berth(["borrow", "ci", "--config", c.clientConfig, "--receipt", receipt]);
    assert.equal(b.status, 0, b.stderr);
    const first = await berth(["return", "--config", c.clientConfig, "--receipt", receipt]);
    assert.equal(first.status, 0, first.stderr);
    const second = await berth(["return", "--config", c.clientConfig, "--receipt", receipt, "--json"]);
    assert.equal(second.status, 0, second.stderr);
    assert.equal(JSON.parse(second.stdout).repeated, true);
  });

  test("a pool emptied by one long borrow: a second `berth run` waits, and succeeds once the machine is returned", async () => {
    await settled();
    const receipt = join(c.dir.path, "long.json");
    const b = await berth(["borrow", "ci", "--config", c.clientConfig, "--receipt", receipt]);
    assert.equal(b.status, 0, b.stderr);
    const r = start(c, ["-q", "--wait", "60s", "--pool", "ci", "--", "echo", "got-a-machine"]);
    await new Promise((res) => setTimeout(res, 1500));
    assert.equal(r.out(), "", "no machine yet: still waiting");
    const back = await berth(["return", "--config", c.clientConfig, "--receipt", receipt]);
    assert.equal(back.status, 0, back.stderr);
    assert.equal(await r.status, 0, r.err());
    assert.equal(r.out(), "got-a-machine\n");
  });

  test("the pool may come from BERTH_POOL; with none anywhere, a usage error (2) that says how to give one", async () => {
    await settled();
    const viaEnv = await berth(["run", "-q", "--config", c.clientConfig, "--", "echo", "via-env"], { env: { BERTH_POOL: "ci" } });
    assert.equal(viaEnv.status, 0, viaEnv.stderr);
    assert.equal(viaEnv.stdout, "via-env\n");
    const none = await berth(["run", "--config", c.clientConfig, "--", "true"], { env: { BERTH_POOL: "" } });
    assert.equal(none.status, 2, none.stderr);
    assert.match(none.stderr, /no pool given; pass --pool NAME, set BERTH_POOL/);
    assert.doesNotMatch(none.stderr, /borrowed/, "refused before borrowing");
  });

  test("without --wait long enough, an empty pool ends in 69", async () => {
    await settled();
    const receipt = join(c.dir.path, "hold.json");
    const b = await berth(["borrow", "ci", "--config", c.clientConfig, "--receipt", receipt]);
    assert.equal(b.status, 0, b.stderr);
    try {
      const r = start(c, ["--wait", "300ms", "--pool", "ci", "--", "true"]);
      assert.equal(await r.status, 69, r.err());
      assert.match(r.err(), /pool_exhausted/);
    } finally {
      await berth(["return", "--config", c.clientConfig, "--receipt", receipt]);
    }
  });
});
