/**
 * `berth up` in a real terminal (tmux, driven with send-keys), as its banner
 * tells a person to use it: Ctrl-C stops it. The terminal's SIGINT goes to its
 * whole foreground process group, so anything berth starts there would be
 * signalled behind berth's back (the agent dying first, the drain hanging,
 * sandboxes left running). Proves, on the process runtime and on gvisor:
 *   - nothing berth up starts shares the terminal's foreground process group;
 *   - Ctrl-C while up, with a machine lent, returns to the prompt with status 0
 *     after the machines were destroyed by the ordinary drain, and nothing is
 *     left: no agent, no machine process, no runsc sandbox or gofer;
 *   - Ctrl-C while starting stops there (status 130), nothing left;
 *   - a second Ctrl-C while stopping forces (the agent stopped, its machines
 *     destroyed directly), nothing left.
 */
import { test, describe } from "node:test";
import assert from "node:assert/strict";
import { join } from "node:path";
import { BIN } from "../helpers/cluster.js";
import { tempDir } from "../helpers/env.js";
import { Tmux, noTmux } from "../helpers/tmux.js";
import { allPids, readCmdline, readEnviron, readStat } from "../../src/agent/runtime/procfs.js";
import { gvisorAvailability } from "../../src/agent/runtime/index.js";

/** Live processes that belong to the berth up of state directory `state`: its agent, its machines' processes, its runsc sandboxes and gofers. */
function leftovers(state: string): { pid: number; what: string }[] {
  const out: { pid: number; what: string }[] = [];
  for (const pid of allPids()) {
    if (pid === process.pid) continue;
    const st = readStat(pid);
    if (!st || st.state === "Z") continue;
    const cmd = readCmdline(pid).join(" ");
    if (cmd.includes(" agent ") && cmd.includes(`--state-dir ${state}/agent`)) out.push({ pid, what: `agent: ${cmd.slice(0, 120)}` });
    else if (cmd.includes(`--root=${state}/agent/runsc`)) out.push({ pid, what: `runsc: ${cmd.slice(0, 120)}` });
    else if (readEnviron(pid).includes("BERTH_MACHINE=") && readEnviron(pid).includes(state)) out.push({ pid, what: `machine process: ${cmd.slice(0, 120)}` });
  }
  return out;
}

/** The pid of `berth up --state-dir state` itself. */
function upPid(state: string): number | null {
  for (const pid of allPids()) {
    const cmd = readCmdline(pid);
    if (cmd.includes("up") && cmd.includes(state) && !cmd.includes("agent")) return pid;
  }
  return null;
}

/** The pid of the agent berth up started for `state`, as soon as it exists. */
async function agentPid(state: string): Promise<number> {
  const deadline = Date.now() + 60_000;
  for (;;) {
    const a = leftovers(state).find((l) => l.what.startsWith("agent"));
    if (a) return a.pid;
    if (Date.now() > deadline) throw new Error("the agent did not start");
    await new Promise((r) => setTimeout(r, 5));
  }
}

/** Kills (by pid) whatever a failed run left, so one failure does not leak into the next test. */
function sweep(state: string): void {
  for (const { pid } of leftovers(state)) {
    try {
      process.kill(pid, "SIGKILL");
    } catch {
      // gone already
    }
  }
}

const gv = gvisorAvailability();
const runtimes = [
  { runtime: "process", skip: noTmux ?? false },
  { runtime: "gvisor", skip: noTmux ?? (gv.ok ? false : `gvisor runtime unavailable: ${(gv as { why: string }).why}`) },
] as const;

