/**
 * A pool with `--files workspace`: the real OpenSSH `sftp` and `scp` reach the
 * machine's workspace and nothing else, on both runtimes (gvisor where runsc
 * and root are present). Absolute paths, `..` and symbolic links that point
 * outside find nothing there, writes outside fail, and a link swapped between
 * a directory inside and one outside while the client reads through it never
 * yields a file from outside (the server runs chrooted into the workspace, so
 * the kernel resolves every path inside it: there is no check to race).
 * `scp -O` and `rsync` (their server side a command) run in the same jail:
 * the same paths out find nothing, writes out fail, inside both work.
 */
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, symlinkSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { AgentHarness } from "../helpers/agent.js";
import { run } from "../helpers/ssh-testkit.js";
import { gatewaySshOpts, runClient } from "../helpers/openssh.js";
import { gvisorAvailability } from "../../src/agent/runtime/index.js";
import { sftpArgv } from "../../src/agent/ssh/channels.js";

const harness = new AgentHarness("berth-confine-");
after(() => harness.close());

const sshOpts = gatewaySshOpts;
const tool = (cmd: string, args: string[], input = "") => runClient(cmd, args, input, 30_000);

test("a machine that cannot start the server confined refuses the session (never serves the whole machine), and says why", () => {
  const [sh, ...args] = sftpArgv("workspace");
  const r = spawnSync(sh!, args, { encoding: "utf8", env: { PATH: "/nonexistent" }, cwd: "/" });
  assert.equal(r.status, 126);
  assert.match(r.stderr, /^berth: files_confinement_unavailable: this pool confines files to the workspace/);
});

const hostName = readFileSync("/etc/hostname", "utf8");

