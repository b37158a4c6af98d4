/**
 * The README's main job: `berth up -- CMD` brings berth up on its embedded
 * default, runs CMD on a borrowed machine, keeps its exit status and tears
 * everything down; `berth up` without a command keeps running, and
 * `berth run --pool default` from the same directory works against it; its
 * admin token owns allocations with the host's real capacity as its budget,
 * and stopping releases them keeping their volumes for the next start.
 */
import { test, describe } from "node:test";
import assert from "node:assert/strict";
import { join } from "node:path";
import { availableParallelism } from "node:os";
import { readFileSync } from "node:fs";
import { berth, berthSync, startProcess, stopProcess } from "../helpers/cluster.js";
import { tempDir } from "../helpers/env.js";
import { allPids, readEnviron } from "../../src/agent/runtime/procfs.js";
import { gvisorAvailability } from "../../src/agent/runtime/index.js";
import Database from "better-sqlite3";
import { spawnSync } from "node:child_process";

/** Processes tagged with a machine marker whose workspace lies under `dir` (process runtime). */
function leftovers(dir: string): number[] {
  return allPids().filter((pid) => {
    const env = readEnviron(pid);
    return env.includes("BERTH_MACHINE=") && env.includes(dir);
  });
}

describe("berth up", { timeout: 300_000 }, () => {
  test("`berth up -- echo hello` prints hello and exits 0; `-- sh -c 'exit 7'` exits 7; nothing is left running", async () => {
    const d = tempDir("berth-up-");
    try {
      const hello = await berth(["up", "--state-dir", join(d.path, "s1"), "--listen", "127.0.0.1:0", "--runtime", "process", "--", "echo", "hello"], { cwd: d.path });
      assert.equal(hello.stdout, "hello\n", hello.stderr);
      assert.equal(hello.status, 0);
      assert.match(hello.stderr, /NO isolation/);
      const seven = await berth(["up", "--state-dir", join(d.path, "s2"), "--listen", "127.0.0.1:0", "--runtime", "process", "-q", "--", "sh", "-c", "echo out; exit 7"], { cwd: d.path });
      assert.equal(seven.stdout, "out\n");
      assert.equal(seven.stderr, "");
      assert.equal(seven.status, 7);
      assert.deepEqual(leftovers(d.path), []);
    } finally {
      d.cleanup();
    }
  });

  const gv = gvisorAvailability();
  test("on gvisor: the command runs in a sandbox, and no session record is left retained once the machines are destroyed", { skip: gv.ok ? false : `gvisor runtime unavailable: ${(gv as { why: string }).why}` }, async () => {
    const d = tempDir("berth-up-");
    try {
      const r = await berth(["up", "--state-dir", join(d.path, "s"), "--listen", "127.0.0.1:0", "--runtime", "gvisor", "-q", "--", "sh", "-c", "cat /run/berth/incarnation >/dev/null && echo sandboxed"], { cwd: d.path });
      assert.equal(r.stdout, "sandboxed\n", r.stderr);
      assert.equal(r.status, 0);
      const db = new Database(join(d.path, "s", "agent", "agent.db"), { readonly: true });
      try {
        const rows = db.prepare("SELECT state, COUNT(*) AS n FROM agent_sessions GROUP BY state").all() as { state: string; n: number }[];
        assert.deepEqual(rows, [{ state: "clean", n: 1 }]);
      } finally {
        db.close();
      }
    } finally {
      d.cleanup();
    }
  });

  test("`berth up` keeps running; `berth run` (with or without `--pool default`) from the same directory borrows from it", async () => {
    const d = tempDir("berth-up-");
    const up = await startProcess(["up", "--state-dir", join(d.path, ".berth"), "--listen", "127.0.0.1:0", "--runtime", "process"], {}, /berth is up/);
    try {
      const config = join(d.path, ".berth", "client.json");
      const r = berthSync(["run", "--pool", "default", "--config", config, "--", "sh", "-c", "echo from-run; exit 3"]);
      assert.equal(r.stdout, "from-run\n", r.stderr);
      assert.equal(r.status, 3);
      // Without --pool: the client config `berth up` wrote names its pool.
      const bare = await berth(["run", "-q", "--", "echo", "from-default"], { cwd: d.path });
      assert.equal(bare.status, 0, bare.stderr);
      assert.equal(bare.stdout, "from-default\n");
      const show = berthSync(["pool", "show", "default", "--config", config, "--json"]);
      assert.equal(show.status, 0, show.stderr);
      assert.equal(JSON.parse(show.stdout).name, "default");
    } finally {
      await stopProcess(up, "SIGINT");
    }
    assert.equal(up.child.exitCode, 0, up.output());
    assert.deepEqual(leftovers(d.path), []);
    d.cleanup();
  });

  test("`berth up` owns allocations: a small one is made on the host's real capacity and answers over SSH; stopping releases it keeping its volume; the next `berth up` runs a new one on that volume, data kept", async () => {
    const d = tempDir("berth-up-");
    const state = join(d.path, ".berth");
    const env = { BERTH_KEY_DIR: join(d.path, "keys") };
    // From the directory `berth up` runs in, as a user would: its client.json is found there.
    const cli = (args: string[]) => berth(args, { cwd: d.path, env });
    const upArgs = ["up", "--state-dir", state, "--listen", "127.0.0.1:0", "--runtime", "process"];
    const ours = () => readFileSync("/proc/self/mounts", "utf8").split("\n").filter((l) => l.includes(d.path));
    try {
      const first = await startProcess(upArgs, env, /berth is up/);
      try {
        assert.match(first.output(), /admitted the admin token as the owner of allocations/);
        assert.match(first.output(), /berth alloc create --size small --wait/);
        const owners = await cli(["owner", "ls", "--json"]);
        assert.equal(owners.status, 0, owners.stderr);
        const [owner] = JSON.parse(owners.stdout) as { budget: { vcpu: number; memoryMib: number; count: number } }[];
        // The budget is what the agent offers: every CPU, and as many allocations as the default 4 slots.
        assert.equal(owner!.budget.vcpu, availableParallelism());
        assert.equal(owner!.budget.count, 4);
        assert.ok(owner!.budget.memoryMib >= 4096, `memory budget ${owner!.budget.memoryMib} MiB holds a small`);
        const made = await cli(["alloc", "create", "--size", "small", "--id", "up-a1", "--wait"]);
        assert.equal(made.status, 0, made.stderr);
        const wrote = await cli(["ssh", "up-a1", "--", "sh", "-c", "echo kept-across-up > /workspace/f && cat /workspace/f"]);
        assert.equal(wrote.stdout, "kept-across-up\n", wrote.stderr);
      } finally {
        await stopProcess(first, "SIGINT");
      }
      assert.equal(first.child.exitCode, 0, first.output());
      assert.match(first.output(), /volume\(s\) kept: up-a1/);
      // Stopped: no sandbox left, and no disk image still mounted under the state directory.
      assert.deepEqual(leftovers(d.path), []);
      assert.deepEqual(ours(), []);

      const second = await startProcess(upArgs, env, /berth is up/);
      try {
        assert.doesNotMatch(second.output(), /admitted the admin token/, "an owner already admitted keeps its budget");
        const again = await cli(["alloc", "create", "--size", "small", "--id", "up-a2", "--volume", "up-a1", "--wait"]);
        assert.equal(again.status, 0, again.stderr);
        const read = await cli(["ssh", "up-a2", "--", "cat", "/workspace/f"]);
        assert.equal(read.stdout, "kept-across-up\n", read.stderr);
      } finally {
        await stopProcess(second, "SIGINT");
      }
      assert.equal(second.child.exitCode, 0, second.output());
      assert.deepEqual(leftovers(d.path), []);
      assert.deepEqual(ours(), []);
    } finally {
      for (const m of ours().map((l) => l.split(" ")[1]!).sort().reverse()) spawnSync("umount", [m]);
      d.cleanup();
    }
  });
});

