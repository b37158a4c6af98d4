/**
 * The hosts provider end to end: real `berth serve` and `berth agent`
 * processes, real SSH (the ssh2 client and the system `ssh` binary), on the
 * process runtime and, where runsc and root are available, on gvisor.
 */
import { test, describe, after } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { Cluster, stopProcess } from "../helpers/cluster.js";
import { connect, execStreaming } from "../../src/cli/ssh-client.js";
import { gvisorAvailability } from "../../src/agent/runtime/index.js";
import { allPids, readEnviron, readCmdline } from "../../src/agent/runtime/procfs.js";
import { sink } from "../helpers/sink.js";

interface Borrow {
  borrowId: string;
  borrowToken: string;
  machine: { id: string; generation: number; ssh: { host: string; port: number; user: string; hostKey: string } };
}


async function sshRun(c: Cluster, b: Borrow, command: string): Promise<{ code: number | null; out: string; err: string }> {
  const client = await connect({ ...b.machine.ssh, privateKey: c.keeper.privateKey });
  try {
    const out = sink();
    const err = sink();
    const r = await execStreaming(client, command, { stdout: out.stream, stderr: err.stream });
    return { code: r.code, out: out.text(), err: err.text() };
  } finally {
    client.end();
  }
}

/** Host processes of this cluster's machines (process runtime: by marker), or runsc processes under its agent's state directory. */
function strayProcesses(c: Cluster, machineIds: string[]): string[] {
  const found: string[] = [];
  for (const pid of allPids()) {
    if (pid === process.pid) continue;
    const env = readEnviron(pid);
    const cmd = readCmdline(pid).join(" ");
    if (machineIds.some((id) => env.includes(`BERTH_MACHINE=${id}`))) found.push(`${pid}: ${cmd}`);
    if (cmd.includes(c.agentDir) && cmd.includes("runsc")) found.push(`${pid}: ${cmd}`);
  }
  return found;
}

/** Sleep durations unique to one test run, so concurrent runs on the host never match each other's processes. */
function uniqueSleeps(): [number, number, number] {
  const base = 100_000 + Math.floor(Math.random() * 800_000) * 3;
  return [base, base + 1, base + 2];
}

