import { test } from "node:test";
import assert from "node:assert/strict";
import { checkDiskMode, planDisk } from "../../src/agent/volume-disk.js";
import { BerthError } from "../../src/core/errors.js";

const cannot = { can: false as const, why: "no loop devices (/dev/loop-control is missing)" };

test("required on a host that cannot: the agent refuses to start, naming why; auto and off start", () => {
  assert.throws(
    () => checkDiskMode("required", cannot),
    (e: BerthError) => e.code === "disk_not_enforceable" && /--disk-enforce required, but this host cannot limit a volume's disk: no loop devices/.test(e.message),
  );
  checkDiskMode("required", { can: true });
  checkDiskMode("auto", cannot);
  checkDiskMode("off", cannot);
});

test("a volume's plan: enforced where it can; accounted only with the reason otherwise; required refuses a launch that names no size", () => {
  assert.deepEqual(planDisk("auto", { can: true }, 64), { enforce: true, sizeMib: 64 });
  assert.deepEqual(planDisk("required", { can: true }, 64), { enforce: true, sizeMib: 64 });
  assert.deepEqual(planDisk("auto", cannot, 64), { enforce: false, sizeMib: 64, why: cannot.why });
  assert.deepEqual(planDisk("off", { can: true }, 64), { enforce: false, sizeMib: 64, why: "--disk-enforce off" });
  assert.deepEqual(planDisk("auto", { can: true }, null), { enforce: false, sizeMib: null, why: "the launch named no disk size" });
  assert.throws(() => planDisk("required", { can: true }, null), (e: BerthError) => e.code === "disk_not_enforceable");
});