for (const kind of ["process", "gvisor"] as const) {
  const gv = gvisorAvailability();
  const skip = kind === "gvisor" && !gv.ok ? `gvisor runtime unavailable: ${(gv as { why: string }).why}` : null;

  test(`${kind}: --files workspace confines sftp, scp (both protocols) and rsync to the workspace: absolute paths, .., symlinks out and a racing symlink swap reach nothing outside`, async (t) => {
    if (skip) return t.skip(skip);
    const rig = await harness.gateway(kind, `m_conf_${kind}`, { create: { files: "workspace" } });
    const dir = harness.dir();
    const o = sshOpts(rig, dir);
    const target = `${rig.machine}@127.0.0.1`;
    const ws = join(rig.dir, "rt", "machines", rig.machine, "workspace");
    const inside = kind === "gvisor" ? "/workspace" : ws;
    writeFileSync(join(ws, "a"), "inside\n");
    mkdirSync(join(ws, "d"));
    writeFileSync(join(ws, "d", "hostname"), "inside\n");
    symlinkSync("/etc/hostname", join(ws, "esc"));
    symlinkSync("../../../../../../../../etc", join(ws, "up"));
    symlinkSync("d", join(ws, "race"));
    writeFileSync(join(dir, "local"), "from the client\n");
    const flipper = spawn("/bin/sh", ["-c", "while :; do ln -sfn /etc race; ln -sfn d race; done"], { cwd: ws, stdio: "ignore" });
    try {
      assert.equal(await rig.runtime.filesScope(rig.machine), "workspace");
      const gets = ["/etc/hostname", "esc", "up/hostname", "../../../../../../../../etc/hostname"];
      const batch = [
        ...gets.map((p, i) => `-get ${p} ${join(dir, `out${i}`)}`),
        `-put ${join(dir, "local")} /outside`,
        `-put ${join(dir, "local")} ../outside`,
        `put ${join(dir, "local")} z`,
        `get a ${join(dir, "a")}`,
        ...Array.from({ length: 60 }, (_, i) => `-get race/hostname ${join(dir, `race${i}`)}`),
        "pwd",
      ].join("\n");
      const r = await tool("sftp", [...o, "-P", String(rig.gw.port), "-b", "-", target], batch + "\n");
      assert.equal(r.status, 0, `${r.stdout.slice(-800)}\n${r.stderr.slice(-800)}`);
      for (let i = 0; i < gets.length; i++) assert.equal(existsSync(join(dir, `out${i}`)), false, `${gets[i]} must not be reachable: ${r.stderr}`);
      assert.match(r.stderr, /File "\/etc\/hostname" not found/);
      assert.match(r.stderr, /dest open "\/outside": Failure/);
      assert.match(r.stderr, /dest open "[^"]*\.\.\/outside": Failure/);
      assert.equal(readFileSync(join(ws, "z"), "utf8"), "from the client\n", "a write inside the workspace lands");
      assert.equal(readFileSync(join(dir, "a"), "utf8"), "inside\n", "a read inside the workspace works");
      assert.match(r.stdout, new RegExp(`Remote working directory: ${inside}\\n`));
      let raced = 0;
      for (let i = 0; i < 60; i++) {
        const p = join(dir, `race${i}`);
        if (!existsSync(p)) continue;
        raced++;
        assert.equal(readFileSync(p, "utf8"), "inside\n", "a read through the swapped link never yields the outside file");
      }
      assert.ok(!existsSync(join(ws, "..", "outside")));
      // Nothing was written outside, seen from a command in the machine (the machine's whole view).
      const c = await rig.client();
      const seen = (await run(c, "ls /outside ../outside 2>&1; cat /etc/hostname")).stdout.toString();
      assert.equal(seen.split("\n").filter((l) => /No such file/.test(l)).length, 2);
      assert.ok(seen.endsWith(hostName), "commands still see the machine's own view");
      // scp (SFTP protocol) the same way.
      const s = await tool("scp", [...o, "-P", String(rig.gw.port), `${target}:/etc/hostname`, join(dir, "scp-out")]);
      assert.notEqual(s.status, 0);
      assert.match(s.stderr, /No such file/);
      assert.equal(existsSync(join(dir, "scp-out")), false);

      // scp -O and rsync send their server side as a command (scp -t/-f, rsync --server): the same jail.
      const port = String(rig.gw.port);
      const rsh = ["ssh", ...o, "-p", port].join(" ");
      const legacy = (...args: string[]) => tool("scp", [...o, "-O", "-P", port, ...args]);
      const rsync = (...args: string[]) => tool("rsync", ["-e", rsh, ...args]);
      for (const [i, p] of ["/etc/hostname", "esc", "up/hostname", "../../../../../../../../etc/hostname"].entries()) {
        const out = join(dir, `legacy${i}`);
        const a = await legacy(`${target}:${p}`, out);
        assert.notEqual(a.status, 0, `scp -O ${p}`);
        assert.equal(existsSync(out), false, `scp -O must not reach ${p}: ${a.stderr}`);
        const b = await rsync("-L", `${target}:${p}`, `${out}.r`);
        assert.notEqual(b.status, 0, `rsync ${p}`);
        assert.equal(existsSync(`${out}.r`), false, `rsync must not reach ${p}: ${b.stderr}`);
      }
      for (const p of ["/outside2", "../outside2"]) {
        assert.notEqual((await legacy(join(dir, "local"), `${target}:${p}`)).status, 0, `scp -O put ${p}`);
        assert.notEqual((await rsync(join(dir, "local"), `${target}:${p}`)).status, 0, `rsync put ${p}`);
      }
      let w = await legacy(join(dir, "local"), `${target}:zO`);
      assert.equal(w.status, 0, w.stderr);
      w = await rsync(join(dir, "local"), `${target}:zr`);
      assert.equal(w.status, 0, w.stderr);
      assert.equal(readFileSync(join(ws, "zO"), "utf8") + readFileSync(join(ws, "zr"), "utf8"), "from the client\n".repeat(2), "writes inside land");
      w = await legacy(`${target}:a`, join(dir, "aO"));
      assert.equal(w.status, 0, w.stderr);
      w = await rsync("-r", `${target}:d/`, join(dir, "dr"));
      assert.equal(w.status, 0, w.stderr);
      assert.equal(readFileSync(join(dir, "aO"), "utf8") + readFileSync(join(dir, "dr", "hostname"), "utf8"), "inside\n".repeat(2), "reads inside work");
      const seen2 = (await run(c, "ls /outside2 ../outside2 2>&1")).stdout.toString();
      assert.equal(seen2.split("\n").filter((l) => /No such file/.test(l)).length, 2, seen2);
      t.diagnostic(`race reads answered from inside: ${raced}/60`);
    } finally {
      flipper.kill("SIGKILL");
      await rig.close();
    }
  });
}