const gv = gvisorAvailability();
for (const runtime of ["process", "gvisor"] as const) {
  const skip = runtime === "gvisor" && !gv.ok ? `gvisor runtime unavailable: ${(gv as { why: string }).why}` : false;
  describe(`hosts provider on the ${runtime} runtime`, { skip, timeout: 180_000 }, () => {
    // The first two tests share one cluster: each starts from the pool's one ready machine and gives it back;
    // the second ends the cluster and checks that nothing is left.
    let shared: Cluster | null = null;
    let sharedClosed = false;
    const sharedCluster = async (): Promise<Cluster> => (shared ??= await new Cluster({ runtime, minReady: 1, maxReady: 1 }).start());
    const closeShared = async (): Promise<void> => {
      if (shared && !sharedClosed) {
        sharedClosed = true;
        await shared.close();
      }
    };
    after(closeShared);

    test("borrow, run over ssh2 and over the system ssh binary, return, fence and scrub back to ready", async () => {
      const c = await sharedCluster();
      await c.ensurePool("ci");
      await c.waitFor("a ready machine", async () => (await c.readyCount()) >= 1);
      const b = await c.api.call<Borrow>("POST", "/v1/pools/ci/borrow", {});
      const r = await sshRun(c, b, "echo hello; echo oops >&2; exit 3");
      assert.deepEqual(r, { code: 3, out: "hello\n", err: "oops\n" });

      // The system ssh client, with the gateway's host key pinned in a known_hosts line.
      const kh = join(c.dir.path, "known_hosts");
      writeFileSync(kh, `[${b.machine.ssh.host}]:${b.machine.ssh.port} ${b.machine.ssh.hostKey}\n`);
      const key = join(c.dir.path, "keeper_ed25519");
      const ssh = spawnSync(
        "ssh",
        ["-i", key, "-p", String(b.machine.ssh.port), "-o", `UserKnownHostsFile=${kh}`, "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", `${b.machine.ssh.user}@${b.machine.ssh.host}`, "echo from-openssh; exit 5"],
        { encoding: "utf8", timeout: 30_000 },
      );
      assert.equal(ssh.stdout, "from-openssh\n", ssh.stderr);
      assert.equal(ssh.status, 5);

      // A wrong host key is refused by the pinned client.
      writeFileSync(kh, `[${b.machine.ssh.host}]:${b.machine.ssh.port} ${c.keeper.publicKey}\n`);
      const bad = spawnSync("ssh", ["-i", key, "-p", String(b.machine.ssh.port), "-o", `UserKnownHostsFile=${kh}`, "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", `${b.machine.ssh.user}@${b.machine.ssh.host}`, "true"], { encoding: "utf8", timeout: 30_000 });
      assert.notEqual(bad.status, 0);
      assert.match(bad.stderr, /host key/i);

      await c.api.call("POST", `/v1/borrows/${b.borrowId}/return`, { token: b.borrowToken });
      await c.waitFor("the machine ready again", async () => (await c.machines()).find((m) => m.id === b.machine.id && m.state === "ready"));
      const m = (await c.machines()).find((x) => x.id === b.machine.id)!;
      assert.equal(m.generation, b.machine.generation, "generation advances on reservation only");
    });

    test("[I1][I5] borrower 2 never sees borrower 1's files, and background processes are gone before the machine is ready again", async () => {
      const c = await sharedCluster();
      let ids: string[] = [];
      try {
        await c.ensurePool("ci");
        await c.waitFor("a ready machine", async () => (await c.readyCount()) >= 1);
        const b1 = await c.api.call<Borrow>("POST", "/v1/pools/ci/borrow", {});
        const [s0, s1, s2] = uniqueSleeps();
        const pattern = `sleep (${s0}|${s1}|${s2})`;
        const w = await sshRun(c, b1, `echo secret > ~/borrower1.txt; (sleep ${s0} &) ; setsid sleep ${s1} < /dev/null > /dev/null 2>&1 & nohup sleep ${s2} > /dev/null 2>&1 & sleep 0.2; cat ~/borrower1.txt; pgrep -fx '${pattern}' | wc -l`);
        assert.equal(w.code, 0, w.err);
        assert.equal(w.out, "secret\n3\n");
        await c.api.call("POST", `/v1/borrows/${b1.borrowId}/return`, { token: b1.borrowToken });
        await c.waitFor("ready again", async () => (await c.readyCount()) >= 1);
        const b2 = await c.api.call<Borrow>("POST", "/v1/pools/ci/borrow", {});
        assert.equal(b2.machine.id, b1.machine.id, "a one-machine pool lends the same machine again");
        const r = await sshRun(c, b2, `ls -a ~ | grep -c borrower1 ; pgrep -fx '${pattern}' | wc -l`);
        assert.equal(r.out, "0\n0\n", r.err);
        if (runtime === "process") assert.deepEqual(strayProcesses(c, [b1.machine.id]).filter((p) => / sleep /.test(` ${p.split(": ")[1]} `)), []);
        await c.api.call("POST", `/v1/borrows/${b2.borrowId}/return`, { token: b2.borrowToken });
        ids = (await c.machines()).map((m) => m.id);
      } finally {
        await closeShared();
      }
      assert.deepEqual(strayProcesses(c, ids), []);
    });

    test("[I9] SIGKILL of the agent mid-use and of the coordinator mid-operation: operations complete once, nothing is left behind", async () => {
      const c = await new Cluster({ runtime, minReady: 1, maxReady: 1 }).start();
      let ids: string[] = [];
      try {
        await c.ensurePool("ci");
        await c.waitFor("a ready machine", async () => (await c.readyCount()) >= 1);
        const b = await c.api.call<Borrow>("POST", "/v1/pools/ci/borrow", {});
        // A session is live, with a background process, when the agent dies.
        const client = await connect({ ...b.machine.ssh, privateKey: c.keeper.privateKey });
        const [s0, s1] = uniqueSleeps();
        const live = execStreaming(client, `sleep ${s0} & sleep ${s1}`, { stdout: sink().stream, stderr: sink().stream });
        await new Promise((r) => setTimeout(r, 300));
        await stopProcess(c.agent, "SIGKILL");
        await live.catch(() => undefined);
        client.end();
        // The return's fence operation is queued while the agent is down, and retried.
        await c.api.call("POST", `/v1/borrows/${b.borrowId}/return`, { token: b.borrowToken });
        await new Promise((r) => setTimeout(r, 300));
        await c.startAgent();
        await c.waitFor("ready again after the agent restart", async () => (await c.machines()).find((m) => m.id === b.machine.id && m.state === "ready"), 60_000);

        // Now kill the coordinator while a return is being processed, and restart it.
        const b2 = await c.api.call<Borrow>("POST", "/v1/pools/ci/borrow", {});
        await c.api.call("POST", `/v1/borrows/${b2.borrowId}/return`, { token: b2.borrowToken });
        await stopProcess(c.coordinator, "SIGKILL");
        await c.startCoordinator();
        await c.waitFor("ready again after the coordinator restart", async () => (await c.machines()).find((m) => m.id === b.machine.id && m.state === "ready"), 60_000);

        // Every operation finished exactly once: each is done, and each proof step appears once per return in the audit.
        const { SqliteStore } = await import("../../src/store/sqlite/sqlite-store.js");
        const s = new SqliteStore({ path: join(c.coordDir, "berth.db") });
        try {
          const ops = await s.transaction((tx) => tx.all<{ kind: string; state: string }>("SELECT kind, state FROM operations WHERE machine_id = ? ORDER BY created_at", [b.machine.id]));
          assert.ok(ops.every((o) => o.state === "done"), JSON.stringify(ops));
          assert.deepEqual(ops.map((o) => o.kind), ["provision", "fence", "scrub", "fence", "scrub"]);
          const audit = await s.transaction((tx) => tx.all<{ event: string }>("SELECT event FROM audit WHERE machine_id = ? ORDER BY seq", [b.machine.id]));
          assert.deepEqual(audit.map((a) => a.event), ["provision", "register", "reserve", "return", "fenced", "scrubbed", "reserve", "return", "fenced", "scrubbed"]);
        } finally {
          await s.close();
        }
        ids = (await c.machines()).map((m) => m.id);
      } finally {
        await c.close();
      }
      assert.deepEqual(strayProcesses(c, ids), []);
      if (runtime === "gvisor") {
        const ls = spawnSync("runsc", ["--root", join(c.agentDir, "runsc"), "list", "-quiet"], { encoding: "utf8" });
        assert.equal(ls.stdout.trim(), "");
      }
    });
  });
}
