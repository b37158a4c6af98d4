/**
 * The allocation launch's takeover windows, with real processes: a `berth
 * serve` is stopped exactly at a point of the launch or the release
 * (BERTH_TEST_PAUSE_AT, NODE_ENV=test) and SIGKILLed there; a replacement
 * coordinator on the same store finishes the obligation. The agent's holds
 * are counted through its own API after each step: never two, and no owner
 * is left wedged (the allocation ends ready, or released with its budget back).
 */
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { AllocRig } from "../helpers/alloc-rig.js";
import { PG_SKIP } from "../helpers/env.js";
import { generateSshKeyPair } from "../../src/core/ssh-keys.js";
import type { ServeProcess } from "../helpers/serve.js";

const key = generateSshKeyPair("takeover-test");

async function createPaused(rig: AllocRig, id: string, point: string): Promise<ServeProcess> {
  const a = await rig.coordinator({ BERTH_TEST_PAUSE_AT: point });
  await rig.api(a).call("POST", "/v1/allocations", { id, size: "small", publicKey: key.publicKey });
  await a.waitFor(new RegExp(`berth-test: paused at ${point}`));
  await a.kill("SIGKILL");
  return a;
}

const heldFor = async (rig: AllocRig, id: string) => (await rig.holds()).filter((h) => h.allocationId === id);

