/**
 * Spot pools against the EC2/SSM emulator. A pool with `spot` launches
 * one-time spot instances terminated on interruption (the emulator keeps
 * RunInstances' parameters as sent), its launch records say `spot`; spot
 * refusals (no spot capacity, a spot price above `maxPrice`, the account's
 * spot limit) move the launch to the next subnet and type, then, with
 * `fallbackOnDemand`, on demand; without it the provision fails at once.
 * Through a real coordinator (SQLite, reconciler, executor, ready check): an
 * interrupted ready machine is retired and replaced by another spot
 * instance, an interrupted lent one has its grant invalidated as
 * `machine_lost`, each with the interruption named as the cause.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { startTestCoordinator } from "../helpers/env.js";
import { ackBody, borrowPortable, tokens } from "../helpers/portable.js";
import { awsWorld, done, machine, op, untilSettled } from "../helpers/aws.js";
import { until as waitUntil } from "../helpers/portable-e2e.js";
import { ApiError } from "../../src/cli/api.js";

type PoolShown = { counts: { ready: number } };
type Shown = { state: string; reason: string | null; machine: { id: string; state: string } };

const until = <T>(what: string, fn: () => Promise<T | null | undefined | false>, timeoutMs = 90_000) => waitUntil(what, fn, timeoutMs);

const SPOT_OPTIONS = {
  "InstanceMarketOptions.MarketType": "spot",
  "InstanceMarketOptions.SpotOptions.SpotInstanceType": "one-time",
  "InstanceMarketOptions.SpotOptions.InstanceInterruptionBehavior": "terminate",
  "InstanceMarketOptions.SpotOptions.MaxPrice": "0.05",
};

const marketParams = (p: Record<string, string>) => Object.fromEntries(Object.entries(p).filter(([k]) => k.startsWith("InstanceMarketOptions.")));

test("a spot pool launches one-time spot instances; spot refusals move to the next subnet and type, then on demand with fallbackOnDemand, else the provision fails", { timeout: 90_000 }, async () => {
  const w = await awsWorld({ stepBudgetMs: 8_000, pollMs: 50, pool: { spot: { maxPrice: "0.05", fallbackOnDemand: true }, fallbackSubnetIds: ["subnet-0b"], fallbackInstanceTypes: ["t3a.small"] } });
  try {
    const rec = async (t: string) => {
      const x = await w.provider.records.byToken(t);
      return x ? { market: x.market, endReason: x.endReason, launched: x.instanceId !== null } : null;
    };
    // 1. Spot capacity: launched on the spot market with the pool's price cap; the record says spot.
    const first = op("provision", machine("m_spot1"), 0);
    const r1 = done((await untilSettled(w.provider, first)).outcome);
    const i1 = w.emu.instances.get(String(r1.instanceId))!;
    assert.equal(i1.spot, true);
    assert.deepEqual(marketParams(i1.launchParams), SPOT_OPTIONS);
    assert.deepEqual(await rec(first.opId), { market: "spot", endReason: null, launched: true });

    // 2. No spot capacity in the first subnet, the t3.micro spot price above the cap: the third candidate launches.
    w.emu.faults.noSpotCapacity.push("subnet-0abc");
    w.emu.faults.spotPrices["t3.micro"] = "0.0612";
    const second = op("provision", machine("m_spot2"), 0);
    const r2 = done((await untilSettled(w.provider, second)).outcome);
    const i2 = w.emu.instances.get(String(r2.instanceId))!;
    assert.equal(`${i2.instanceType}@${i2.subnetId} spot=${i2.spot}`, "t3a.small@subnet-0b spot=true");
    assert.deepEqual(await rec(second.opId), { market: "spot", endReason: "refused: InsufficientInstanceCapacity", launched: false });
    assert.deepEqual(await rec(`${second.opId}.f1`), { market: "spot", endReason: "refused: SpotMaxPriceTooLow", launched: false });
    assert.deepEqual(await rec(`${second.opId}.f2`), { market: "spot", endReason: "refused: InsufficientInstanceCapacity", launched: false });
    assert.deepEqual(await rec(`${second.opId}.f3`), { market: "spot", endReason: null, launched: true });

    // 3. The account's spot limit reached: every spot candidate refused, then the first on-demand one launches.
    w.emu.faults.noSpotCapacity.length = 0;
    w.emu.faults.spotPrices = {};
    w.emu.faults.maxSpotInstances = 2;
    const third = op("provision", machine("m_spot3"), 0);
    const r3 = done((await untilSettled(w.provider, third)).outcome);
    const i3 = w.emu.instances.get(String(r3.instanceId))!;
    assert.equal(`${i3.instanceType}@${i3.subnetId} spot=${i3.spot}`, "t3.micro@subnet-0abc spot=false");
    assert.deepEqual(marketParams(i3.launchParams), {}, "on demand: no market options");
    for (const t of [third.opId, `${third.opId}.f1`, `${third.opId}.f2`, `${third.opId}.f3`]) {
      assert.deepEqual(await rec(t), { market: "spot", endReason: "refused: MaxSpotInstanceCountExceeded", launched: false }, t);
    }
    assert.deepEqual(await rec(`${third.opId}.f4`), { market: "on-demand", endReason: null, launched: true });

    // 4. Without fallbackOnDemand: every spot candidate refused is a failed provision (not ambiguous), nothing launched.
    const strict = w.providerWith({ pool: { spot: { maxPrice: "0.05" }, fallbackSubnetIds: ["subnet-0b"], fallbackInstanceTypes: ["t3a.small"] } });
    const before = w.emu.instances.size;
    const o = await strict.run(op("provision", machine("m_spot4"), 0));
    assert.equal(o.kind, "failed", JSON.stringify(o));
    assert.equal(o.kind === "failed" && o.retryable, false);
    assert.match(o.kind === "failed" ? o.error : "", /every configured instance type, subnet and market was refused .*t3\.micro in subnet-0abc \(spot\): MaxSpotInstanceCountExceeded.*t3a\.small in subnet-0b \(spot\): MaxSpotInstanceCountExceeded/);
    assert.equal(w.emu.instances.size, before, "nothing launched");
  } finally {
    await w.close();
  }
});

test("spot interruptions: a ready machine is retired and replaced on the spot market, a lent one's grant ends machine_lost; the cause names the interruption", { timeout: 180_000 }, async () => {
  const w = await awsWorld({ stepBudgetMs: 8_000, pollMs: 50, pool: { spot: {} } });
  const t = await startTestCoordinator({ providers: [w.provider], config: { portable: true, readyCheckMs: 200 } });
  try {
    const admin = await t.api("admin");
    const alice = await t.api("member");
    await admin.call("POST", "/v1/pools/ci/ensure", { minReady: 2, maxReady: 2, compatibilityKey: "aws-linux", access: "portable", provider: "aws", heartbeatMs: 30_000 });
    await until("two ready machines", async () => (await admin.call<PoolShown>("GET", "/v1/pools/ci")).counts.ready >= 2);
    const b = await borrowPortable(alice, "ci");
    const acked = await alice.call<Shown>("POST", `/v1/borrows/${b.borrowId}/ack`, ackBody(b));
    assert.equal(acked.state, "active");
    const lent = acked.machine.id;
    const ready = (await t.store.transaction((tx) => tx.all<{ id: string }>("SELECT id FROM machines WHERE state = 'ready'"))).map((r) => r.id);
    assert.equal(ready.length, 1);
    const instanceOf = (machineId: string) => [...w.emu.instances.values()].find((i) => i.tags["berth:machine"] === machineId)!;
    const original = new Set([lent, ready[0]!].map((m) => instanceOf(m).id));
    for (const m of [lent, ready[0]!]) assert.equal(instanceOf(m).spot, true, "launched on the spot market");

    // AWS reclaims both: the notice, then termination 300 ms later (two minutes on AWS).
    for (const m of [lent, ready[0]!]) w.emu.interruptSpot(instanceOf(m), 300);
    await until("both machines destroyed", async () => {
      const rows = await t.store.transaction((tx) => tx.all<{ state: string }>("SELECT state FROM machines WHERE id IN (?, ?)", [lent, ready[0]!]));
      return rows.every((r) => r.state === "destroyed");
    });
    const lost = await t.store.transaction((tx) => tx.all<{ machine_id: string; from_state: string; detail: string }>("SELECT machine_id, from_state, detail FROM audit WHERE event = 'machine_lost' ORDER BY at"));
    const cause = (m: string) => lost.filter((l) => l.machine_id === m).map((l) => `${l.from_state}: ${l.detail}`).join();
    const spotCause = (m: string) => new RegExp(`machine lost \\(gone\\): instance ${instanceOf(m).id} in eu-west-1 is (terminated|shutting-down) \\(Server\\.SpotInstanceTermination: .*: reclaimed by AWS \\(a spot interruption\\)\\); berth did not end it`);
    assert.match(cause(lent), new RegExp(`^busy: ${spotCause(lent).source}`));
    assert.match(cause(ready[0]!), new RegExp(`^ready: ${spotCause(ready[0]!).source}`));

    // The borrower is told why; the pool refills on the spot market.
    const shown = await alice.call<Shown>("GET", `/v1/borrows/${b.borrowId}`);
    assert.equal(shown.reason, "machine_lost");
    const hb = await alice.call("POST", `/v1/borrows/${b.borrowId}/heartbeat`, tokens(b)).then(() => null, (e: unknown) => e);
    assert.ok(hb instanceof ApiError, "the heartbeat is refused");
    assert.match(hb.message, /borrow_not_active: .*\(machine_lost\)/);
    await until("two new ready machines", async () => (await admin.call<PoolShown>("GET", "/v1/pools/ci")).counts.ready >= 2);
    const fresh = w.emu.live().filter((i) => !original.has(i.id));
    assert.equal(fresh.length, 2);
    for (const i of fresh) assert.equal(i.launchParams["InstanceMarketOptions.MarketType"], "spot");
    const metrics = await (await fetch(`${t.coord.url}/metrics`)).text();
    assert.match(metrics, /berth_machines_lost_total\{pool="ci",verdict="gone"\} 2/);
  } finally {
    await t.close();
    await w.close();
  }
});
