/**
 * Waits say why, and a borrow can wait. Through the binary, against a real
 * `berth serve` + `berth agent` (process runtime, one host of 2 slots):
 *   - a pool at its maximum with every machine lent is refused with that
 *     cause (not "the pool is being refilled");
 *   - `berth borrow --wait D` prints on stderr why nothing is ready while it
 *     waits, and gives up after D with exit 69 and `pool_exhausted` naming
 *     the cause; it takes the machine as soon as one comes back;
 *   - a pool that cannot get a host slot says every slot is taken and which
 *     pool holds them — on a borrow and in `berth pool ensure --wait`;
 *   - `berth up --portable --min-ready N` with no slot left for the portable
 *     pool refuses at once, saying why, instead of waiting.
 */
import { test, describe, before, after } from "node:test";
import assert from "node:assert/strict";
import { join } from "node:path";
import { mkdirSync } from "node:fs";
import { berth, Cluster } from "../helpers/cluster.js";
import { tempDir } from "../helpers/env.js";

describe("waits say why; berth borrow --wait", { timeout: 240_000 }, () => {
  const c = new Cluster({ runtime: "process", minReady: 1, maxReady: 1, slots: 2 });
  before(async () => {
    await c.start();
    await c.ensurePool("ci");
    await c.waitFor("a ready machine", async () => (await c.readyCount("ci")) >= 1);
  });
  after(() => c.close());

  const receipt = (name: string) => join(c.dir.path, `${name}.json`);
  const borrow = (name: string, extra: string[] = []) => berth(["borrow", "ci", "--config", c.clientConfig, "--receipt", receipt(name), ...extra]);
  const giveBack = async (name: string) => {
    const r = await berth(["return", "--config", c.clientConfig, "--receipt", receipt(name)]);
    assert.equal(r.status, 0, r.stderr);
  };

  test("at its maximum with every machine lent: the refusal says so", async () => {
    const held = await borrow("held");
    assert.equal(held.status, 0, held.stderr);
    const r = await borrow("second");
    assert.equal(r.status, 69, r.stderr);
    assert.match(r.stderr, /^berth: pool_exhausted: pool ci is at its maximum of 1 machine\(s\) and none is ready: 1 lent, 0 being cleaned/m);
    assert.match(r.stderr, /when a borrow ends/);
    assert.doesNotMatch(r.stderr, /being refilled/);
  });

  test("berth borrow --wait: progress names why, gives up with pool_exhausted and exit 69", async () => {
    const t0 = Date.now();
    const r = await borrow("waiter", ["--wait", "3s"]);
    const took = Date.now() - t0;
    assert.equal(r.status, 69, r.stderr);
    assert.match(r.stderr, /^berth: waiting up to 3s for a machine of pool ci: pool ci is at its maximum of 1/m);
    assert.match(r.stderr, /^berth: pool_exhausted: pool ci is at its maximum of 1 machine\(s\)[^\n]*; waited \d+(\.\d)?s \(--wait 3s\)$/m);
    assert.ok(took >= 3_000, `gave up after ${took} ms, before the wait ran out`);
    assert.equal(r.stdout, "");
  });

  test("berth borrow --wait takes the machine as soon as one comes back", async () => {
    const waiting = borrow("late", ["--wait", "60s"]);
    await new Promise((r) => setTimeout(r, 1_500));
    await giveBack("held");
    const r = await waiting;
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /^borrowed b_\S+ on machine m_/m);
    assert.match(r.stderr, /waiting up to 1m for a machine of pool ci/);
    await giveBack("late");
  });

  test("hosts full: the refusal and pool ensure --wait name the pool holding the slots", async () => {
    // ci now holds both slots of the only host.
    await c.api.call("POST", "/v1/pools/ci/ensure", { minReady: 2, maxReady: 2, compatibilityKey: "e2e", access: "keeper", provider: "hosts", keeperKey: c.keeper.publicKey });
    await c.waitFor("two ready machines", async () => (await c.readyCount("ci")) >= 2, 60_000);
    const e = await berth(["pool", "ensure", "other", "--min-ready", "1", "--max-ready", "1", "--compatibility-key", "e2e", "--keeper-key", join(c.dir.path, "keeper_ed25519.pub"), "--wait", "--timeout", "3s", "--config", c.clientConfig]);
    assert.equal(e.status, 69, e.stderr);
    assert.match(e.stderr, /every host slot \(2\) is taken \(machines by pool: ci 2\)/);
    assert.match(e.stderr, /^berth: pool_exhausted: pool other reached 0 of 1 ready machines before the wait ran out: [^\n]*every host slot \(2\) is taken/m);
    const b = await berth(["borrow", "other", "--config", c.clientConfig, "--receipt", receipt("other")]);
    assert.equal(b.status, 69, b.stderr);
    assert.match(b.stderr, /^berth: pool_exhausted: pool other has no ready machine: every host slot \(2\) is taken \(machines by pool: ci 2\)/m);
  });

  test("pool ensure --wait says why it waits, without a borrower's 'try again' advice", async () => {
    // ci holds both of the host's slots (the test before): a new pool's wait has nothing to make, and
    // says why. Once its first line is out, one slot is freed and the wait ends with the machine.
    await c.api.call("POST", "/v1/pools/other/ensure", { minReady: 0, maxReady: 0, compatibilityKey: "e2e", access: "keeper", provider: "hosts", keeperKey: c.keeper.publicKey });
    let seen = "";
    let saidWhy: () => void = () => {};
    const said = new Promise<void>((r) => (saidWhy = r));
    const waiting = berth(["pool", "ensure", "third", "--min-ready", "1", "--max-ready", "1", "--compatibility-key", "e2e", "--keeper-key", join(c.dir.path, "keeper_ed25519.pub"), "--wait", "--timeout", "60s", "--config", c.clientConfig], {
      onSpawn: (child) =>
        child.stderr!.on("data", (d: Buffer) => {
          seen += d.toString();
          if (/^pool third: 0 ready \(waiting for 1\), 0 provisioning: .*every host slot \(2\) is taken/m.test(seen)) saidWhy();
        }),
    });
    await said;
    await c.api.call("POST", "/v1/pools/ci/ensure", { minReady: 1, maxReady: 1, compatibilityKey: "e2e", access: "keeper", provider: "hosts", keeperKey: c.keeper.publicKey });
    const e = await waiting;
    assert.equal(e.status, 0, e.stderr);
    assert.match(e.stderr, /^pool third: 0 ready \(waiting for 1\), 0 provisioning: pool third has no ready machine: every host slot \(2\) is taken \(machines by pool: ci 2\); free slots by draining/m);
    assert.match(e.stderr, /^pool third: 1 ready \(waiting for 1\)/m);
    assert.doesNotMatch(e.stderr, /try again/);
  });

  test("berth up --portable with no slot left for the portable pool refuses at once, saying why", async () => {
    const d = tempDir("berth-up-slots-");
    try {
      mkdirSync(join(d.path, "w"));
      const t0 = Date.now();
      const r = await berth(["up", "--portable", "--runtime", "process", "--slots", "4", "--min-ready", "4", "--listen", "127.0.0.1:0"], { cwd: join(d.path, "w") });
      assert.equal(r.status, 2, r.stderr);
      assert.match(r.stderr, /^berth: --portable needs a host slot for the portable pool: --min-ready 4 on 4 slots leaves none/m);
      assert.ok(Date.now() - t0 < 60_000, "refused without waiting for machines");
    } finally {
      d.cleanup();
    }
  });
});
