import { test } from "node:test";
import assert from "node:assert/strict";
import { defaultHostCapacity, defaultHostDisk } from "../../src/core/host-capacity.js";

const GiB = 2 ** 30;

test("default capacity: every CPU; memory minus max(1 GiB, 10 %)", () => {
  assert.deepEqual(defaultHostCapacity(24, 24 * GiB), { vcpu: 24, memoryMib: 24 * 1024 - Math.ceil(24 * 1024 * 0.1) });
  assert.deepEqual(defaultHostCapacity(2, 4 * GiB), { vcpu: 2, memoryMib: 3 * 1024 }, "below 10 GiB the 1 GiB floor is the reserve");
  assert.deepEqual(defaultHostCapacity(1, 512 * 2 ** 20), { vcpu: 1, memoryMib: 1 }, "never zero: the agent still starts and refuses by placement");
});

test("default disk: free space minus max(2 GiB, 10 % of the filesystem), never below zero", () => {
  assert.equal(defaultHostDisk(78 * GiB, 252 * GiB), 78 * 1024 - Math.ceil(252 * 1024 * 0.1));
  assert.equal(defaultHostDisk(10 * GiB, 10 * GiB), 10 * 1024 - 2048, "below 20 GiB the 2 GiB floor is the reserve");
  assert.equal(defaultHostDisk(1 * GiB, 100 * GiB), 0);
});
