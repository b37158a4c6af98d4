/**
 * One `berth up` (or `berth serve`) per state directory. A second one in the
 * same directory used to share the first one's SQLite database, drain its
 * pool on exit and rewrite `.berth/client.json` to a dead URL. Proves, with
 * real processes: the second `berth up` and a `berth serve` there are refused
 * at once (exit 3, `state_dir_locked`, one line naming the holder's pid and
 * URL) and change nothing — client.json byte-identical, the first one's pool
 * still lends; and the lock cannot go stale: after the holder is killed with
 * SIGKILL its agent stops by itself and a new `berth up` starts there, takes
 * over the machines left running and destroys them when it stops. Several
 * `berth serve`s may share a directory (coordinators on one database), but a
 * `berth up` is refused there.
 */
import { test, describe } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { berth, startProcess, stopProcess } from "../helpers/cluster.js";
import { tempDir } from "../helpers/env.js";
import { allPids, readCmdline, readEnviron, readStat } from "../../src/agent/runtime/procfs.js";

function agentOf(state: string): number | null {
  for (const pid of allPids()) {
    const st = readStat(pid);
    if (!st || st.state === "Z") continue;
    const cmd = readCmdline(pid).join(" ");
    if (cmd.includes(" agent ") && cmd.includes(`--state-dir ${state}/agent`)) return pid;
  }
  return null;
}

function machineProcesses(dir: string): number[] {
  return allPids().filter((pid) => {
    const env = readEnviron(pid);
    return env.includes("BERTH_MACHINE=") && env.includes(dir);
  });
}

async function until<T>(f: () => T | null, what: string, ms = 30_000): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = f();
    if (v !== null && v !== false) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

describe("one berth up per state directory", { timeout: 300_000 }, () => {
  test("a second berth up and a berth serve are refused naming the holder, and change nothing; kill -9 of the holder leaves no stale lock", async () => {
    const d = tempDir("berth-up-lock-");
    const state = join(d.path, ".berth");
    const config = join(state, "client.json");
    const up = await startProcess(["up", "--state-dir", state, "--listen", "127.0.0.1:0", "--runtime", "process"], {}, /berth is up/);
    let again: Awaited<ReturnType<typeof startProcess>> | null = null;
    try {
      const url = (JSON.parse(readFileSync(config, "utf8")) as { url: string }).url;
      const before = readFileSync(config);

      const second = await berth(["up", "--state-dir", state, "--listen", "127.0.0.1:0", "--runtime", "process"], { cwd: d.path });
      assert.equal(second.status, 3, second.stderr);
      assert.equal(second.stdout, "");
      const lines = second.stderr.trim().split("\n");
      assert.equal(lines.length, 1, second.stderr);
      assert.match(lines[0]!, /^berth: state_dir_locked: berth up \(pid (\d+), (\S+), since [^)]+\) holds the state directory /);
      assert.equal(Number(/pid (\d+)/.exec(lines[0]!)![1]), up.child.pid);
      assert.ok(lines[0]!.includes(url), lines[0]);

      const serve = await berth(["serve", "--state-dir", state, "--listen", "127.0.0.1:0"], { cwd: d.path });
      assert.equal(serve.status, 3, serve.stderr);
      assert.match(serve.stderr, /state_dir_locked: berth up \(pid \d+/);

      // Nothing changed: the same client.json, a pool that still lends.
      assert.deepEqual(readFileSync(config), before);
      const show = await berth(["pool", "show", "default", "--json"], { cwd: d.path });
      assert.equal(show.status, 0, show.stderr);
      assert.equal((JSON.parse(show.stdout) as { minReady: number }).minReady, 2);
      const run = await berth(["run", "-q", "--", "echo", "still-here"], { cwd: d.path });
      assert.equal(run.stdout, "still-here\n", run.stderr);

      // kill -9: no teardown ran. The agent notices and stops; the lock went with the process.
      up.child.kill("SIGKILL");
      await until(() => agentOf(state) === null, "the orphaned agent to stop");
      again = await startProcess(["up", "--state-dir", state, "--listen", "127.0.0.1:0", "--runtime", "process"], {}, /berth is up/);
      const run2 = await berth(["run", "-q", "--", "echo", "taken-over"], { cwd: d.path });
      assert.equal(run2.stdout, "taken-over\n", run2.stderr);
      assert.notDeepEqual(readFileSync(config), before, "the new holder wrote its own URL");
    } finally {
      await stopProcess(up, "SIGKILL");
      if (again && again.child.exitCode === null) {
        // Within its stated bound: 30 s of drain, 10 s for the agent, then direct destruction.
        const exited = new Promise((r) => again!.child.once("exit", r));
        again.child.kill("SIGINT");
        await until(() => again!.child.exitCode !== null || again!.child.signalCode !== null, "the second berth up to stop", 60_000).catch(() => again!.child.kill("SIGKILL"));
        await exited;
      }
    }
    assert.equal(again!.child.exitCode, 0, again!.output());
    assert.equal(agentOf(state), null);
    assert.deepEqual(machineProcesses(d.path), []);
    d.cleanup();
  });

  test("berth serves may share a directory's database, a berth up may not join them", async () => {
    const d = tempDir("berth-up-lock-");
    const state = join(d.path, "coord");
    const serves = [
      await startProcess(["serve", "--state-dir", state, "--listen", "127.0.0.1:0"], {}, /listening on (http:\/\/\S+)/),
      await startProcess(["serve", "--state-dir", state, "--listen", "127.0.0.1:0"], {}, /listening on (http:\/\/\S+)/),
    ];
    try {
      const up = await berth(["up", "--state-dir", state, "--listen", "127.0.0.1:0", "--runtime", "process"], { cwd: d.path });
      assert.equal(up.status, 3, up.stderr);
      assert.match(up.stderr, /^berth: state_dir_locked: berth serve \(pid \d+, http:\/\/127\.0\.0\.1:\d+, since [^)]+\) holds the state directory .*\n$/);
    } finally {
      for (const s of serves) await stopProcess(s, "SIGTERM");
    }
    for (const s of serves) assert.equal(s.child.exitCode, 0, s.output());
    d.cleanup();
  });
});
