import { test } from "node:test";
import assert from "node:assert/strict";
import { defaultHostCapacity } from "../../src/core/host-capacity.js";

const GiB = 2 ** 30;

test("default capacity: every CPU; memory minus max(1 GiB, 10 %)", () => {
  assert.deepEqual(defaultHostCapacity(24, 24 * GiB), { vcpu: 24, memoryMb: 24 * 1024 - Math.ceil(24 * 1024 * 0.1) });
  assert.deepEqual(defaultHostCapacity(2, 4 * GiB), { vcpu: 2, memoryMb: 3 * 1024 }, "below 10 GiB the 1 GiB floor is the reserve");
  assert.deepEqual(defaultHostCapacity(1, 512 * 2 ** 20), { vcpu: 1, memoryMb: 1 }, "never zero: the agent still starts and refuses by placement");
});
