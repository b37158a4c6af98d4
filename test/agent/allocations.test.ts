/**
 * The agent's allocation operations, in process on a real agent (process
 * runtime, real store): the hold is taken once per generation, a second or
 * stale generation and any hold after release are refused; launch needs the
 * exact hold; release destroys the sandbox, wipes or keeps the volume, and
 * fences every later hold. Volume records: intent before the directory,
 * identity after; an interrupted release is finished at start-up.
 */
import { after, test } from "node:test";
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { AgentHarness, sshKey } from "../helpers/agent.js";
import { BerthError } from "../../src/core/errors.js";
import { allocationMachineId } from "../../src/core/allocation-access.js";
import { Volumes } from "../../src/agent/volumes.js";
import { AgentStore } from "../../src/agent/store/store.js";

const h = new AgentHarness("berth-alloc-ops-");
after(() => h.close());

const code = (c: string) => (e: unknown) => e instanceof BerthError && e.code === c;
const pick = (r: { state: string; generation: number }) => [r.state, r.generation];
const hold = (id: string, g: number, opId = `h-${id}-${g}`) => ({ opId, kind: "alloc_hold" as const, machineId: allocationMachineId(id), generation: g, args: { allocationId: id, vcpu: 2, memoryMib: 4096 } });

test("a hold is taken once per generation; another or a stale generation is refused; release fences every later hold", async () => {
  const a = await h.agent();
  const first = await a.ops.run(hold("x1", 1));
  assert.deepEqual(first.result, { allocationId: "x1", generation: 1, existed: false });
  // The same request again (a retry) answers the first result; the same generation under a new id finds the hold.
  assert.deepEqual((await a.ops.run(hold("x1", 1))).result, first.result);
  assert.deepEqual((await a.ops.run(hold("x1", 1, "h-again"))).result, { allocationId: "x1", generation: 1, existed: true });
  await assert.rejects(a.ops.run(hold("x1", 2)), code("conflict"), "a second generation never takes a second hold");
  await assert.rejects(a.ops.run(hold("x1", 0)), code("generation_mismatch"));
  assert.equal(a.store.holds.countHeld(), 1);
  // Launch needs the exact hold.
  const key = sshKey();
  const launch = (g: number) => ({ opId: `l-${g}`, kind: "alloc_launch" as const, machineId: allocationMachineId("x1"), generation: g, args: { allocationId: "x1", publicKey: key.line, expiresAt: Date.now() + 60_000 } });
  await assert.rejects(a.ops.run(launch(2)), code("generation_mismatch"));
  const l = await a.ops.run(launch(1));
  const res = l.result as { machineId: string; volume: { path: string; dev: string; ino: string } };
  assert.equal(res.machineId, "a-x1");
  assert.ok(existsSync(join(res.volume.path, "data")));
  assert.equal(a.store.volumes.get("x1")?.state, "ready");
  assert.equal(a.store.volumes.get("x1")?.ino, res.volume.ino);
  assert.equal(a.keys.list("a-x1").length, 1);
  // Release: sandbox gone, key gone, volume wiped, hold released for good.
  const rel = await a.ops.run({ opId: "r-x1", kind: "alloc_release", machineId: "a-x1", generation: 0, args: { allocationId: "x1", keepVolume: false } });
  assert.deepEqual({ ...(rel.result as object) }, { allocationId: "x1", sessionsClosed: 0, processesRemaining: 0, volume: "wiped", holdReleased: true });
  assert.equal(existsSync(res.volume.path), false);
  assert.equal(a.store.volumes.get("x1")?.state, "clean");
  assert.equal(a.keys.list("a-x1").length, 0);
  assert.equal((await a.runtime.inspect("a-x1")).exists, false);
  await assert.rejects(a.ops.run(hold("x1", 5)), code("conflict"), "no hold after release, at any generation");
  assert.equal(a.store.holds.countHeld(), 0);
});

test("release before any hold fences the allocation: a late first hold is refused", async () => {
  const a = await h.agent();
  await a.ops.run({ opId: "r-x2", kind: "alloc_release", machineId: "a-x2", generation: 0, args: { allocationId: "x2", keepVolume: false } });
  await assert.rejects(a.ops.run(hold("x2", 1)), code("conflict"));
});

test("an observation that raises the floor fences every lower hold, whichever arrives first; a held hold is answered unchanged", async () => {
  const a = await h.agent();
  // No hold yet: the observation raises the floor to 2 (durably, before answering).
  assert.deepEqual(pick(a.store.holds.observe("x4", "a-x4", 2, 1)), ["fenced", 2]);
  await assert.rejects(a.ops.run(hold("x4", 1)), code("generation_mismatch"), "the lapsed actor's late hold is refused after the observation");
  assert.equal(a.store.holds.countHeld(), 0);
  assert.deepEqual(pick(a.store.holds.observe("x4", "a-x4", 1, 2)), ["fenced", 2], "a floor never goes down");
  assert.deepEqual((await a.ops.run(hold("x4", 2))).result, { allocationId: "x4", generation: 2, existed: false }, "the replacement's generation holds");
  assert.deepEqual(pick(a.store.holds.observe("x4", "a-x4", 3, 3)), ["held", 2], "a held hold is seen, not fenced over");
  await assert.rejects(a.ops.run(hold("x4", 3)), code("conflict"));
  // Other order: the late hold lands first; the observation then sees it held (and a replacement recovers it).
  await a.ops.run(hold("x5", 1));
  assert.deepEqual(pick(a.store.holds.observe("x5", "a-x5", 2, 4)), ["held", 1]);
  await assert.rejects(a.ops.run(hold("x5", 2)), code("conflict"));
  assert.equal(a.store.holds.countHeld(), 2);
});

test("the envelope's machine must be the allocation's sandbox", async () => {
  const a = await h.agent();
  await assert.rejects(a.ops.run({ ...hold("x3", 1), machineId: "m_other" }), code("invalid_request"));
});

test("volume: intent before the directory, identity after; an interrupted release is finished at start-up", () => {
  const dir = h.dir();
  const store = AgentStore.open(dir);
  try {
    const v = new Volumes({ stateDir: dir, records: store.volumes, now: Date.now, log: { info() {}, warn() {}, error() {} } });
    const made = v.ensure("v1");
    assert.equal(made.state, "ready");
    assert.ok(made.dev && made.ino);
    assert.deepEqual(v.verify("v1").problems, []);
    // A crash after the release intent was recorded, before the directory went: start-up finishes it.
    store.volumes.put({ ...made, state: "release_intent" });
    assert.ok(existsSync(made.path));
    v.recover();
    assert.equal(existsSync(made.path), false);
    assert.equal(store.volumes.get("v1")?.state, "clean");
  } finally {
    store.close();
  }
});
