import { test } from "node:test";
import assert from "node:assert/strict";
import { checkDiskMode, planDisk } from "../../src/agent/volume-disk.js";
import { BerthError } from "../../src/core/errors.js";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { AgentStore } from "../../src/agent/store/store.js";
import { diskView, Volumes } from "../../src/agent/volumes.js";
import { tempDir } from "../helpers/env.js";

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

test("auto on a host that cannot: the volume is a plain directory, its record and launch view say not enforced and why", () => {
  const dir = tempDir("berth-volume-disk-");
  const store = AgentStore.open(join(dir.path, "state"));
  try {
    const log = { info: () => undefined, warn: () => undefined, error: () => undefined, debug: () => undefined } as unknown as ConstructorParameters<typeof Volumes>[0]["log"];
    const volumes = new Volumes({ stateDir: join(dir.path, "state"), records: store.volumes, now: () => 1, log, disk: { mode: "auto", cap: cannot } });
    const v = volumes.ensure("a1", 64);
    assert.deepEqual([v.state, v.diskMib, v.diskEnforced, v.diskWhy], ["ready", 64, false, cannot.why]);
    assert.equal(existsSync(join(v.path, "disk.img")), false);
    assert.deepEqual(diskView(v), { enforced: false, how: cannot.why, sizeMib: 64 });
    assert.equal(volumes.verify("a1").ok, true);
  } finally {
    store.close();
    dir.cleanup();
  }
});
