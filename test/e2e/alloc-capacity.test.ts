/**
 * Real capacity by default: a `berth agent` started without --vcpu and
 * --memory-mb offers this host's real vCPUs and memory minus the stated
 * reserve (core/host-capacity.ts), so the smallest allocation is created and
 * launched on a host that has room for it — with a real coordinator and a
 * real agent.
 */
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { availableParallelism, totalmem } from "node:os";
import { AllocRig } from "../helpers/alloc-rig.js";
import { defaultHostCapacity } from "../../src/core/host-capacity.js";
import { generateSshKeyPair } from "../../src/core/ssh-keys.js";

const key = generateSshKeyPair("capacity-test");
const real = defaultHostCapacity(availableParallelism(), totalmem());
const SMALL = { vcpu: 2, memoryMib: 4096 };
const room = real.vcpu >= SMALL.vcpu && real.memoryMib >= SMALL.memoryMib;

describe("an agent without capacity flags offers the host's real capacity", { timeout: 120_000 }, () => {
  const rig = new AllocRig("sqlite");
  rig.agentArgs = ["--slots", "2"];
  before(() => rig.start());
  after(() => rig.close());

  test("the host account holds the real vCPUs and memory minus the reserve", async () => {
    const r = await rig.store.transaction((tx) => tx.get<{ vcpu: number; memory_mib: number }>("SELECT vcpu, memory_mib FROM host_accounts WHERE host_id = ?", [rig.hostId]));
    assert.deepEqual({ vcpu: Number(r!.vcpu), memoryMib: Number(r!.memory_mib) }, real);
    assert.ok(real.memoryMib < Math.floor(totalmem() / 2 ** 20), "a reserve is kept for the host");
  });

  test("a small allocation is created and launched on a host with room for it", { skip: room ? false : `this host offers ${real.vcpu} vCPU / ${real.memoryMib} MiB after the reserve: no room for a small (2 vCPU / 4 GiB)` }, async () => {
    const c = await rig.coordinator();
    try {
      const a = await rig.api(c).call<{ state: string }>("POST", "/v1/allocations", { id: "cap1", size: "small", publicKey: key.publicKey });
      assert.notEqual(a.state, "released");
      await rig.waitState("cap1", "ready", 30_000);
      await rig.api(c).call("POST", "/v1/allocations/cap1/release", {});
      await rig.waitState("cap1", "released", 30_000);
    } finally {
      await c.kill();
    }
  });
});