describe("allocation launch takeover with real processes (SQLite)", { timeout: 120_000 }, () => {
  const rig = new AllocRig("sqlite");
  before(() => rig.start());
  after(() => rig.close());

  test("killed after the actor record, before the hold: the replacement re-arms (generation 2) and takes one hold", async () => {
    const a = await createPaused(rig, "w-after-actor", "alloc_after_actor");
    assert.deepEqual(await heldFor(rig, "w-after-actor"), [], "no hold was taken before the kill");
    const dead = await rig.actor("w-after-actor");
    assert.equal(dead?.generation, 1);
    const b = await rig.coordinator();
    await rig.waitState("w-after-actor", "ready");
    const now = await rig.actor("w-after-actor");
    assert.equal(now?.generation, 2, "the replacement wrote a new actor by compare-and-set from the exact old record");
    assert.notEqual(now?.actor, dead?.actor);
    const holds = await heldFor(rig, "w-after-actor");
    assert.deepEqual(holds.map((h) => [h.generation, h.state]), [[2, "held"]], "exactly one hold, the new actor's");
    await b.kill();
    void a;
  });

  test("killed after the hold, before running: the replacement recovers the matching hold (no second hold)", async () => {
    await createPaused(rig, "w-after-hold", "alloc_after_hold");
    assert.deepEqual((await heldFor(rig, "w-after-hold")).map((h) => [h.generation, h.state]), [[1, "held"]]);
    const b = await rig.coordinator();
    await rig.waitState("w-after-hold", "ready");
    assert.equal((await rig.actor("w-after-hold"))?.generation, 1, "recovered at the hold's generation");
    assert.deepEqual((await heldFor(rig, "w-after-hold")).map((h) => [h.generation, h.state]), [[1, "held"]], "still exactly one hold");
    await b.kill();
  });

  test("killed during the release: the replacement finishes it; slot and budget come back once, volume wiped", async () => {
    const a = await rig.coordinator({ BERTH_TEST_PAUSE_AT: "alloc_during_release" });
    const api = rig.api(a);
    await api.call("POST", "/v1/allocations", { id: "w-release", size: "small", publicKey: key.publicKey });
    await rig.waitState("w-release", "ready");
    const charged = await rig.ownerUse();
    assert.ok(existsSync(join(rig.agentDir, "volumes", "w-release", "data")));
    await api.call("POST", "/v1/allocations/w-release/release", {});
    await a.waitFor(/berth-test: paused at alloc_during_release/);
    await a.kill("SIGKILL");
    assert.equal((await rig.allocation("w-release")).state, "releasing", "nothing returned before the cleanup is recorded");
    assert.deepEqual(await rig.ownerUse(), charged, "budget still charged");
    const b = await rig.coordinator();
    await rig.waitState("w-release", "released");
    const back = await rig.ownerUse();
    assert.equal(back.vcpu, charged.vcpu - 2);
    assert.equal(back.count, charged.count - 1);
    assert.deepEqual((await heldFor(rig, "w-release")).map((h) => h.state), ["released"]);
    assert.equal(existsSync(join(rig.agentDir, "volumes", "w-release")), false, "volume wiped");
    assert.equal((await rig.actor("w-release"))?.kind, "tombstone");
    await b.kill();
  });

  test("killed after the actor record, then released: retired settlement by tombstone; a late hold is refused on the agent", async () => {
    await createPaused(rig, "w-retired", "alloc_after_actor");
    const before = await rig.ownerUse();
    // The replacement's launch stops before its takeover decision, so the release (desire: retired) decides first.
    const b = await rig.coordinator({ BERTH_TEST_PAUSE_AT: "alloc_before_takeover" });
    await b.waitFor(/berth-test: paused at alloc_before_takeover/);
    const rel = await rig.api(b).call<{ state: string }>("POST", "/v1/allocations/w-retired/release", {});
    assert.ok(["releasing", "released"].includes(rel.state));
    await rig.waitState("w-retired", "released");
    const actor = await rig.actor("w-retired");
    assert.equal(actor?.kind, "tombstone");
    assert.equal(actor?.generation, 2, "tombstoned from the exact old record (generation 1 -> 2)");
    assert.equal((await rig.ownerUse()).count, before.count - 1, "budget back");
    // The dead actor, had it survived, would now ask for its hold: refused, nothing taken.
    const late = await rig.agentOp({ opId: "late-hold-1", kind: "alloc_hold", machineId: "a-w-retired", generation: 1, args: { allocationId: "w-retired", vcpu: 2, memoryMib: 4096 } });
    assert.equal(late.status, 409);
    assert.deepEqual((await heldFor(rig, "w-retired")).map((h) => h.state), ["released"]);
    await b.kill("SIGKILL");
  });

  test("hold unreadable (agent down): the obligation is retained, the actor record untouched; launched once the agent is back", async () => {
    await createPaused(rig, "w-unreadable", "alloc_after_actor");
    await rig.killAgent();
    const b = await rig.coordinator();
    // Past the dead actor's lease (1 s): a replacement would re-arm if it could read the hold.
    await new Promise((r) => setTimeout(r, 2_000));
    assert.equal((await rig.allocation("w-unreadable")).state, "launching");
    const kept = await rig.actor("w-unreadable");
    assert.equal(kept?.generation, 1, "retained: no compare-and-set without a readable hold");
    await rig.startAgent(b.url);
    await rig.waitState("w-unreadable", "ready");
    assert.deepEqual((await heldFor(rig, "w-unreadable")).map((h) => [h.generation, h.state]), [[2, "held"]]);
    await b.kill();
  });

  test("a host withdrawn after placement (and after the hold) never launches: released, nothing started on the agent", async () => {
    await createPaused(rig, "w-withdrawn", "alloc_after_hold");
    const b = await rig.coordinator({ BERTH_TEST_PAUSE_AT: "alloc_before_takeover" });
    await rig.api(b).call("POST", `/v1/hosts/${rig.hostId}/standing`, { standing: "withdrawn" });
    await b.kill("SIGKILL");
    const c = await rig.coordinator();
    try {
      await rig.waitState("w-withdrawn", "released");
      assert.match((await rig.allocation("w-withdrawn")).reason ?? "", /cleanup proven/);
      assert.deepEqual((await heldFor(rig, "w-withdrawn")).map((h) => h.state), ["released"]);
      const machine = await rig.agentGet("/v1/agent/machines/a-w-withdrawn");
      assert.ok(machine.status === 404 || (machine.body as { state?: string }).state === "destroyed", `the sandbox was never started: ${JSON.stringify(machine.body)}`);
      assert.equal(existsSync(join(rig.agentDir, "volumes", "w-withdrawn")), false, "no volume was made");
    } finally {
      await rig.api(c).call("POST", `/v1/hosts/${rig.hostId}/standing`, { standing: "ready" });
      await c.kill();
    }
  });

  test("never two holds on the agent across every window above", async () => {
    const holds = await rig.holds();
    const ids = holds.map((h) => h.allocationId);
    assert.equal(new Set(ids).size, ids.length);
  });
});

describe("two coordinators on PostgreSQL racing the same takeover", { skip: PG_SKIP, timeout: 120_000 }, () => {
  const rig = new AllocRig("postgres");
  before(() => rig.start());
  after(() => rig.close());

  test("one wins: the actor moves to generation 2 once, one hold", async () => {
    await createPaused(rig, "w-race", "alloc_after_actor");
    const [b, c] = await Promise.all([rig.coordinator(), rig.coordinator()]);
    await rig.waitState("w-race", "ready");
    // Let the loser visit again after the winner is done: it must not move anything.
    await new Promise((r) => setTimeout(r, 2_500));
    const actor = await rig.actor("w-race");
    assert.equal(actor?.generation, 2);
    assert.deepEqual((await heldFor(rig, "w-race")).map((h) => [h.generation, h.state]), [[2, "held"]]);
    assert.equal((await rig.allocation("w-race")).state, "ready");
    await Promise.all([b.kill(), c.kill()]);
  });
});
