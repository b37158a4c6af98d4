/**
 * The disk dimension, enforced on both runtimes (process, and gvisor where
 * root and runsc are there), with a real `berth serve` with a
 * test size of 64 MiB of disk and a real `berth agent` running as root):
 * the volume is an ext4 image mounted on its data directory, so a write past
 * the size fails inside the machine with "No space left on device"; the
 * launch result and `alloc show` say it is enforced; `volume verify` is ok;
 * a budget too small for the disk is refused naming disk with nothing
 * created; after an agent SIGKILL and the mount gone (as after a host
 * reboot) the restarted agent mounts the image again with the data kept;
 * release unmounts and removes the image.
 */
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { existsSync, statSync } from "node:fs";
import { join } from "node:path";
import { AllocRig } from "../helpers/alloc-rig.js";
import { isMounted } from "../../src/agent/volume-disk.js";
import { gvisorAvailability } from "../../src/agent/runtime/index.js";
import { berth } from "../helpers/cluster.js";
import type { ServeProcess } from "../helpers/serve.js";

const gv = gvisorAvailability();
const canLoop = process.getuid?.() === 0 && existsSync("/dev/loop-control") && spawnSync("sh", ["-c", "command -v mkfs.ext4"]).status === 0;
const skip = canLoop ? false : "needs root, loop devices and mkfs.ext4";
if (skip) process.stdout.write(`# skipping alloc-disk: ${skip}\n`);

