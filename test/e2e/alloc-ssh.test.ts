/**
 * An allocation end to end through the binary and the system `ssh`, on the
 * process runtime and (root + runsc) gvisor: `berth alloc create --wait`,
 * `berth ssh --print` run by /usr/bin/ssh, a file written to the workspace
 * volume that survives an agent SIGKILL + restart and a sandbox restart,
 * `berth volume verify` finding a damaged volume, `volume reset`, release
 * with nothing left running and the budget back, and a kept volume; `berth cp
 * ALLOCATION` with the allocation's key, both ways.
 */
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { existsSync, readFileSync, renameSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { AllocRig } from "../helpers/alloc-rig.js";
import { berth } from "../helpers/cluster.js";
import { gvisorAvailability } from "../../src/agent/runtime/index.js";
import { allPids, readCmdline, readEnviron } from "../../src/agent/runtime/procfs.js";
import type { ServeProcess } from "../helpers/serve.js";

const gv = gvisorAvailability();

/** Host processes of the allocation's sandbox: process runtime by marker, gvisor by runsc under the agent's directory. */
function strays(rig: AllocRig, machine: string): string[] {
  const found: string[] = [];
  for (const pid of allPids()) {
    if (pid === process.pid) continue;
    const cmd = readCmdline(pid).join(" ");
    if (readEnviron(pid).includes(`BERTH_MACHINE=${machine}`)) found.push(`${pid}: ${cmd}`);
    else if (cmd.includes("runsc") && cmd.includes(join(rig.agentDir, "runsc")) && cmd.includes(machine)) found.push(`${pid}: ${cmd}`);
  }
  return found;
}

for (const runtime of ["process", "gvisor"] as const) {
  const skip = runtime === "gvisor" && !gv.ok ? `gvisor runtime unavailable: ${(gv as { why: string }).why}` : false;
  describe(`allocation through the binary and system ssh (${runtime})`, { skip, timeout: 180_000 }, () => {
    const rig = new AllocRig("sqlite", true, ["--alloc-actor-lease", "5s"], runtime);
    let c: ServeProcess;
    let env: Record<string, string>;
    before(async () => {
      await rig.start();
      c = rig.coordinators[0]!;
      env = rig.cliEnv();
    });
    after(() => rig.close());
    const cli = (args: string[]) => berth(args, { env });
    /** `berth ssh --print` run by the system ssh (BatchMode: never a prompt). */
    const sshPrint = async (id: string, command: string): Promise<{ status: number | null; out: string; err: string }> => {
      const p = await cli(["ssh", "--print", id, "--", "sh", "-c", command]);
      assert.equal(p.status, 0, p.stderr);
      return AllocRig.runSshLine(p.stdout);
    };

    test("create --wait, ssh, write, survive agent SIGKILL and a sandbox restart, verify/reset, release: nothing left, budget back", async () => {
      const created = await cli(["alloc", "create", "--size", "small", "--id", "e1", "--wait"]);
      assert.equal(created.status, 0, created.stderr);
      assert.match(created.stderr, /e1 launching on h1/);
      assert.match(created.stderr, /e1 ready \(/);
      assert.match(created.stdout, /state {6}ready/);
      assert.match(created.stdout, /ssh {8}berth ssh e1/);

      const w = await sshPrint("e1", "echo kept > note.txt; echo $BERTH_MACHINE; pwd");
      assert.equal(w.status, 0, w.err);
      assert.match(w.out, /^a-e1\n/);

      // berth cp ALLOCATION: the allocation's key (BERTH_KEY_DIR), over SFTP, both ways byte-exact with its mode.
      const local = join(rig.tmp.path, "cp-up.bin");
      const data = randomBytes(1024 * 1024 + 7);
      writeFileSync(local, data, { mode: 0o640 });
      const up = await cli(["cp", "e1", local, ":cp.bin"]);
      assert.equal(up.status, 0, up.stderr);
      const down = await cli(["cp", "e1", ":cp.bin", join(rig.tmp.path, "cp-down.bin")]);
      assert.equal(down.status, 0, down.stderr);
      assert.ok(readFileSync(join(rig.tmp.path, "cp-down.bin")).equals(data));
      assert.equal(statSync(join(rig.tmp.path, "cp-down.bin")).mode & 0o777, 0o640);
      const missing = await cli(["cp", "e1", ":no-such", join(rig.tmp.path, "x")]);
      assert.equal(missing.status, 1);
      assert.match(missing.stderr, /not_found: download no-such/);
      assert.equal((await cli(["ssh", "e1", "--", "rm", "cp.bin"])).status, 0);

      // The agent dies hard and comes back: the volume (and the key) are still there.
      await rig.killAgent();
      await rig.startAgent(c.url);
      const r1 = await cli(["ssh", "e1", "--", "cat", "note.txt"]);
      assert.equal(r1.status, 0, r1.stderr);
      assert.equal(r1.stdout, "kept\n");

      // A sandbox restart (a fence: every process killed, a new incarnation): the volume stays.
      let m = await rig.agentOp({ opId: "test-fence-e1", kind: "fence", machineId: "a-e1", generation: 1 });
      // A fence that could not prove every process gone yet is retried under the same id, as the coordinator does.
      for (let i = 0; i < 3 && m.status === 502; i++) m = await rig.agentOp({ opId: "test-fence-e1", kind: "fence", machineId: "a-e1", generation: 1 });
      assert.equal(m.status, 200, JSON.stringify(m.body));
      const r2 = await sshPrint("e1", "cat note.txt");
      assert.equal(r2.out, "kept\n", r2.err);

      // Structural verification finds a damaged volume; reset empties a sound one.
      assert.equal((await cli(["volume", "verify", "e1"])).status, 0);
      const marker = join(rig.agentDir, "volumes", "e1", "marker");
      renameSync(marker, marker + ".moved");
      const bad = await cli(["volume", "verify", "e1"]);
      assert.equal(bad.status, 1);
      assert.match(bad.stdout, /DAMAGED\n {2}- marker file is missing/);
      const refused = await cli(["volume", "reset", "e1"]);
      assert.equal(refused.status, 1);
      assert.match(refused.stderr, /failed verification/);
      renameSync(marker + ".moved", marker);
      const reset = await cli(["volume", "reset", "e1"]);
      assert.equal(reset.status, 0, reset.stderr);
      const gone = await cli(["ssh", "e1", "--", "sh", "-c", "ls -A | wc -l"]);
      assert.equal(gone.stdout.trim(), "0");

      const use = await rig.ownerUse();
      const rel = await cli(["alloc", "release", "e1"]);
      assert.equal(rel.status, 0, rel.stderr);
      await rig.waitState("e1", "released");
      assert.deepEqual(strays(rig, "a-e1"), [], "nothing of the allocation left running");
      assert.equal(existsSync(join(rig.agentDir, "volumes", "e1")), false, "volume wiped");
      const back = await rig.ownerUse();
      assert.deepEqual(back, { vcpu: use.vcpu - 2, memory: use.memory - 4096, count: use.count - 1 });
      const after = await cli(["ssh", "e1", "--", "true"]);
      assert.notEqual(after.status, 0);
      assert.match(after.stderr, /e1 is released, not ready/);
    });

    test("release --keep-volume keeps the volume, listed and verified after release", { skip: runtime === "gvisor" ? "runtime-independent (volumes.ts); shown on the process runtime" : false }, async () => {
      assert.equal((await cli(["alloc", "create", "--size", "small", "--id", "e2", "--wait"])).status, 0);
      await sshPrint("e2", "echo stays > data.txt");
      assert.equal((await cli(["alloc", "release", "e2", "--keep-volume"])).status, 0);
      await rig.waitState("e2", "released");
      const ls = await cli(["volume", "ls", "--json"]);
      const vols = (JSON.parse(ls.stdout) as { volumes: Array<{ allocationId: string; state: string; allocationState: string }> }).volumes;
      assert.deepEqual(vols.filter((v) => v.allocationId === "e2").map((v) => [v.state, v.allocationState]), [["ready", "released"]]);
      assert.equal((await cli(["volume", "verify", "e2"])).status, 0);
      assert.ok(existsSync(join(rig.agentDir, "volumes", "e2", "data", "data.txt")));
    });
  });
}