describe("berth up in a terminal: Ctrl-C", { timeout: 400_000 }, () => {
  for (const { runtime, skip } of runtimes) {
    test(`${runtime}: Ctrl-C while up with a machine lent stops everything in order; nothing shares the terminal's process group; nothing is left`, { skip }, async () => {
      const d = tempDir("berth-up-tty-");
      const state = join(d.path, "s");
      const t = new Tmux(d.path);
      try {
        t.start(d.path, { BERTH_LOG_LEVEL: "warn" });
        t.type(`${process.execPath} ${BIN} up --state-dir ${state} --listen 127.0.0.1:0 --runtime ${runtime}; echo "rc=$?"`);
        await t.waitFor(/Ctrl-C stops berth/, "the banner", 0, 120_000);
        // A machine lent while berth up is stopped: its borrow must end with it.
        const b = await import("node:child_process").then(({ spawnSync }) =>
          spawnSync(process.execPath, [BIN, "borrow", "default", "--receipt", join(d.path, "r.json"), "--config", join(state, "client.json")], { encoding: "utf8", timeout: 60_000 }),
        );
        assert.equal(b.status, 0, b.stderr);
        const pid = upPid(state);
        assert.ok(pid, "berth up is running");
        const fg = readStat(pid)!.tpgid;
        assert.equal(readStat(pid)!.pgid, fg, "berth up is the terminal's foreground job");
        const children = leftovers(state);
        assert.ok(children.some((c) => c.what.startsWith("agent")), JSON.stringify(children));
        for (const c of children) assert.notEqual(readStat(c.pid)?.pgid, fg, `${c.what} is in the terminal's foreground process group`);

        const from = t.screen().length;
        t.keys("C-c");
        const m = await t.waitFor(/rc=(\d+)/, "berth up to end", from, 120_000);
        const after = t.screen().slice(from);
        assert.equal(m[1], "0", after);
        assert.match(after, /draining pool default/);
        assert.doesNotMatch(after, /not destroyed within|gave up|left running|Error/, after);
        assert.deepEqual(leftovers(state), []);
      } finally {
        t.kill();
        sweep(state);
        d.cleanup();
      }
    });

    test(`${runtime}: Ctrl-C while starting stops there with status 130; with a hung agent, a second Ctrl-C while stopping forces; nothing is left`, { skip }, async () => {
      const d = tempDir("berth-up-tty-");
      const t = new Tmux(d.path);
      const s1 = join(d.path, "s1");
      const s2 = join(d.path, "s2");
      try {
        t.start(d.path, { BERTH_LOG_LEVEL: "warn" });
        // The agent is frozen as soon as it exists, so berth up is still starting when Ctrl-C comes.
        t.type(`${process.execPath} ${BIN} up --state-dir ${s1} --listen 127.0.0.1:0 --runtime ${runtime}; echo "rc=$?"`);
        let agent = await agentPid(s1);
        process.kill(agent, "SIGSTOP");
        let from = t.screen().length;
        t.keys("C-c");
        await t.waitFor(/SIGINT while starting/, "the start to be interrupted", from);
        process.kill(agent, "SIGCONT");
        let m = await t.waitFor(/rc=(\d+)/, "berth up to end", from, 120_000);
        assert.equal(m[1], "130", t.screen().slice(from));
        assert.deepEqual(leftovers(s1), []);

        from = t.screen().length;
        // The hung agent ignores SIGTERM: the wait before SIGKILL only has to pass, so it is 1 s here instead of 10 s.
        t.type(`BERTH_TEST_HOOKS=1 BERTH_TEST_AGENT_STOP_MS=1000 ${process.execPath} ${BIN} up --state-dir ${s2} --listen 127.0.0.1:0 --runtime ${runtime} --min-ready 3; echo "rc=$?"`);
        await t.waitFor(/Ctrl-C stops berth/, "the banner", from, 120_000);
        // A hung agent: the ordinary drain cannot finish, so the second Ctrl-C has something to force.
        agent = await agentPid(s2);
        process.kill(agent, "SIGSTOP");
        from = t.screen().length;
        t.keys("C-c");
        await t.waitFor(/Ctrl-C again to force/, "stopping to begin", from, 60_000);
        t.keys("C-c");
        m = await t.waitFor(/rc=(\d+)/, "berth up to end", from, 120_000);
        const after = t.screen().slice(from);
        assert.equal(m[1], "0", after);
        assert.match(after, /forcing/);
        assert.match(after, /the agent did not stop within 1 s; killing it/);
        assert.match(after, /destroying \d+ machine\(s\) the agent left running/);
        assert.deepEqual(leftovers(s2), []);
      } finally {
        t.kill();
        sweep(s1);
        sweep(s2);
        d.cleanup();
      }
    });
  }
});
