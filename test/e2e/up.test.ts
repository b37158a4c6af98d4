/**
 * The README's main job: `berth up -- CMD` brings berth up on its embedded
 * default, runs CMD on a borrowed machine, keeps its exit status and tears
 * everything down; `berth up` without a command keeps running, and
 * `berth run --pool default` from the same directory works against it.
 */
import { test, describe } from "node:test";
import assert from "node:assert/strict";
import { join } from "node:path";
import { berth, berthSync, startProcess, stopProcess } from "../helpers/cluster.js";
import { tempDir } from "../helpers/env.js";
import { allPids, readEnviron } from "../../src/agent/runtime/procfs.js";
import { gvisorAvailability } from "../../src/agent/runtime/index.js";
import Database from "better-sqlite3";

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
});