for (const runtime of ["process", "gvisor"] as const) {
describe(`disk dimension enforced by a mounted image (${runtime} runtime, real coordinator and agent)`, { timeout: 600_000, skip: skip || (runtime === "gvisor" && !gv.ok ? `gvisor runtime unavailable: ${(gv as { why: string }).why}` : false) }, () => {
  const rig = new AllocRig("sqlite", true, ["--alloc-actor-lease", "2s", "--alloc-size", "tiny=1,256M,64M", "--alloc-size", "small=2,4G,20G"], runtime);
  rig.agentArgs = [...rig.agentArgs, "--disk-enforce", process.env.BERTH_TEST_DISK_ENFORCE ?? "required"];
  let c: ServeProcess;
  let env: Record<string, string>;
  before(async () => {
    await rig.start();
    c = rig.coordinators[0]!;
    env = rig.cliEnv();
  });
  after(() => rig.close());
  const cli = (args: string[]) => berth(args, { env });
  /** A command inside the machine over `berth ssh --print` run by the system ssh. */
  const inside = async (id: string, command: string): Promise<{ status: number | null; out: string; err: string }> => {
    const p = await cli(["ssh", "--print", id, "--", "sh", "-c", command]);
    assert.equal(p.status, 0, p.stderr);
    return AllocRig.runSshLine(p.stdout, 120_000);
  };

  test("a write past the size fails with ENOSPC; budget refusal names disk; remounted after a restart with data kept; release removes the image", async () => {
    const created = await cli(["alloc", "create", "--size", "tiny", "--id", "d1", "--wait"]);
    assert.equal(created.status, 0, created.stderr);
    // Inside the machine: a small file fits, 100 MiB does not.
    assert.equal((await inside("d1", "echo precious > keep.txt")).status, 0);
    const big = await inside("d1", "dd if=/dev/zero of=big bs=1M count=100 2>&1; echo exit=$?");
    assert.match(big.out, /No space left on device/, big.out + big.err);
    assert.doesNotMatch(big.out, /exit=0/);

    const data = join(rig.agentDir, "volumes", "d1", "data");
    const image = join(rig.agentDir, "volumes", "d1", "disk.img");
    assert.ok(existsSync(image), "the image exists");
    assert.ok(isMounted(data), "the image is mounted on the data directory");
    const show = await cli(["alloc", "show", "d1"]);
    assert.match(show.stdout, /size {7}tiny: 1 vCPU, 0.3 GiB, disk 64 MiB\n/);
    assert.match(show.stdout, /disk {7}enforced: ext4 image of 64 MiB on a loop device\n/);
    assert.equal((await inside("d1", "rm -f big; cat keep.txt")).out, "precious\n");
    assert.equal((await cli(["volume", "verify", "d1"])).status, 0);
    assert.match((await cli(["volume", "show", "d1"])).stdout, /disk {7}64 MiB, enforced \(ext4 image on a loop device\)\n/);

    // A budget with too little disk: refused naming disk, nothing created or charged.
    const before = await rig.ownerUse();
    await rig.api(c).call("POST", `/v1/owners/${rig.tokenId}/budget`, { vcpu: 16, memoryMib: 32768, diskMib: 100, count: 8 });
    const refused = await cli(["alloc", "create", "--size", "tiny", "--id", "d2"]);
    assert.equal(refused.status, 1);
    assert.equal(refused.stderr, "berth: budget_exhausted: disk 64/100 MiB used, tiny needs 64\n");
    assert.equal((await rig.store.transaction((tx) => tx.get("SELECT id FROM allocations WHERE id = 'd2'"))) ?? null, null);
    assert.deepEqual(await rig.ownerUse(), before);
    await rig.api(c).call("POST", `/v1/owners/${rig.tokenId}/budget`, { vcpu: 16, memoryMib: 32768, diskMib: 327680, count: 8 });

    // Agent SIGKILLed; the mount gone as after a host reboot; the restarted agent mounts the image again.
    await rig.killAgent();
    assert.equal(spawnSync("umount", [data]).status, 0);
    assert.equal(isMounted(data), false);
    await rig.startAgent(c.url);
    assert.ok(isMounted(data), "mounted again at start-up");
    assert.equal((await cli(["volume", "verify", "d1"])).status, 0);
    assert.equal((await inside("d1", "cat keep.txt")).out, "precious\n");

    // Release: unmounted, the image removed with the directory.
    assert.equal((await cli(["alloc", "release", "d1"])).status, 0);
    await rig.waitState("d1", "released");
    assert.equal(isMounted(data), false);
    assert.equal(existsSync(image), false);
    assert.equal(existsSync(join(rig.agentDir, "volumes", "d1")), false);
    assert.equal(spawnSync("losetup", ["-j", image], { encoding: "utf8" }).stdout.trim(), "", "no loop device left on the image");
  });

  test("a kept volume keeps its image and size: attached to a larger size it stays 64 MiB; to a smaller size it is refused with nothing created", async () => {
    for (const [id, size] of [["k1", "small"], ["k2", "tiny"]] as const) {
      assert.equal((await cli(["alloc", "create", "--size", size, "--id", id, "--wait"])).status, 0);
      assert.equal((await cli(["alloc", "release", id, "--keep-volume"])).status, 0);
      await rig.waitState(id, "released");
    }
    const use = await rig.ownerUse();
    const smaller = await cli(["alloc", "create", "--size", "tiny", "--id", "r1", "--volume", "k1"]);
    assert.equal(smaller.status, 1);
    assert.match(smaller.stderr, /conflict: volume k1 has a disk of 20 GiB; a tiny \(64 MiB\) cannot take it; it is not attached/);
    assert.equal((await rig.store.transaction((tx) => tx.get("SELECT id FROM allocations WHERE id = 'r1'"))) ?? null, null);
    assert.deepEqual(await rig.ownerUse(), use);
    // Larger: attached, the same image (64 MiB) mounted in the same place.
    assert.equal((await cli(["alloc", "create", "--size", "small", "--id", "w1", "--volume", "k2", "--wait"])).status, 0);
    const image = join(rig.agentDir, "volumes", "k2", "disk.img");
    assert.equal(statSync(image).size, 64 * 2 ** 20);
    assert.ok(isMounted(join(rig.agentDir, "volumes", "k2", "data")));
    assert.match((await inside("w1", "dd if=/dev/zero of=big bs=1M count=100 2>&1; echo exit=$?")).out, /No space left on device/);
    assert.equal((await cli(["volume", "verify", "w1"])).status, 0);
  });
});
}
