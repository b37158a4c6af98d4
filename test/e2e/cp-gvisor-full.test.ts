/**
 * `berth cp` into a gvisor machine whose disk is full: the agent's machines
 * directory (which holds each machine's workspace, bound into its sandbox at
 * start) is a 24 MiB tmpfs mounted before the agent starts, so the sandbox's
 * /workspace has that file system's space. A 32 MiB upload is `disk_full`
 * (exit 1) with the free space read through the sandbox, nothing partial is
 * left in the workspace, and afterwards a small file copies and a command
 * reads it. Real `berth serve` + `berth agent --runtime gvisor`, keeper borrow.
 */
import { test, describe, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdirSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { Cluster, berth } from "../helpers/cluster.js";
import { gvisorAvailability } from "../../src/agent/runtime/index.js";

const gv = gvisorAvailability();

describe("berth cp into a full gvisor machine", { skip: gv.ok ? false : `gvisor runtime unavailable: ${(gv as { why: string }).why}`, timeout: 240_000 }, () => {
  const c = new Cluster({ runtime: "gvisor", minReady: 1, maxReady: 1, slots: 2 });
  const machines = join(c.agentDir, "machines");
  let mounted = false;
  before(async () => {
    mkdirSync(machines, { recursive: true, mode: 0o700 });
    execFileSync("mount", ["-t", "tmpfs", "-o", "size=24m,mode=0700", "berth-test-full", machines]);
    mounted = true;
    await c.start();
    await c.ensurePool("ci");
    await c.waitFor("a ready machine", async () => (await c.readyCount("ci")) >= 1, 120_000);
  });
  after(async () => {
    try {
      await c.close();
    } catch {
      // the temp directory's removal meets the mount point; removed below
    } finally {
      if (mounted) execFileSync("umount", ["-l", machines]);
      rmSync(c.dir.path, { recursive: true, force: true });
    }
  });

  test("a file larger than the free space is disk_full, nothing partial is left, and the machine stays usable", async () => {
    const dir = join(c.dir.path, "full");
    mkdirSync(dir);
    const receipt = join(dir, "b.json");
    const cfg = ["--config", c.clientConfig];
    let r = await berth(["borrow", "ci", "--receipt", receipt, ...cfg]);
    assert.equal(r.status, 0, r.stderr);
    const cp = (...args: string[]) => berth(["cp", "--receipt", receipt, ...cfg, ...args], { cwd: dir });
    const sh = (cmd: string) => berth(["ssh", "--receipt", receipt, ...cfg, "--", "sh", "-c", cmd]);

    writeFileSync(join(dir, "big.bin"), randomBytes(32 * 1024 * 1024));
    r = await cp("big.bin", ":");
    assert.equal(r.status, 1, r.stderr);
    assert.match(r.stderr, /disk_full: upload to big\.bin: no space left on the machine's disk \([\d.]+ MB free where it goes, the file is 33\.6 MB\); nothing was written under its name/);
    r = await sh("pwd; ls -A");
    assert.equal(r.status, 0, r.stderr);
    assert.equal(r.stdout.trim(), "/workspace", "nothing partial left in the workspace");

    writeFileSync(join(dir, "small.txt"), "still usable\n");
    r = await cp("small.txt", ":");
    assert.equal(r.status, 0, r.stderr);
    r = await sh("cat small.txt");
    assert.equal(r.status, 0, r.stderr);
    assert.equal(r.stdout.trim(), "still usable");
    r = await berth(["return", "--receipt", receipt, ...cfg]);
    assert.equal(r.status, 0, r.stderr);
  });
});
